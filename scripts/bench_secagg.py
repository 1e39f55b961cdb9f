"""What Flower's SecAgg+ costs a round, against the clear message round, on the default model.

    python scripts/bench_secagg.py [--nodes 4] [--cohort 40] [--repeats 4] [--json PATH]

One process, the default experiment's LSTM (494,588 parameters), the same cohort each time, over an
in-process Flower grid (server/grid.py: no sockets, so transport time is not in it): the clear
round (``grid_round_fn``: each node replies with its users' deltas) and the secure one
(``aggregation=secagg``: four message exchanges, masks generated and removed), alternated per
repeat, medians after the first repeat. Also the bytes a node uploads in each (its reply's arrays,
or its masked vectors).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import date
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import logging  # noqa: E402

from client.app import make_client_app  # noqa: E402
from fedpriv.config.compose import compose_config  # noqa: E402
from fedpriv.runner import prepare  # noqa: E402
from server.app import round_fn_for  # noqa: E402
from server.grid import LocalGrid  # noqa: E402


class MeasuringGrid(LocalGrid):
    """A LocalGrid that adds up the bytes of the replies' arrays and SecAgg+ masked vectors."""

    uploaded = 0

    def pull_messages(self, message_ids):
        replies = super().pull_messages(message_ids)
        for reply in replies:
            if reply.has_error():
                continue
            content = reply.content
            self.uploaded += sum(len(a.data) for record in content.array_records.values() for a in record.values())
            cfg = content.config_records.get("secaggplus_configs")
            if cfg is not None and "masked_params" in cfg:
                self.uploaded += sum(len(b) for b in cfg["masked_params"])
        return replies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--cohort", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    runs = {}
    for mode in ("plain", "secagg"):
        out = Path(f"/tmp/fedpriv-bench-secagg-{mode}-{os.getpid()}")
        cfg = compose_config(["progress=false", "backend=flower", f"aggregation={mode}", f"cohort_size={args.cohort}",
                              f"backend.num_supernodes={args.nodes}"], str(out))
        session = prepare(cfg)
        grid = MeasuringGrid(make_client_app(cfg), args.nodes)
        runs[mode] = (session, grid, round_fn_for(session, grid, args.nodes, None))
    cohort = runs["plain"][0].server.cohort(0)
    times: dict[str, list[float]] = {"plain": [], "secagg": []}
    uploaded: dict[str, int] = {}
    for repeat in range(args.repeats):
        for mode in (("plain", "secagg") if repeat % 2 == 0 else ("secagg", "plain")):
            session, grid, round_fn = runs[mode]
            grid.uploaded = 0
            start = time.perf_counter()
            round_fn(session.server.round_inputs(repeat, cohort))
            if repeat:
                times[mode].append(time.perf_counter() - start)
            uploaded[mode] = grid.uploaded
    for session, _, _ in runs.values():
        session.run.unlock()
    medians = {k: statistics.median(v) for k, v in times.items()}
    result = {"date": date.today().isoformat(), "nodes": args.nodes, "cohort": len(cohort),
              "parameters": runs["plain"][0].task.initial_params.numel(), "seconds_median": medians,
              "secagg_over_plain": medians["secagg"] / medians["plain"],
              "uploaded_bytes_per_round": uploaded}
    print(json.dumps(result, indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
