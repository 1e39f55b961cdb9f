"""Where a run's memory goes: resident memory (``VmRSS``) sampled every 10 ms while a run goes
through its stages, reported as the peak per stage and the growth timeline.

    python scripts/profile_memory.py [OVERRIDES ...] [--every-mb 40] [--users-every K]   # e.g. rounds=3

Stages: imports, compose, prepare (data, model, calibration), then within the rounds the client
updates (``fedpriv.round.clients.client_update``), the server's round (``DPFedAvg.apply_round``: clip,
sum, noise, optimizer), the checkpoint, the published files and evaluation; what runs outside
those (the round function's own work) is "rounds (other)". ``--users-every K`` also prints RSS after
every K client updates against the number of distinct users read so far: memory that grows with the
users read (an unbounded cache) shows there. Linux only (reads /proc/self/status).
The run goes to a temporary directory; nothing is kept.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class Sampler:
    """Peak RSS per stage and a timeline of the moves larger than ``every_mb``."""

    def __init__(self, every_mb: float) -> None:
        self.stage, self.peaks, self.timeline = "imports", {}, []
        self.every_mb, self.start = every_mb, time.perf_counter()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        last_stage, last_rss = "", 0.0
        while True:
            rss, stage = rss_mb(), self.stage
            self.peaks[stage] = max(self.peaks.get(stage, 0.0), rss)
            if stage != last_stage or abs(rss - last_rss) > self.every_mb:
                self.timeline.append((time.perf_counter() - self.start, stage, rss))
                last_stage, last_rss = stage, rss
            time.sleep(0.01)

    def tag(self, owner, name: str, label: str) -> None:
        """Run ``owner.name`` under stage ``label``."""
        inner = getattr(owner, name)

        @functools.wraps(inner)
        def tagged(*args, **kwargs):
            before, self.stage = self.stage, label
            try:
                return inner(*args, **kwargs)
            finally:
                self.stage = before

        setattr(owner, name, tagged)

    def count_users(self, owner, name: str, every: int) -> None:
        """After every ``every`` calls of ``owner.name(task, params, user, ...)``: (calls, distinct
        users so far, RSS MB) into ``self.users``."""
        inner, seen, calls, self.users = getattr(owner, name), set(), [0], []

        @functools.wraps(inner)
        def counted(task, params, user, *args, **kwargs):
            out = inner(task, params, user, *args, **kwargs)
            seen.add(user)
            calls[0] += 1
            if calls[0] % every == 0:
                self.users.append((calls[0], len(seen), rss_mb()))
            return out

        setattr(owner, name, counted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--every-mb", type=float, default=40.0, help="timeline: moves larger than this")
    parser.add_argument("--users-every", type=int, help="RSS after every K client updates, with the users read")
    args = parser.parse_args()
    sampler = Sampler(args.every_mb)
    import fedpriv.round.clients as clients
    import fedpriv.runner as runner
    from fedpriv.config.compose import compose_config
    from fedpriv.round.dpfedavg import DPFedAvg
    from server.app import run_local

    logging.getLogger("absl").setLevel(logging.ERROR)
    for owner, name, label in ((clients, "client_update", "client updates"), (DPFedAvg, "apply_round", "server round"),
                               (runner, "_checkpoint", "checkpoint"), (runner, "_publish", "publish"),
                               (runner, "evaluate_params", "evaluate")):
        sampler.tag(owner, name, label)
    if args.users_every:
        sampler.count_users(clients, "client_update", args.users_every)
    with tempfile.TemporaryDirectory() as tmp:
        sampler.stage = "compose"
        cfg = compose_config([*args.overrides, "progress=false"], Path(tmp) / "run")
        sampler.stage = "prepare"
        session = runner.prepare(cfg)
        sampler.stage = "rounds (other)"
        run_local(session)
        sampler.stage = "end"
        time.sleep(0.05)
    for t, stage, rss in sampler.timeline:
        print(f"{t:8.2f} s  {stage:16s} {rss:7.0f} MB")
    print("peak RSS by stage:")
    for stage, peak in sampler.peaks.items():
        print(f"  {stage:16s} {peak:7.0f} MB")
    print(f"peak {max(sampler.peaks.values()):.0f} MB")
    if args.users_every:
        print("client updates, distinct users read, RSS MB:")
        for calls, users, rss in sampler.users:
            print(f"  {calls:8d} {users:8d} {rss:7.0f}")


if __name__ == "__main__":
    main()
