"""A run's outputs: the one module that decides which files a run writes and in which order.

The training loop hands the sink what a moment of the run produced; the sink writes it
(:class:`~fedpriv.release.rundir.RunDirectory` does each write atomically and durably). The order, which
is what a crash may leave behind:

1. **Start**: ``config.yaml`` (the resolved config); a resumed run then republishes whatever its
   last checkpoint holds that a crash kept from the files.
2. **Each round**: under client example-level DP, ``checkpoints/client_releases.json`` before the
   clients are asked (a crash cannot hide their release); after the round, its checkpoint
   ``checkpoints/last.pt``, durable, and only then its published outputs — ``metrics.jsonl``,
   ``diagnostics.jsonl`` (research diagnostics only), ``privacy.json`` (the ledger) — then the log
   line and ``tensorboard/``; a secure run's file times are then set to a fixed value. The next
   round's model goes to clients after that, so a resumed run never redoes a published round with
   the same noise.
   (A fresh run writes ``metrics.jsonl`` and ``privacy.json``, with no round, at its start.)
3. **End**: the audit's ``audit_scores.json`` and ``audit.png``, the released model (a model
   option's :meth:`~fedpriv.schema.ModelOption.write_release`), and ``summary.json`` last: its
   presence means the run finished.

:func:`planned_outputs` names the files a configuration writes (the run plan lists them).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

from fedpriv.accounting.ledger import PRIVACY_FILE, PrivacyLedger
from fedpriv.release.atomic import write_atomic
from fedpriv.audit.report import PLOT_FILE, SCORES_FILE
from fedpriv.config.resolve import diagnostics_enabled
from fedpriv.release.result_lines import format_result
from fedpriv.release.observe import TENSORBOARD_DIR, RoundObserver
from fedpriv.release.rundir import (CHECKPOINT_FILE, CLIENT_RELEASES_FILE, CONFIG_FILE, DIAGNOSTICS_FILE, METRICS_FILE,
                            SUMMARY_FILE, RunDirectory, write_json)
from fedpriv.schema import RunConfig


def planned_outputs(spec: RunConfig, client_dp: bool) -> tuple[str, ...]:
    """The files (and directories) a run of ``spec`` writes under its run directory, in the order
    of their first write (module docstring); ``client_dp``: its clients release under
    example-level DP."""
    names = [CONFIG_FILE, METRICS_FILE]
    if diagnostics_enabled(spec):
        names.append(DIAGNOSTICS_FILE)
    names.append(PRIVACY_FILE)
    if spec.tensorboard:
        names.append(TENSORBOARD_DIR)
    if client_dp:
        names.append(CLIENT_RELEASES_FILE)
    names.append(CHECKPOINT_FILE)
    if spec.audit.canaries:
        names += [SCORES_FILE, PLOT_FILE]
    release = spec.model.release_name()
    if release is not None:
        names.append(release)
    return (*names, SUMMARY_FILE)


def write_privacy(path: str | os.PathLike[str], ledger: PrivacyLedger) -> Path:
    """Write the ledger's claim (:meth:`PrivacyLedger.to_dict`) as strict JSON, atomically, to the
    file ``path`` or to ``privacy.json`` in the directory ``path``; a NaN anywhere in it is
    refused (``ValueError``): "nan" is never published as a guarantee. Returns the file."""
    target = Path(path)
    if target.is_dir():
        target = target / PRIVACY_FILE
    claim = ledger.to_dict()
    if any(isinstance(v, float) and math.isnan(v) for v in claim.values()):
        raise ValueError("the ledger holds a NaN: refusing to publish privacy.json")
    write_json(target, claim)
    return target


class RunOutputs:
    """The writer of one run directory (``run``, locked) for the run of ``spec``; ``secure``: its
    files' times are settled after every write (:meth:`RunDirectory.settle_times`); ``texts``:
    TensorBoard's text entries (the randomness mode, an audit's label)."""

    def __init__(self, run: RunDirectory, spec: RunConfig, secure: bool, texts: dict[str, str]) -> None:
        self.run = run
        self.spec = spec
        self.secure = secure
        self.texts = texts
        self.diagnostics = diagnostics_enabled(spec)
        self._observe: RoundObserver | None = None

    def start(self, cfg: dict, history: list[dict], diagnostics: list[dict], ledger: PrivacyLedger) -> None:
        """Before the first round of this process: ``config.yaml`` (the plain ``cfg``), then what a
        resumed run's checkpoint holds (``history``: its metrics rows), and the round observers."""
        self.run.write_config(cfg)
        self._publish(history, diagnostics, ledger)
        self._observe = RoundObserver(self.spec, self.run.path, self.texts, history)

    def clients_asked(self, releases: int) -> None:
        """Durably, before a round's clients are asked: ``releases`` rounds of their example-level
        DP replies may have reached the server."""
        self.run.save_client_releases(releases)

    def round_done(self, checkpoint: dict, history: list[dict], diagnostics: list[dict],
                   ledger: PrivacyLedger) -> None:
        """A finished round: its ``checkpoint`` durable first, then its outputs (``history[-1]`` is
        its metrics row), then the observers, then (secure) the times."""
        self.run.save_checkpoint(checkpoint)
        self._publish(history, diagnostics, ledger)
        assert self._observe is not None, "start() comes first"
        self._observe(history[-1])
        self.settle()

    def close_rounds(self) -> None:
        """After the last round: the observers' files are complete."""
        if self._observe is not None:
            self._observe.close()

    def finish(self, summary: dict, audit: Callable[[], tuple[dict, dict[str, bytes]]] | None,
               model, params, data) -> dict:
        """The end of the run: the audit's files (``audit()`` returns the summary's ``audit`` block
        and the files' contents), the released model (the model option's
        :meth:`~fedpriv.schema.ModelOption.write_release` of ``model`` at the final ``params``, with
        the dataset ``data``'s tokenizer, labelled with the run's claim and mode) and
        ``summary.json`` last. Returns the summary as written."""
        if audit is not None:
            summary["audit"], files = audit()
            for name, content in files.items():
                write_atomic(self.run.path / name, content)
        name = self.spec.model.write_release(model, params, self.run.path, data, card=format_result(summary))
        if name is not None:
            summary["release"] = name
        self.run.write_json(SUMMARY_FILE, summary)
        return summary

    def settle(self) -> None:
        """A secure run's files get one fixed time: their times would tell how long rounds took."""
        if self.secure:
            self.run.settle_times()

    def _publish(self, history: list[dict], diagnostics: list[dict], ledger: PrivacyLedger) -> None:
        """The outputs of every round so far (after that round's checkpoint is durable)."""
        self.run.write_metrics(history)
        if self.diagnostics:
            self.run.write_diagnostics(diagnostics)
        write_privacy(self.run.path, ledger)

