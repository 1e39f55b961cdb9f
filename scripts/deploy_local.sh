#!/usr/bin/env bash
# A real Flower deployment on loopback: one SuperLink, N SuperNodes, `flwr run` of fedpriv's
# ServerApp/ClientApp (pyproject.toml [tool.flwr.app]) with the same Hydra experiment as
# `python -m fedpriv.simulate`. Offline: no telemetry, no update check, no runtime dependency
# installation. Every process started here is stopped on exit (its process group, by PID),
# on success, failure or interrupt.
#
#   scripts/deploy_local.sh --clients N --rounds R --out DIR [--tls] [--secagg] [--experiment NAME]
#                           [--round-timeout S] [--timeout S] [--node-state DIR] [-- HYDRA_OVERRIDES...]
#
# DIR gets summary.json, metrics.jsonl, privacy.json, config.yaml, checkpoints/ (written by the
# ServerApp), logs/ (superlink.log, supernode-K.log, flwr-run.log, pids) and, unless --node-state
# names another place, node-state/supernode-K (each SuperNode's own memory of the rounds it
# answered in secure mode: its node config's state-dir). Exit 0 iff the run wrote DIR/summary.json
# with R rounds; 2 on bad arguments; 1 otherwise. No deadline by default, neither per round nor for
# the whole run: how long a run takes depends on its data (docs/PRIVACY.md "Late nodes").
#
# Flower 1.42 facts this relies on: the SuperLink serves its Fleet, Control and Runtime APIs over
# HTTP on one --host/--port (health: GET /health); each SuperNode needs its own --port; `flwr run`
# takes a connection from $FLWR_HOME/config.toml (never [tool.flwr.federations] in pyproject.toml,
# which `flwr run` would rewrite); `flwr run --stream` exits 0 even when the run failed; the FAB
# holds only *.py/*.toml/*.md/*.yaml/*.json files, so the app is staged in a small directory.
# Each process gets its own FLWR_HOME so no two of them unpack the app into the same place.
set -euo pipefail
set -m  # every background job gets its own process group (pgid = its PID)

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${FEDPRIV_VENV_BIN:-$ROOT/.venv/bin}
export PATH="$BIN:$PATH" FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost

usage() { echo "error: $1 (usage: scripts/deploy_local.sh --clients N --rounds R --out DIR [--tls] [--secagg] [--experiment NAME] [--round-timeout S] [--timeout S] [--node-state DIR] [-- OVERRIDES...])" >&2; exit 2; }
help() {
    cat <<'USAGE'
usage: scripts/deploy_local.sh --clients N --rounds R --out DIR [--tls] [--secagg] [--experiment NAME]
                               [--round-timeout S] [--timeout S] [--node-state DIR] [-- OVERRIDES...]
A real Flower deployment on loopback (one SuperLink, N SuperNodes, `flwr run`), offline.
  --clients N          SuperNodes to start, one partition of the users each
  --rounds R           rounds to run (the run's `rounds`)
  --out DIR            run directory: summary.json, metrics.jsonl, privacy.json, config.yaml,
                       checkpoints/, logs/ (must not hold a finished run)
  --tls                a throwaway CA and TLS between all processes (default: insecure)
  --secagg             the nodes' sums through Flower's SecAgg+ (aggregation=secagg; needs --clients >= 2)
  --experiment NAME    a configs/experiment name (default: smoke; empty: none)
  --round-timeout S    seconds the server waits for a round's replies; a later node's users are dropped
                       (default: no deadline, since a node's time depends on its users' data: docs/PRIVACY.md)
  --timeout S          seconds the whole `flwr run` may take, an operator's safety net (default: none; one
                       that fires stops the run after a number of rounds that depends on the data)
  --node-state DIR     where SuperNode K remembers the rounds it answered in secure mode: DIR/supernode-K
                       (default: OUT/node-state, which a resume into OUT finds; a round answered is refused
                       when asked again, in any run of the same config that uses DIR)
  -- OVERRIDES...      Hydra overrides, as for python -m fedpriv.simulate (e.g. privacy.target_epsilon=4)
Exit 0 iff DIR/summary.json holds R rounds; 2 on bad arguments; 1 otherwise.
USAGE
    exit 0
}
is_int() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }

