"""Book-Keeping's layer inspection reports every problem at once (issue 54, item 2), as Opacus's
``ModuleValidator.validate`` returns the list of all errors: ``fedpriv.clipping.validate(model)`` lists
them without raising, and the engine's refusal at construction names them all in one message (the
first problem's wording first), one ``error:`` line on the command line.

Run as a module (``python -m tests.test_clipping_validate ARGS``) it is ``python -m fedpriv.simulate
ARGS`` with the smoke run's LSTM given two unsupported layers (the command-line test below)."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import fedpriv.clipping as clipping
from fedpriv.clipping import BookKeeping, UnsupportedLayerError
from fedpriv.models import LSTMLanguageModel, TransformerLanguageModel

ROOT = Path(__file__).resolve().parents[1]
BATCH_NORM = "norm (BatchNorm1d): batch statistics mix samples"
GRU = "rnn (GRU) owns trainable parameter(s) weight_ih_l0, weight_hh_l0, bias_ih_l0, bias_hh_l0 that BookKeeping"
BARE = "<model> (ThreeProblems) owns trainable parameter(s) scale that BookKeeping cannot clip per sample"


class ThreeProblems(nn.Module):
    """A supported Linear between three unsupported things: a bare parameter on the model itself, a
    BatchNorm and a GRU (in ``named_modules`` order: the model, ``a``, ``norm``, ``rnn``, ``head``)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4))
        self.a = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.rnn = nn.GRU(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(self.norm(self.a(x) * self.scale))[0])


def test_every_unsupported_layer_is_listed_in_module_order() -> None:
    problems = clipping.validate(ThreeProblems())
    assert len(problems) == 3, problems
    assert problems[0].startswith(BARE) and problems[1].startswith(BATCH_NORM) and problems[2].startswith(GRU)


def test_the_refusal_at_construction_names_every_problem_the_first_first() -> None:
    model = ThreeProblems()
    with pytest.raises(UnsupportedLayerError) as err:
        BookKeeping(model)
    text = str(err.value)
    assert text.startswith(BARE) and BATCH_NORM in text and GRU in text
    assert text == "; ".join(clipping.validate(model)) and "\n" not in text


def test_a_frozen_unsupported_layer_is_no_problem_and_a_supported_model_gives_none() -> None:
    model = ThreeProblems()
    for module in (model, model.norm, model.rnn):
        for p in module.parameters(recurse=module is not model):
            p.requires_grad_(False)
    model.scale.requires_grad_(False)
    assert clipping.validate(model) == [BATCH_NORM + ", so per-sample gradients are not defined; use nn.LayerNorm"]
    model.norm = nn.LayerNorm(4)
    assert clipping.validate(model) == []
    assert clipping.validate(LSTMLanguageModel(30, embed_dim=8, hidden_size=8, projection_dim=8)) == []
    transformer = TransformerLanguageModel(30, d_model=16, num_layers=1, num_heads=2, ff_dim=16, max_len=8)
    assert clipping.validate(transformer) == []


def test_validating_changes_nothing() -> None:
    """No hook, no prepared module (the LSTM keeps its batched forward): validate only reads the model."""
    from fedpriv.models.lstm import LSTM

    model = LSTMLanguageModel(30, embed_dim=8, hidden_size=8, projection_dim=8)
    lstm = next(m for m in model.modules() if isinstance(m, LSTM))
    before = lstm.per_sample
    assert clipping.validate(model) == []
    assert lstm.per_sample == before is False
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_the_command_line_refusal_names_both_layers_in_one_line_exit_2(tmp_path) -> None:
    from tests.warm_launcher import run_module

    run_dir = tmp_path / "r"
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0", "PYTHONPATH": str(ROOT)}
    done = run_module("tests.test_clipping_validate", "+experiment=smoke", "progress=false", "client.dp=example",
                      f"run_dir={run_dir}", cwd=ROOT, env=env, timeout=300)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: client.dp=example clips per sample"), done.stderr
    assert "which refuses this model: norm (BatchNorm1d): batch statistics mix samples" in lines[0]
    assert "; rnn (GRU) owns trainable parameter(s)" in lines[0]
    assert not run_dir.exists()


def _two_unsupported_layers() -> None:
    """Patch this process: the LSTM language model gains a BatchNorm1d and a GRU (its forward uses neither)."""
    init = LSTMLanguageModel.__init__

    def patched(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        self.norm = nn.BatchNorm1d(4)
        self.rnn = nn.GRU(4, 4)

    LSTMLanguageModel.__init__ = patched


if __name__ == "__main__":  # the command-line test's process
    _two_unsupported_layers()
    sys.argv = ["fedpriv.simulate", *sys.argv[1:]]
    runpy.run_module("fedpriv.simulate", run_name="__main__", alter_sys=True)
