"""Book-Keeping on more Hugging Face decoder families (tiny random-init configs built here, nothing
downloaded) and on nn.Linear / nn.Embedding subclasses whose forward scales or offsets the base
layer (fedpriv.clipping.subclass_rules), against the per-sample autograd loop in every mode."""

from __future__ import annotations

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from fedpriv.clipping import BookKeeping, UnsupportedLayerError  # noqa: E402
from fedpriv.clipping.subclass_rules import base_scale  # noqa: E402
from tests.test_clipping import MODES, lm_loss, one_thread  # noqa: E402, F401 (a module fixture)
from tests.test_clipping_hf import VOCAB, check_against_loop, hf_lm_loss, tokens  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64)
#: family -> (config class, its keyword arguments, the classes it brings that a plain rule does not name)
FAMILIES = {
    "mistral": ("MistralConfig", SMALL),
    "qwen2": ("Qwen2Config", SMALL),
    "qwen3": ("Qwen3Config", {**SMALL, "head_dim": 8}),
    "phi3": ("Phi3Config", {**SMALL, "pad_token_id": 0}),
    "olmo2": ("Olmo2Config", {**SMALL, "pad_token_id": 0}),
    "gemma": ("GemmaConfig", {**SMALL, "head_dim": 8}),  # scaled word embedding (sqrt d), 1 + w norms, tied head
    "gemma2": ("Gemma2Config", {**SMALL, "head_dim": 8}),  # + logit soft-capping
    "falcon": ("FalconConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB,
                                    new_decoder_architecture=False, multi_query=True, bias=True)),  # FalconLinear
    "gpt_neox": ("GPTNeoXConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, vocab_size=VOCAB)),  # partial rotary, parallel residual
    "stablelm": ("StableLmConfig", SMALL),
    "phi": ("PhiConfig", dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              vocab_size=VOCAB)),
}


def tiny(family: str) -> nn.Module:
    name, kwargs = FAMILIES[family]
    config_class = getattr(transformers, name)
    torch.manual_seed(0)
    config = config_class(**kwargs)
    for key in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if hasattr(config, key):
            setattr(config, key, 0.0)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_decoder_family_matches_per_sample_loop(family: str, mode: str) -> None:
    model = tiny(family)
    check_against_loop(model, hf_lm_loss, (tokens(4, 8, pad_tail=True, seed=11),), mode)


def test_gemma_scaled_embedding_and_falcon_linear_are_recognised_by_their_computation() -> None:
    gemma = tiny("gemma").get_input_embeddings()
    assert type(gemma) is not nn.Embedding and base_scale(gemma) == pytest.approx(32 ** 0.5, rel=1e-6)
    falcon = tiny("falcon")
    linear = next(m for m in falcon.modules() if type(m).__name__ == "FalconLinear")
    assert base_scale(linear) == pytest.approx(1.0, rel=1e-6)


class ScaledShifted(nn.Embedding):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("shift", torch.randn(self.embedding_dim))

    def forward(self, idx):
        return super().forward(idx) * 3.0 + self.shift


class HalfLinearPlusOne(nn.Linear):
    def forward(self, x):
        return 0.5 * (x @ self.weight.T + self.bias) + 1.0


class PerFeatureScale(nn.Embedding):
    def forward(self, idx):
        return super().forward(idx) * torch.arange(1, self.embedding_dim + 1, dtype=self.weight.dtype)


class InputOffset(nn.Embedding):
    def forward(self, idx):
        return super().forward(idx) + idx.unsqueeze(-1).to(self.weight.dtype)


class PositionsFromMask(nn.Embedding):  # OPT's learned positions: indices computed from a mask
    def forward(self, mask):
        return super().forward((torch.cumsum(mask, 1) * mask - 1).long() + 2)


class SmallLM(nn.Module):
    def __init__(self, embedding: nn.Embedding, linear: nn.Linear) -> None:
        super().__init__()
        self.embedding, self.hidden, self.head = embedding, linear, nn.Linear(16, VOCAB)

    def forward(self, x):
        return self.head(torch.tanh(self.hidden(self.embedding(x))))


@pytest.mark.parametrize("mode", MODES)
def test_scaled_and_offset_subclasses_match_per_sample_loop(mode: str) -> None:
    torch.manual_seed(3)
    model = SmallLM(ScaledShifted(VOCAB, 16, padding_idx=0), HalfLinearPlusOne(16, 16))
    check_against_loop(model, lambda m, x: lm_loss(m, x), (tokens(5, 7, pad_tail=True, seed=2),), mode)


@pytest.mark.parametrize("kind, reason", [
    (PerFeatureScale, "not a scalar multiple"),
    (InputOffset, "offset depends on the input"),
    (PositionsFromMask, "PositionsFromMask"),
])
def test_subclasses_that_do_something_else_are_refused_naming_module_and_reason(kind, reason) -> None:
    torch.manual_seed(0)
    model = SmallLM(kind(VOCAB, 16), nn.Linear(16, 16))
    with pytest.raises(UnsupportedLayerError, match=reason) as err:
        BookKeeping(model, clip_norm=1.0)
    assert f"embedding ({kind.__name__})" in str(err.value) and "subclasses nn.Embedding" in str(err.value)


def test_opt_learned_positions_are_refused_naming_the_module() -> None:
    """OPT computes its positions from the attention mask inside an nn.Embedding subclass: not the
    base layer's computation on its input, so the family is refused (docs/HF_MODELS.md)."""
    config = transformers.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                                    vocab_size=VOCAB, word_embed_proj_dim=32)
    with pytest.raises(UnsupportedLayerError, match=r"embed_positions \(OPTLearnedPositionalEmbedding\)"):
        BookKeeping(transformers.AutoModelForCausalLM.from_config(config), clip_norm=1.0)
