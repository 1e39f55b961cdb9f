#!/usr/bin/env bash
# The GPU check (docs/BENCHMARKS.md, "On a GPU"): fedpriv's CUDA paths against the CPU, then the
# paper-scale StackOverflow round timed on the GPU. Made for one call of the device tool (one H200,
# nothing reachable from it), in at most 8 minutes:
#
#   here:   bash scripts/gpu_wheels.sh                      # the wheels the GPU image lacks -> .whl/
#   device: run(command="bash scripts/gpu_check.sh --out $OUT", carry=[".whl"], timeout_s=540)
#   here:   copy the returned gpu_*.json into docs/bench/ and the figures into docs/BENCHMARKS.md
#
#   bash scripts/gpu_check.sh --cpu-dry-run [--out DIR]    # the same steps with the CPU standing in
#
# Steps: (1) install .whl/*.whl and fedpriv itself (--no-index --no-deps: nothing from the network)
# into a scratch site directory, unless the Python in use already imports fedpriv; (2) the `cuda`
# tests (tests/test_cuda.py: every algorithm and mechanism on the device equals the CPU run,
# Book-Keeping on the device equals the CPU, cohort-parallel equals the loop on the device);
# (3) scripts/bench_scale.py on the device: the StackOverflow round (4.05M-parameter LSTM, 100
# clients, one local epoch each) by the per-client loop and by cohort-parallel chunks of 10 and of
# 100 clients. Writes OUT/gpu_tests.log, OUT/gpu_scale_p10.json, OUT/gpu_scale_p100.json and
# OUT/gpu_env.json. The dry run uses a small setting (the default experiment, one timed round).
set -euo pipefail
cd "$(dirname "$0")/.."
device=cuda
out=docs/bench
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu-dry-run) device=cpu ;;
        --out) out=$2; shift ;;
        *) echo "error: unknown argument $1 (usage: scripts/gpu_check.sh [--cpu-dry-run] [--out DIR])" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$out"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 PYTHONUNBUFFERED=1
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
start=$SECONDS

# (1) the environment
if ! "$PY" -c "import fedpriv.simulate, server.app" 2>/dev/null; then
    site=${TMPDIR:-/tmp}/fedpriv-site
    [ -d .whl ] || { echo "error: $PY cannot import fedpriv and there is no .whl/ (run scripts/gpu_wheels.sh here and carry .whl)" >&2; exit 2; }
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target "$site" .
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    "$PY" -c "import fedpriv.simulate, server.app, client.app" || { echo "error: fedpriv does not import with the carried wheels (above)" >&2; exit 2; }
fi
"$PY" - "$out/gpu_env.json" "$device" <<'PYEOF'
import json, platform, sys, torch
out, device = sys.argv[1], sys.argv[2]
env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
       "device": device, "cuda_available": torch.cuda.is_available(),
       "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"}
if device == "cuda" and not env["cuda_available"]:
    sys.exit("error: torch sees no CUDA device here (use --cpu-dry-run without a GPU)")
print(json.dumps(env))
open(out, "w").write(json.dumps(env, indent=1) + "\n")
PYEOF
echo "gpu_check: environment ready after $((SECONDS - start)) s"

# (2) the CUDA tests, on the device (the CPU in a dry run)
status=0  # a failed step is reported at the end; the others still run (one device call measures all)
FEDPRIV_TEST_DEVICE=$device "$PY" -m pytest -q -p no:cacheprovider -m cuda tests/test_cuda.py 2>&1 \
    | tee "$out/gpu_tests.log" || status=1
echo "gpu_check: tests done after $((SECONDS - start)) s"

# (3) the round on the device
# chunks of 100 in every client.precision (fp32 checked against the loop at 2e-4; tf32 and bf16
# measured against it and reported), chunks of 10 in fp32
if [ "$device" = cuda ]; then
    "$PY" scripts/bench_scale.py --setting stackoverflow --devices cuda --rounds 3 --warmup 1 \
        --parallel 100 --threads 8 --precisions fp32,tf32,bf16 --json "$out/gpu_scale_p100.json" || status=1
    "$PY" scripts/bench_scale.py --setting stackoverflow --devices cuda --rounds 3 --warmup 1 \
        --parallel 10 --threads 8 --precisions fp32 --json "$out/gpu_scale_p10.json" || status=1
else
    "$PY" scripts/bench_scale.py --setting default --devices cpu --rounds 1 --warmup 1 --parallel 10 \
        --threads 1 --precisions fp32,bf16 --json "$out/gpu_scale_dry_run.json" || status=1
fi
echo "gpu_check: done after $((SECONDS - start)) s (status $status)"
exit $status
