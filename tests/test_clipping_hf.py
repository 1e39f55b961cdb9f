"""BK engine on tiny random-init Hugging Face models (fedpriv.clipping.hf_rules), against a
per-sample autograd loop (one sample at a time), in every mode. Nothing is downloaded."""

from __future__ import annotations

import copy
from typing import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytest.importorskip("transformers")

from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,  # noqa: E402
                          MambaConfig, MambaForCausalLM)

from fedpriv.clipping import RULES, BookKeeping, UnsupportedLayerError  # noqa: E402

from tests.test_clipping import MODES, PAD, class_loss, lm_loss, one_thread  # noqa: E402, F401 (the fixture)
from tests.helpers import assert_script_runs  # noqa: E402

VOCAB = 97
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")


# ----------------------------------------------------------------------------- helpers


def hf_lm_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return lm_loss(lambda x: model(x).logits, tokens)


def gpt2_lm_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """GPT-2 with per-sample position ids passed by the caller ([B, T], see
    test_gpt2_with_positions_made_inside_the_model for why)."""
    def forward(x: torch.Tensor) -> torch.Tensor:
        return model(x, position_ids=torch.arange(x.shape[1]).repeat(x.shape[0], 1)).logits
    return lm_loss(forward, tokens)


def loop_per_sample_grads(model: nn.Module, loss_fn: Callable, data: tuple) -> dict[str, torch.Tensor]:
    """Reference: autograd on each sample alone (batch of 1), trainable parameters only, [B, ...]."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    rows: dict[str, list[torch.Tensor]] = {n: [] for n, _ in named}
    for i in range(data[0].shape[0]):
        loss = loss_fn(model, *(d[i:i + 1] for d in data))[0]
        grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
        for (n, p), g in zip(named, grads):
            rows[n].append(torch.zeros_like(p) if g is None else g)
    return {n: torch.stack(v) for n, v in rows.items()}


def reference(per: dict[str, torch.Tensor], clip: float):
    norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in per.values()))
    scales = clip / norms.clamp_min(clip)
    return norms, {n: torch.tensordot(scales, g, dims=1) for n, g in per.items()}


def assert_rel_close(got: torch.Tensor, want: torch.Tensor, rel: float = 1e-4, what: str = "") -> None:
    err = (got - want).norm().item()
    assert err <= rel * want.norm().item() + 1e-7, f"{what}: |Δ|={err:.3e}, |want|={want.norm():.3e}"


def check_against_loop(model: nn.Module, loss_fn: Callable, data: tuple, mode: str) -> BookKeeping:
    """BK's per-sample norms and clipped sum equal the loop's, with a clip norm that clips some
    samples and not others."""
    per = loop_per_sample_grads(model, loss_fn, data)
    full, _ = reference(per, 1.0)
    ordered = full.sort().values
    half = len(ordered) // 2
    clip = (ordered[half - 1] + ordered[half]).item() / 2  # between the middle two norms
    norms, want = reference(per, clip)
    assert (norms > clip).any() and (norms < clip).any()
    for p in model.parameters():
        p.grad = None
    with BookKeeping(model, clip_norm=clip, mode=mode) as bk:
        bk.backward(loss_fn(model, *data))
    assert_rel_close(bk.last_norms, norms, what="norms")
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert_rel_close(p.grad, want[name], what=name)
    return bk


def tokens(b: int, t: int, pad_tail: bool = False, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, VOCAB, (b, t), generator=g)
    if pad_tail:  # sequences of different lengths, padded with PAD (masked in the loss only)
        for i in range(b):
            x[i, max(2, t - i):] = PAD
    return x


def tiny_gpt2(tied: bool = True) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=32,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                      bos_token_id=1, eos_token_id=1, tie_word_embeddings=tied))


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                         max_position_embeddings=64, bos_token_id=1, eos_token_id=1,
                                         pad_token_id=PAD))
    with torch.no_grad():  # random norm weights, so their per-sample gradients are not trivially alike
        for module in model.modules():
            if type(module).__name__ == "LlamaRMSNorm":
                module.weight.uniform_(0.5, 1.5)
    return model


# ----------------------------------------------------------------------------- GPT-2


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pad_tail", [False, True])
def test_gpt2_matches_per_sample_loop(mode: str, pad_tail: bool) -> None:
    model = tiny_gpt2()
    bk = check_against_loop(model, gpt2_lm_loss, (tokens(5, 9, pad_tail=pad_tail, seed=1),), mode)
    assert bk.last_methods["transformer.h.0.attn.c_attn.weight"] in ("ghost", "instantiate")


@pytest.mark.parametrize("mode", MODES)
def test_gpt2_untied_matches_per_sample_loop(mode: str) -> None:
    model = tiny_gpt2(tied=False)
    assert model.lm_head.weight is not model.transformer.wte.weight
    check_against_loop(model, gpt2_lm_loss, (tokens(4, 9, seed=2),), mode)


def test_gpt2_tied_embedding_is_one_parameter_with_both_contributions() -> None:
    """wte and lm_head share one Parameter: its per-sample gradient is the SUM of both modules'
    contributions before the norm (not two separately clipped pieces)."""
    model = tiny_gpt2()
    assert model.lm_head.weight is model.transformer.wte.weight
    data = (tokens(5, 9, seed=3),)
    untied = copy.deepcopy(model)
    untied.lm_head.weight = nn.Parameter(untied.transformer.wte.weight.detach().clone())
    parts = loop_per_sample_grads(untied, gpt2_lm_loss, data)
    tied = loop_per_sample_grads(model, gpt2_lm_loss, data)
    assert "lm_head.weight" not in tied
    both = parts["transformer.wte.weight"] + parts["lm_head.weight"]
    assert_rel_close(tied["transformer.wte.weight"], both, rel=1e-5, what="tied = sum of both uses")
    for mode in MODES:
        bk = check_against_loop(model, gpt2_lm_loss, data, mode)
        separate = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in parts.values()))
        assert not torch.allclose(bk.last_norms, separate, rtol=1e-3)  # the cross term counts


@pytest.mark.parametrize("mode", MODES)
def test_gpt2_with_positions_made_inside_the_model(mode: str) -> None:
    """GPT-2 makes position_ids = arange(T)[None] ([1, T]) itself: its size-1 dim 0 broadcasts
    over the batch, is expanded to it, and passes the independence replay and the probe (item 3)."""
    check_against_loop(tiny_gpt2(), hf_lm_loss, (tokens(5, 9, seed=4),), mode)


# ----------------------------------------------------------------------------- Llama


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pad_tail", [False, True])
def test_llama_matches_per_sample_loop(mode: str, pad_tail: bool) -> None:
    """Rotary embeddings (a buffer-only module, positions made inside the model), grouped-query
    attention, RMSNorm, SwiGLU MLP; untied head."""
    model = tiny_llama()
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    bk = check_against_loop(model, hf_lm_loss, (tokens(5, 9, pad_tail=pad_tail, seed=5),), mode)
    assert bk.last_methods["model.layers.0.input_layernorm.weight"] == "instantiate"  # Dense


# ----------------------------------------------------------------------------- RMSNorm families


def _rms_classes() -> list[type]:
    import fedpriv.clipping.hf_rules as hf_rules

    return [nn.RMSNorm] + list(hf_rules.RMS_NORMS)


def _make_norm(kind: type, d: int) -> nn.Module:
    norm = nn.RMSNorm(d, eps=1e-5) if kind is nn.RMSNorm else kind(d, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(-1.0, 1.5)
    return norm


def test_rms_norm_families_registered() -> None:
    import fedpriv.clipping.hf_rules as hf_rules

    names = {k.__name__ for k in hf_rules.RMS_NORMS}
    assert {"LlamaRMSNorm", "GemmaRMSNorm"} <= names
    assert all(kind in RULES for kind in hf_rules.RMS_NORMS) and nn.RMSNorm in RULES
    assert hf_rules.RMS_NORMS[next(k for k in hf_rules.RMS_NORMS if k.__name__ == "GemmaRMSNorm")] == 1.0


@pytest.mark.parametrize("kind", _rms_classes(), ids=lambda k: k.__name__)
def test_rms_norm_formula_matches_the_class_forward(kind: type) -> None:
    """The rule's reconstruction x̂ ⊙ (offset + w) equals each registered class's own forward
    (the formula is checked, not trusted from the name), on [B, T, d] and [B, T, H, d] inputs."""
    import fedpriv.clipping.hf_rules as hf_rules

    torch.manual_seed(0)
    norm = _make_norm(kind, 8)
    for shape in ((3, 4, 8), (2, 3, 2, 8)):
        x = torch.randn(shape) * 3
        with torch.no_grad():
            got = norm(x)
            if kind is nn.RMSNorm:
                want = F.rms_norm(x, (8,), None, norm.eps) * norm.weight
            else:
                want = hf_rules.rms_reconstruct(norm, x)
        torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-5, atol=1e-6)


class NormNet(nn.Module):
    """Linear → RMSNorm (the class under test) → tanh → Linear."""

    def __init__(self, norm: nn.Module, d: int = 8) -> None:
        super().__init__()
        self.inp = nn.Linear(6, d)
        self.norm = norm
        self.out = nn.Linear(d, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.norm(self.inp(x))).mean(1))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", _rms_classes(), ids=lambda k: k.__name__)
def test_rms_norm_per_sample_grads_match_loop(kind: type, mode: str) -> None:
    torch.manual_seed(1)
    model = NormNet(_make_norm(kind, 8))
    x, y = torch.randn(6, 4, 6), torch.randint(0, 5, (6,))
    check_against_loop(model, class_loss, (x, y), mode)


# ----------------------------------------------------------------------------- fail closed / import


def test_unsupported_hf_layers_are_refused_naming_module_and_class() -> None:
    torch.manual_seed(0)
    model = MambaForCausalLM(MambaConfig(vocab_size=VOCAB, hidden_size=16, state_size=4, num_hidden_layers=1,
                                         expand=2, conv_kernel=2, bos_token_id=1, eos_token_id=1,
                                         pad_token_id=PAD))
    with pytest.raises(UnsupportedLayerError, match=r"^backbone\.layers\.0\.norm \(MambaRMSNorm\) owns trainable"):
        BookKeeping(model)  # an RMSNorm class without a rule (its formula not verified): refused, not guessed
    for module in model.modules():
        if type(module).__name__ == "MambaRMSNorm":
            module.weight.requires_grad_(False)
    with pytest.raises(UnsupportedLayerError,
                       match=r"^backbone\.layers\.0\.mixer \(MambaMixer\) owns trainable parameter\(s\) A_log, D"):
        BookKeeping(model)

    llama = tiny_llama()
    kind = type(llama.model.norm)

    class MyRMSNorm(kind):  # exact-type matching: a subclass of a registered class needs its own rule
        pass

    llama.model.norm = MyRMSNorm(32)
    with pytest.raises(UnsupportedLayerError, match=r"^model\.norm \(MyRMSNorm\)"):
        BookKeeping(llama)


def test_transformers_is_imported_only_when_a_model_uses_it() -> None:
    script = ("import sys\n"
              "import fedpriv.clipping as c\n"
              "assert 'transformers' not in sys.modules, 'fedpriv.clipping imported transformers'\n"
              "assert 'fedpriv.clipping.hf_rules' not in sys.modules\n"
              "import torch\n"
              "c.BookKeeping(torch.nn.Sequential(torch.nn.Linear(2, 2))).detach()\n"
              "assert 'fedpriv.clipping.hf_rules' not in sys.modules, 'a torch-only model pulled in hf_rules'\n"
              "from transformers.pytorch_utils import Conv1D\n"
              "assert Conv1D not in c.RULES\n"
              "c.BookKeeping(torch.nn.Sequential(Conv1D(3, 2))).detach()\n"
              "assert 'fedpriv.clipping.hf_rules' in sys.modules and Conv1D in c.RULES\n")
    assert_script_runs(script)


def test_gpt2_with_a_batch_of_one_matches_the_loop() -> None:
    """GPT-2's input_ids.view(-1, T) gives the size-1 batch dim another stride: a size-1 dim's
    stride means nothing, so the view is still the model's input (positions passed, item 3)."""
    torch.manual_seed(0)
    model = tiny_gpt2()
    data = (tokens(1, 8),)
    per = loop_per_sample_grads(model, gpt2_lm_loss, data)
    norms, _ = reference(per, 1.0)
    clip = norms.item() / 2
    norms, want = reference(per, clip)
    for p in model.parameters():
        p.grad = None
    with BookKeeping(model, clip_norm=clip, mode="mixopt") as bk:
        bk.backward(gpt2_lm_loss(model, *data))
    assert_rel_close(bk.last_norms, norms, what="norms")
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert_rel_close(p.grad, want[name], what=name)