CLIENTS="" ROUNDS="" OUT="" TLS=0 SECAGG=0 EXPERIMENT="smoke" ROUND_TIMEOUT="" TIMEOUT="" NODE_STATE="" OVERRIDES=()
while (($#)); do
    case "$1" in
        --clients) CLIENTS=${2-}; shift 2 || usage "--clients needs a value" ;;
        --rounds) ROUNDS=${2-}; shift 2 || usage "--rounds needs a value" ;;
        --out) OUT=${2-}; shift 2 || usage "--out needs a value" ;;
        --experiment) EXPERIMENT=${2-}; shift 2 || usage "--experiment needs a value" ;;
        --round-timeout) ROUND_TIMEOUT=${2-}; shift 2 || usage "--round-timeout needs a value"; [[ -n "$ROUND_TIMEOUT" ]] \
            || usage "--round-timeout must be a positive integer (seconds), got ''" ;;
        --timeout) TIMEOUT=${2-}; shift 2 || usage "--timeout needs a value"; [[ -n "$TIMEOUT" ]] \
            || usage "--timeout must be a positive integer (seconds), got ''" ;;
        --node-state) NODE_STATE=${2-}; shift 2 || usage "--node-state needs a value"; [[ -n "$NODE_STATE" ]] \
            || usage "--node-state needs a directory, got ''" ;;
        --tls) TLS=1; shift ;;
        --secagg) SECAGG=1; shift ;;
        -h|--help) help ;;
        --) shift; OVERRIDES+=("$@"); break ;;
        *) usage "unknown argument '$1'" ;;
    esac
done
is_int "$CLIENTS" || usage "--clients must be a positive integer, got '${CLIENTS}'"
is_int "$ROUNDS" || usage "--rounds must be a positive integer, got '${ROUNDS}'"
[[ -z "$ROUND_TIMEOUT" ]] || is_int "$ROUND_TIMEOUT" \
    || usage "--round-timeout must be a positive integer (seconds), got '${ROUND_TIMEOUT}'"
[[ -z "$TIMEOUT" ]] || is_int "$TIMEOUT" || usage "--timeout must be a positive integer (seconds), got '${TIMEOUT}'"
# a TOML literal string in the node config (Flower parses --node-config as TOML): no quote inside
[[ "$NODE_STATE" != *"'"* ]] || usage "--node-state must not contain a single quote, got '${NODE_STATE}'"
if ((SECAGG)); then
    ((CLIENTS >= 2)) || usage "--secagg needs at least 2 clients (SecAgg+ sums between nodes), got --clients $CLIENTS"
    OVERRIDES=("aggregation=secagg" ${OVERRIDES[@]+"${OVERRIDES[@]}"})
fi
[[ -n "$OUT" ]] || usage "--out is required"
[[ -z "$EXPERIMENT" || -f "$ROOT/configs/experiment/$EXPERIMENT.yaml" ]] || usage "unknown experiment '$EXPERIMENT'"
[[ -x "$BIN/flower-superlink" ]] || usage "$BIN/flower-superlink not found: run 'make venv' first"
if [[ -e "$OUT/summary.json" ]]; then usage "$OUT already holds a finished run"; fi
for o in "${OVERRIDES[@]}"; do  # a key given twice is refused (as by python -m fedpriv.simulate)
    key="${o%%=*}"; key="${key#++}"; key="${key#[+~]}"  # ++key=, +key=, ~key: the same key
    case "$key" in
        rounds) usage "'$o' repeats a key --rounds sets: give --rounds only" ;;
        backend.num_supernodes) usage "'$o' repeats a key --clients sets: give --clients only" ;;
        backend.round_timeout) usage "'$o' repeats a key --round-timeout sets: give --round-timeout only" ;;
    esac
done

mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
NODE_STATE=${NODE_STATE:-$OUT/node-state}
mkdir -p -m 700 "$NODE_STATE" || { echo "error: cannot create the node state directory $NODE_STATE" >&2; exit 1; }
NODE_STATE=$(cd "$NODE_STATE" && pwd)
WORK=$(mktemp -d)
PIDS=()

