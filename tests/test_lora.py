"""LoRA (fedpriv.models.lora.add_lora, peft adapters with frozen base weights) under Book-Keeping, on tiny
random-init GPT-2 and Llama, against the per-sample autograd loop of tests/test_clipping_hf.py.
Nothing is downloaded."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
pytest.importorskip("peft")

from fedpriv.clipping import BookKeeping, UnsupportedLayerError  # noqa: E402
from fedpriv.models.lora import add_lora, lora_state_dict, trainable_parameter_count  # noqa: E402
from tests.test_clipping_hf import (MODES, check_against_loop, gpt2_lm_loss, hf_lm_loss,  # noqa: E402
                                    loop_per_sample_grads, reference, tiny_gpt2, tiny_llama, tokens)
from tests.test_clipping_hf import one_thread  # noqa: E402, F401 (a module fixture: one torch thread)
from tests.helpers import assert_script_runs  # noqa: E402

RANK = 4
pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")

FAMILIES: dict[str, tuple[Callable[[], nn.Module], Callable]] = {
    "gpt2": (tiny_gpt2, gpt2_lm_loss),
    "llama": (tiny_llama, hf_lm_loss),
}
#: adapted layers per family (2 blocks each): name suffix -> (in, out) features
LAYERS = {
    "gpt2": {"attn.c_attn": (32, 96), "attn.c_proj": (32, 32), "mlp.c_fc": (32, 128), "mlp.c_proj": (128, 32)},
    "llama": {"self_attn.q_proj": (32, 32), "self_attn.k_proj": (32, 16), "self_attn.v_proj": (32, 16),
              "self_attn.o_proj": (32, 32), "mlp.gate_proj": (32, 64), "mlp.up_proj": (32, 64),
              "mlp.down_proj": (64, 32)},
}


def lora_model(family: str, **kwargs) -> nn.Module:
    """The tiny model with rank-4 adapters; lora_B (zero at peft's init, which would give lora_A a
    zero gradient) set to small random values so that both factors have per-sample gradients."""
    model = add_lora(FAMILIES[family][0](), RANK, **kwargs)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def is_adapter(name: str) -> bool:
    return ".lora_A.default.weight" in name or ".lora_B.default.weight" in name


# ----------------------------------------------------------------------------- (a) what trains


@pytest.mark.parametrize("family", FAMILIES)
def test_only_adapters_train_and_base_weights_stay_bit_identical(family: str) -> None:
    model = lora_model(family)
    names = [n for n, _ in model.named_parameters()]
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(is_adapter(n) for n in trainable)
    assert [n for n in names if is_adapter(n)] == trainable  # every adapter weight trains
    layers = 2 * len(LAYERS[family])
    assert len(trainable) == 2 * layers
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9, weight_decay=0.1)
    data = tokens(4, 9, seed=11)
    with BookKeeping(model, clip_norm=0.1, noise_multiplier=0.5, noise_key=b"lora-test-key-16") as bk:
        bk.backward(FAMILIES[family][1](model, data))
    for n, p in model.named_parameters():
        assert (p.grad is not None) == p.requires_grad, n
    opt.step()
    for n, p in model.named_parameters():
        if n in base:
            assert torch.equal(p, base[n]), f"{n} changed"
        else:
            assert not torch.equal(p, adapters[n]), f"{n} did not move"


@pytest.mark.parametrize("family", FAMILIES)
def test_adapted_model_at_init_computes_the_base_model(family: str) -> None:
    """lora_B starts at zero, and the embedding pre-hook (input_ids -> inputs_embeds) is the same
    computation: logits equal the untouched model's, with grad enabled (hook active) and without."""
    make = FAMILIES[family][0]
    base, model = make(), add_lora(make(), RANK)
    x = tokens(3, 9, seed=13)
    want = base(x).logits.detach()
    assert torch.allclose(model(x).logits, want, rtol=0, atol=1e-6)
    assert torch.allclose(model(input_ids=x).logits, want, rtol=0, atol=1e-6)
    with torch.no_grad():
        assert torch.allclose(model(x).logits, want, rtol=0, atol=1e-6)


def test_without_the_embedding_hook_bk_cannot_prove_the_first_adapter_inputs() -> None:
    """Why add_lora adds the hook: with every base weight frozen nothing before the first adapter
    has an autograd graph, and BK fails closed instead of guessing that its input is per sample."""
    model = lora_model("llama")
    model._fedpriv_lora_embed_hook.remove()
    refused = r"q_proj\.lora_A\.default \(Linear\): its input .* is made in the forward with no autograd link"
    with BookKeeping(model) as bk, pytest.raises(UnsupportedLayerError, match=refused):
        bk.backward(hf_lm_loss(model, tokens(3, 9)))


