"""Flower ClientApp: a thin adapter that unpacks the round's message, runs fedpriv's local
update for each user the message names, and packs the deltas and metrics (wire protocol in
``server/strategy.py``).

Users are virtual clients: any node can compute any sampled user's update (the node is the
compute that simulates the devices). In research mode an update depends only on (research key,
round, user), so the result does not depend on which node ran it; in secure mode each update's
randomness is fresh OS entropy on the node (:class:`fedpriv.keys.randomness.ClientRandomness`). A
reply carries statistics of the user's data beside the delta only when diagnostics are on
(research mode, user-level DP: :func:`fedpriv.config.resolve.client_diagnostics_enabled`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from client import secagg
from fedpriv.release.atomic import create_bytes_atomic
from fedpriv.cache import cache_root
from fedpriv.schema import as_dict

from fedpriv.clipping import UnsupportedLayerError
from fedpriv.round.codec import decode, refusal_content, train_reply_content
from fedpriv.config.resolve import client_diagnostics_enabled, run_config
from fedpriv.keys.randomness import ClientRandomness
from fedpriv.keys.research_key import canonical_config, client_randomness
from fedpriv.schema import RunConfig
from fedpriv.round.clients import client_updates
from fedpriv.task import Task, load_task
from fedpriv.allocator import retain_freed_memory

log = logging.getLogger(__name__)


def train_reply(spec: RunConfig, task: Task, msg: Message, users: list[int], rng: ClientRandomness) -> Message:
    """The reply to one ``train`` message under the experiment's resolved typed config ``spec``:
    the deltas of ``users`` (the message's, validated by :func:`answer_once`)."""
    params = decode(msg.content["arrays"]["params"])
    diagnostics = client_diagnostics_enabled(spec)
    updates = client_updates(task, params, users, int(msg.content["config"]["round"]), rng, diagnostics)
    return Message(content=train_reply_content(updates), reply_to=msg)


ANSWERED = "fedpriv.answered"  # the node's memory in Flower's Context.state: run id -> the rounds it answered
STATE_DIR = "state-dir"  # the node setting (Flower node config) naming the node's own state directory
_DIGEST_TAG = b"fedpriv node memory v1\x00"


def node_state_dir(node_config: Mapping[str, Any]) -> Path:
    """A deployed node's own state directory: its node config's ``state-dir``
    (``flower-supernode --node-config 'state-dir="DIR"'``), else ``node-state`` under fedpriv's cache
    (:func:`fedpriv.cache.cache_root`: ``$FEDPRIV_CACHE``, else ``~/.cache/fedpriv``). Several
    SuperNodes of one machine user need one each (sharing one, they would refuse each other's rounds).
    A relative ``state-dir`` is refused (``RuntimeError``): a ClientApp process need not run where
    the SuperNode was started."""
    value = node_config.get(STATE_DIR)
    if value is None or value == "":
        return cache_root() / "node-state"
    path = Path(str(value)).expanduser()
    if not path.is_absolute():
        raise RuntimeError(f"the node setting {STATE_DIR} must be an absolute path, got {str(value)!r}")
    return path


def config_digest(spec: RunConfig) -> str:
    """SHA-256 (hex, under a tag of its own) of the run's public config in its canonical form
    (:func:`fedpriv.keys.research_key.canonical_config`: exactly the values that change what the run
    computes; its run directory, ``resume`` and other presentation left out, so a resumed run has
    the digest of the run it resumes)."""
    text = json.dumps(canonical_config(as_dict(spec)), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(_DIGEST_TAG + text.encode()).hexdigest()


@dataclass(frozen=True)
class NodeMemory:
    """The rounds a deployed node answered, on its own disk, beyond one Flower run and one SuperNode
    process: one file ``answered/<config digest>/round-<t>`` per (run config, round), created
    before the reply is computed. Creating it is the claim: it is written in full and ``fsync``ed,
    then published with a hard link that never replaces an existing file
    (:func:`fedpriv.release.atomic.create_bytes_atomic`), so of two requests for one round, also concurrent ones
    from two processes, exactly one is answered, and a round is remembered across a power cut."""

    directory: Path
    digest: str  # :func:`config_digest` of the run's config

    def claim(self, round_idx: int) -> None:
        """Record round ``round_idx`` (0-based) as answered, or refuse (``RuntimeError``): it was
        answered before, or it cannot be recorded (nothing is then computed either)."""
        folder = self.directory / "answered" / self.digest
        path = folder / f"round-{round_idx + 1}"
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            create_bytes_atomic(path, f"{round_idx + 1}\n".encode(), mode=0o600)
        except FileExistsError:
            raise RuntimeError(f"the server asked for round {round_idx + 1} again; this node answered it for this "
                               "run config already (a second answer would release its users again, with fresh "
                               "noise)") from None
        except OSError as err:  # fail closed: a round this node cannot remember is not answered
            log.error("cannot record round %d in %s: %s", round_idx + 1, folder, err)  # the node's own log
            raise RuntimeError(f"this node cannot record round {round_idx + 1} in its state directory (see its "
                               "log); it answers no round it cannot remember") from None


def requested_users(values: Iterable[Any], population: int, round_idx: int) -> list[int]:
    """The user ids of a request, each checked before it is used: an integer (a decimal string in
    SecAgg+'s comma list) with 0 ≤ id < ``population`` (the units of the node's data: an id outside
    would index another user, e.g. ``-1`` the last), and each at most once (a repeated user would be
    released more than once in one round). ``RuntimeError`` otherwise; the message names the id the
    server sent, never the population."""
    users: list[int] = []
    for value in values:
        if isinstance(value, str) and re.fullmatch(r"[0-9]{1,18}", value):
            user = int(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            user = value
        else:
            raise RuntimeError(f"round {round_idx + 1}: the server asked for {str(value)[:40]!r}, not a user id")
        if not 0 <= user < population:
            raise RuntimeError(f"round {round_idx + 1}: the server asked for user {user}, not a user of this node's "
                               "data (ids 0 to the population less one)")
        users.append(user)
    if len(set(users)) != len(users):
        raise RuntimeError(f"round {round_idx + 1}: the server asked for a user more than once; this node "
                           "computes each user at most once a round")
    return users


def answer_once(spec: RunConfig, context: Context, round_idx: int, values: Iterable[Any], population: int,
                memory: NodeMemory | None = None) -> list[int]:
    """What a node checks itself before it computes a round, whatever the server asks
    (``RuntimeError``, which Flower sends back as an error reply, otherwise); returns the users to
    compute:

    * each user a user of its data, at most once (:func:`requested_users`): under
      ``client.dp=example`` a user asked twice (or as ``-1`` beside the last user) would get two
      noisy releases in one round; in a ``ddgauss`` party's message, its update counted twice
      against one noise share;
    * a round of this run (0 ≤ round < ``rounds``), answered at most once: every answer carries fresh
      noise (example-level DP, a party's share), so a round asked again would let the server average
      it away. Within a SecAgg+ round this is its one fit (the masked-vector stage), not the
      protocol's other stages. The rounds answered are kept in ``context.state`` (per Flower run; it
      lives with the node between the messages of a run, also where each message starts a new
      process) and, with a ``memory`` (a deployed node in secure mode), on the node's disk under
      the run config's digest, which a new Flower run or a restarted SuperNode does not reset; both
      are recorded before the reply is computed."""
    users = requested_users(values, population, round_idx)
    if not 0 <= round_idx < spec.rounds:
        raise RuntimeError(f"the server asked for round {round_idx + 1}; this run has {spec.rounds} rounds")
    record = context.state.config_records.get(ANSWERED)
    run = str(context.run_id)
    answered = [int(r) for r in record.get(run, [])] if record is not None else []
    if round_idx in answered:
        raise RuntimeError(f"the server asked for round {round_idx + 1} again; this node answers each round "
                           "once (a second answer would release its users again, with fresh noise)")
    if memory is not None:
        memory.claim(round_idx)
    context.state.config_records[ANSWERED] = ConfigRecord({**(dict(record) if record else {}),
                                                           run: [*answered, round_idx]})
    return users


def reply(spec: RunConfig, msg: Message, rng: ClientRandomness, context: Context,
          memory: NodeMemory | None = None) -> Message:
    """The reply to a ``train`` message under ``spec`` — the node's one dispatch on the sum protocol
    (:mod:`fedpriv.sums`): a clear round's per-user deltas, or under ``aggregation=secagg`` the
    node's clipped sum (or party message) for SecAgg+, checked against the node's own plan
    (client/secagg.py; a clear round is then an error: the node never sends its users' updates in
    the clear). Either way the node answers each round once and each of its users once
    (:func:`answer_once`, ``memory``: where it remembers the rounds beyond the Flower run), before
    anything of the request is computed."""
    if spec.aggregation.name == "plain":
        task = load_task(spec)
        conf = msg.content["config"]
        users = answer_once(spec, context, int(conf["round"]), conf["users"], len(task.units), memory)
        return train_reply(spec, task, msg, users, rng)
    if not secagg.is_secagg_message(msg):
        raise RuntimeError("this run aggregates securely (aggregation=secagg), but the server asked for a clear round")
    task = load_task(spec)
    request = secagg.checked_request(spec, msg, context)
    users = answer_once(spec, context, request.round_idx, request.users, len(task.units), memory)
    return secagg.masked_reply(task, msg, request, users, rng)


def make_client_app(cfg: dict) -> ClientApp:
    """A ClientApp for the experiment ``cfg`` (plain dict of the Hydra config, parsed once here);
    under ``aggregation=secagg`` its rounds run behind Flower's ``secaggplus_mod``
    (:func:`client.secagg.secure_aggregation_mod`)."""
    spec = run_config(cfg)
    rng = client_randomness(spec)
    retain_freed_memory()  # clients reallocate the same large tensors every step (fedpriv.allocator)
    app = ClientApp(mods=[secagg.secure_aggregation_mod])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        try:  # the users to simulate come with the message; the context holds SecAgg+'s state
            return reply(spec, msg, rng, context)
        except UnsupportedLayerError as err:  # the engine refused the model (e.g. its forward mixes samples)
            log.error("the per-sample clipping engine refused the model: %s", err)  # the node's own log
            if secagg.is_secagg_message(msg):  # SecAgg+ carries no refusal: the node fails (its round halts)
                raise
            return Message(content=refusal_content(type(err).__name__, _layer(str(err))), reply_to=msg)

    return app


def _layer(message: str) -> str:
    """The ``path (Type)`` a refusal's message starts with, or empty: the rest of the message (shapes,
    the batch's sample indices) stays in the node's log."""
    head = message.split(":", 1)[0]
    return head if re.fullmatch(r"[\w.<>' -]+ \([\w.]+\)", head) else ""