cleanup() {
    local rc=$? pid
    for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    for _ in $(seq 50); do
        local alive=0
        for pid in "${PIDS[@]}"; do kill -0 -- "-$pid" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.2
    done
    for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { "$BIN/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

SEC_LINK=(--insecure) SEC_NODE=(--insecure) SEC_CLI='insecure = true' SCHEME=http CURL_CA=()
if ((TLS)); then  # a throwaway CA and a server certificate for 127.0.0.1 / localhost
    C=$WORK/certs; mkdir -p "$C"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$C/ca.key" -out "$C/ca.crt" -days 1 -subj "/O=fedpriv-test-ca" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout "$C/server.key" -out "$C/server.csr" -subj "/CN=localhost" 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$C/ext.cnf"
    openssl x509 -req -in "$C/server.csr" -CA "$C/ca.crt" -CAkey "$C/ca.key" -CAcreateserial -out "$C/server.pem" \
        -days 1 -sha256 -extfile "$C/ext.cnf" 2>/dev/null
    SEC_LINK=(--ssl-ca-certfile "$C/ca.crt" --ssl-certfile "$C/server.pem" --ssl-keyfile "$C/server.key")
    SEC_NODE=(--root-certificates "$C/ca.crt")
    SEC_CLI="root-certificates = \"$C/ca.crt\""
    SCHEME=https CURL_CA=(--cacert "$C/ca.crt")
fi

LINK_PORT=$(free_port)
FLWR_HOME=$WORK/superlink flower-superlink "${SEC_LINK[@]}" --host 127.0.0.1 --port "$LINK_PORT" \
    --disable-runtime-dependency-installation >"$OUT/logs/superlink.log" 2>&1 &
PIDS+=($!); echo "superlink $!" >"$OUT/logs/pids"; disown
for _ in $(seq 120); do
    curl -sf "${CURL_CA[@]}" "$SCHEME://127.0.0.1:$LINK_PORT/health" >/dev/null 2>&1 && break
    kill -0 "${PIDS[0]}" 2>/dev/null || { echo "error: the SuperLink exited (see $OUT/logs/superlink.log)" >&2; exit 1; }
    sleep 0.5
done

for ((k = 0; k < CLIENTS; k++)); do
    FLWR_HOME=$WORK/supernode-$k flower-supernode "${SEC_NODE[@]}" --superlink "127.0.0.1:$LINK_PORT" \
        --host 127.0.0.1 --port "$(free_port)" \
        --node-config "partition-id=$k num-partitions=$CLIENTS state-dir='$NODE_STATE/supernode-$k'" \
        >"$OUT/logs/supernode-$k.log" 2>&1 &
    PIDS+=($!); echo "supernode-$k $!" >>"$OUT/logs/pids"; disown
done

# The app as a small directory (flwr run packages everything under it that is not ignored).
APP=$WORK/app; mkdir -p "$APP"
(cd "$ROOT" && cp -r pyproject.toml README.md fedpriv server client configs "$APP/")
find "$APP" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p "$WORK/cli"
printf '[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:%s"\n%s\n' "$LINK_PORT" "$SEC_CLI" \
    >"$WORK/cli/config.toml"

quote() { local s=${1//\\/\\\\}; printf '"%s"' "${s//\"/\\\"}"; }
ALL_OVERRIDES="rounds=$ROUNDS backend.num_supernodes=$CLIENTS${ROUND_TIMEOUT:+ backend.round_timeout=$ROUND_TIMEOUT} ${OVERRIDES[*]-}"
RUN_CONFIG="experiment=$(quote "$EXPERIMENT") overrides=$(quote "$ALL_OVERRIDES") run-dir=$(quote "$OUT")"
echo "flwr run $APP local --run-config '$RUN_CONFIG' --stream" >"$OUT/logs/flwr-run.log"
RUN=(flwr run "$APP" local --run-config "$RUN_CONFIG" --stream)
[[ -z "$TIMEOUT" ]] || RUN=(timeout "$TIMEOUT" "${RUN[@]}")  # opt-in: a stop whose round depends on the data
FLWR_HOME=$WORK/cli "${RUN[@]}" >>"$OUT/logs/flwr-run.log" 2>&1 &
PIDS+=($!); echo "flwr-run $!" >>"$OUT/logs/pids"
RUN_PID=$! RUN_RC=0
wait "$RUN_PID" || RUN_RC=$?  # `flwr run --stream` exits 0 even when the run failed: judge by the outputs

if "$BIN/python" - "$ROOT" "$OUT/summary.json" "$ROUNDS" <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from fedpriv.errors import ConfigError
from fedpriv.release.rundir import read_mapping
try:
    summary = read_mapping(Path(sys.argv[2]), json.loads)
except ConfigError:  # missing, unreadable or damaged
    sys.exit(1)
sys.exit(0 if summary.get("rounds") == int(sys.argv[3]) else 1)
PY
then
    grep -E "^(final|user-level|example-level)" "$OUT/logs/flwr-run.log" || true
    echo "outputs in $OUT"
else
    if [[ -n "$TIMEOUT" && "$RUN_RC" == 124 ]]; then
        echo "error: --timeout $TIMEOUT ended the deployed run before its $ROUNDS rounds (logs in $OUT/logs)" >&2
    else
        echo "error: the deployed run did not finish $ROUNDS rounds (logs in $OUT/logs)" >&2
    fi
    tail -n 20 "$OUT/logs/flwr-run.log" >&2 || true
    exit 1
fi