# ----------------------------------------------------------------------------- (b) exactness


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("pad_tail", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_bk_matches_per_sample_loop_on_adapters(family: str, pad_tail: bool, mode: str) -> None:
    """Norms over the adapter parameters and the clipped sum equal the loop's within 1e-4 (the
    loop and BK see only the parameters that require grad: the adapters)."""
    model = lora_model(family)
    bk = check_against_loop(model, FAMILIES[family][1], (tokens(5, 9, pad_tail=pad_tail, seed=1),), mode)
    assert set(bk.last_methods) == {n for n, p in model.named_parameters() if p.requires_grad}
    assert "unused" not in bk.last_methods.values()


@pytest.mark.parametrize("mode", MODES)
def test_gpt2_lora_with_positions_made_inside_the_model(mode: str) -> None:
    """With the position embedding frozen (wpe is a base weight), GPT-2's own [1, T] position ids
    need no workaround: the shared wpe call is not hooked (contrast the xfail in
    test_clipping_hf.py, where wpe trains)."""
    check_against_loop(lora_model("gpt2"), hf_lm_loss, (tokens(5, 9, seed=4),), mode)


@pytest.mark.parametrize("family", FAMILIES)
def test_alpha_scales_the_adapter_and_rank_sets_shapes(family: str) -> None:
    model = add_lora(FAMILIES[family][0](), 2, alpha=8.0)
    wrapped = [m for m in model.modules() if type(m).__module__.startswith("peft.")]
    assert len(wrapped) == 2 * len(LAYERS[family])
    assert all(m.scaling["default"] == 4.0 for m in wrapped)
    default = add_lora(FAMILIES[family][0](), 3)
    assert all(m.scaling["default"] == 1.0 for m in default.modules() if type(m).__module__.startswith("peft."))


def test_adapter_dropout_is_accepted_and_exact_in_eval_mode() -> None:
    """Dropout on the adapter input masks each sample's own rows (BK accepts it in training mode);
    with the model in eval mode it is the identity and BK matches the loop exactly."""
    model = lora_model("llama", dropout=0.25)
    data = (tokens(4, 9, seed=14),)
    with BookKeeping(model, clip_norm=0.1) as bk:
        bk.backward(hf_lm_loss(model, *data))
    assert torch.isfinite(bk.last_norms).all() and (bk.last_norms > 0).all()
    model.eval()
    check_against_loop(model, hf_lm_loss, data, "mixopt")


# ----------------------------------------------------------------------------- (c) noise


@pytest.mark.parametrize("family", FAMILIES)
def test_noise_lands_only_on_adapter_grads(family: str) -> None:
    model = lora_model(family)
    loss_fn = FAMILIES[family][1]
    data = (tokens(4, 9, seed=12),)
    clip, sigma = 0.05, 2.0
    _, want = reference(loop_per_sample_grads(model, loss_fn, data), clip)
    with BookKeeping(model, clip_norm=clip, noise_multiplier=sigma, noise_key=b"lora-noise-key-16") as bk:
        bk.backward(loss_fn(model, *data))
    noise = []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            assert p.grad is None, n
            continue
        noise.append((p.grad - want[n]).flatten())
    noise = torch.cat(noise)
    assert noise.numel() == trainable_parameter_count(model)
    assert abs(noise.std().item() / (sigma * clip) - 1) < 0.1  # σ·C per coordinate
    assert abs(noise.mean().item()) < 0.1 * sigma * clip


# ----------------------------------------------------------------------------- (d) what is sent


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_state_dict_holds_exactly_the_adapter_tensors(family: str) -> None:
    model = lora_model(family)
    sent = lora_state_dict(model)
    assert list(sent) == [n for n, p in model.named_parameters() if p.requires_grad]
    expected = set()
    for path, module in model.named_modules():
        for suffix, (d_in, d_out) in LAYERS[family].items():
            if path.endswith(suffix) and type(module).__module__.startswith("peft."):
                expected |= {f"{path}.lora_A.default.weight", f"{path}.lora_B.default.weight"}
                assert sent[f"{path}.lora_A.default.weight"].shape == (RANK, d_in)
                assert sent[f"{path}.lora_B.default.weight"].shape == (d_out, RANK)
    assert set(sent) == expected
    count = 2 * RANK * sum(d_in + d_out for d_in, d_out in LAYERS[family].values())  # 2 blocks
    assert trainable_parameter_count(model) == sum(t.numel() for t in sent.values()) == count
    params = dict(model.named_parameters())
    for n, t in sent.items():  # detached copies, not views of the live weights
        assert not t.requires_grad and torch.equal(t, params[n]) and t.data_ptr() != params[n].data_ptr()


# ----------------------------------------------------------------------------- (e) refusals


@pytest.mark.parametrize("rank", [0, -1, 2.0, True])
def test_bad_rank_is_refused(rank) -> None:
    with pytest.raises(ValueError, match=r"^LoRA rank must be an integer >= 1, got "):
        add_lora(tiny_gpt2(), rank)


@pytest.mark.parametrize("targets, message", [
    (["nope"], r"^LoRA target 'nope' matches no module of GPT2LMHeadModel \(its Linear/Conv1D modules: "
               r"c_attn, c_fc, c_proj, lm_head\)$"),
    (["wte"], r"^LoRA target 'wte' matches transformer\.wte \(Embedding\), not a Linear/Conv1D layer"),
    (["c_attn", "lm_head"], r"^targets \['c_attn', 'lm_head'\] mix nn\.Linear and Conv1D layers"),
    ("c_attn", r"^targets must be a non-empty sequence of module names"),
])
def test_unknown_or_unsupported_targets_are_refused_in_one_line(targets, message) -> None:
    with pytest.raises(ValueError, match=message) as info:
        add_lora(tiny_gpt2(), 2, targets)
    assert "\n" not in str(info.value)


def test_unknown_family_is_refused_listing_its_layers() -> None:
    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(5, 4)
            self.proj = nn.Linear(4, 4)
            self.head = nn.Linear(4, 5)

    with pytest.raises(ValueError, match=r"^add_lora cannot guess the target modules of Tiny \(its Linear/Conv1D "
                                         r"modules: head, proj\); pass targets=\[\.\.\.\]$"):
        add_lora(Tiny(), 2)
    model = add_lora(Tiny(), 2, targets=["proj"])  # explicit targets work on any model
    assert [n for n, p in model.named_parameters() if p.requires_grad] == [
        "proj.lora_A.default.weight", "proj.lora_B.default.weight"]


def test_peft_variants_with_their_own_parameters_fail_closed() -> None:
    """DoRA's magnitude vector and embedding LoRA's ParameterDict are not nn.Linear calls: BK
    refuses them by module path and class (add_lora creates neither)."""
    import peft

    dora = r"model\.layers\.0\.self_attn\.q_proj\.lora_magnitude_vector\.default \(DoraLinearLayer\)"
    embedding = r"model\.embed_tokens\.lora_embedding_A \(ParameterDict\)"
    for kwargs, where in ((dict(use_dora=True, target_modules=["q_proj"]), dora),
                          (dict(target_modules=["embed_tokens"]), embedding)):
        model = peft.inject_adapter_in_model(peft.LoraConfig(r=2, **kwargs), tiny_llama())
        with pytest.raises(UnsupportedLayerError, match="^" + where + " owns trainable"):
            BookKeeping(model)


# ----------------------------------------------------------------------------- (f) optional import


def test_peft_is_imported_only_by_add_lora() -> None:
    script = ("import sys\n"
              "import fedpriv.clipping as c, fedpriv.models.lora as lora\n"
              "assert 'peft' not in sys.modules, 'importing fedpriv.clipping / fedpriv.models.lora imported peft'\n"
              "import torch\n"
              "from transformers import GPT2Config, GPT2LMHeadModel\n"
              "m = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=11, n_positions=8))\n"
              "c.BookKeeping(m).detach()\n"
              "assert 'peft' not in sys.modules, 'BookKeeping on a transformers model imported peft'\n"
              "lora.add_lora(m, 1)\n"
              "assert 'peft' in sys.modules\n"
              "c.BookKeeping(m).detach()\n")
    assert_script_runs(script)


def test_missing_peft_names_the_hf_extra() -> None:
    script = ("import sys\n"
              "sys.modules['peft'] = None  # as if not installed\n"
              "import torch, fedpriv.models.lora as lora\n"
              "try:\n"
              "    lora.add_lora(torch.nn.Sequential(torch.nn.Linear(2, 2)), 1, targets=['0'])\n"
              "except ImportError as e:\n"
              "    assert 'pip install -e .[hf]' in str(e), e\n"
              "else:\n"
              "    raise SystemExit('no ImportError')\n")
    assert_script_runs(script)
