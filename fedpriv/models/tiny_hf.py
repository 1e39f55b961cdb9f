"""A small random-init Hugging Face causal LM and a word-level tokenizer, written to a local
directory offline: a model directory for ``model=hf`` (and ``public.teacher=hf``) when none is at
hand, used by ``python -m fedpriv.make_hf`` (the command), the tests and
scripts/pretrain_hf.py.

The tokenizer (``tokenizers`` WordLevel, whitespace split) numbers the dataset's words as the
word vocabulary does (:meth:`fedpriv.text.vocabulary.Vocabulary.of_words`: ``[PAD]`` 0, words
1..V, ``[UNK]`` V+1, ``[BOS]`` V+2, ``[EOS]`` V+3), so a run with ``data.tokenizer=hf`` sees the
same token ids as the word-level LSTM. Families: ``llama`` (RMSNorm, rotary positions, SwiGLU,
grouped-query attention) and ``gpt2`` (LayerNorm, learned positions, Conv1D, tied embeddings).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from fedpriv.text.hf_tokenizer import transformers_module

FAMILIES = ("llama", "gpt2")
SPECIALS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "bos_token": "[BOS]", "eos_token": "[EOS]"}


def word_tokenizer(words: Sequence[str]):
    """A fast tokenizer with ids ``[PAD]`` 0, ``words`` 1..V, ``[UNK]``, ``[BOS]``, ``[EOS]``."""
    import transformers  # lazy: optional package (the hf extra)
    from tokenizers import Tokenizer, models, pre_tokenizers  # lazy: optional package (the hf extra)

    vocab = {"[PAD]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    for name in ("[UNK]", "[BOS]", "[EOS]"):
        vocab[name] = len(vocab)
    if len(vocab) != len(words) + 4:
        raise ValueError("the word list repeats a word or holds a special token")
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **SPECIALS)


def tiny_config(family: str, vocab_size: int, hidden: int = 64, layers: int = 2, heads: int = 4,
                max_len: int = 128):
    """The ``transformers`` config of a small ``family`` model (Llama: half as many KV heads)."""
    import transformers  # lazy: optional package (the hf extra)

    if family == "llama":
        return transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=4 * hidden,
                                        num_hidden_layers=layers, num_attention_heads=heads,
                                        num_key_value_heads=max(1, heads // 2), max_position_embeddings=max_len,
                                        pad_token_id=0, bos_token_id=vocab_size - 2, eos_token_id=vocab_size - 1,
                                        tie_word_embeddings=False)
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=vocab_size, n_positions=max_len, n_embd=hidden, n_layer=layers,
                                       n_head=heads, pad_token_id=0, bos_token_id=vocab_size - 2,
                                       eos_token_id=vocab_size - 1)
    raise ValueError(f"unknown family {family!r} (choose one of: {', '.join(FAMILIES)})")


def write_model_dir(path: str | Path, words: Sequence[str], family: str = "llama", hidden: int = 64,
                    layers: int = 2, heads: int = 4, max_len: int = 128, seed: int = 0) -> Path:
    """Write the tokenizer of ``words`` and a random-init ``family`` model (seeded) to ``path``."""
    transformers = transformers_module()
    path = Path(path)
    tokenizer = word_tokenizer(words)
    config = tiny_config(family, len(tokenizer), hidden, layers, heads, max_len)
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # public initialisation, not a privacy randomness
        model = transformers.AutoModelForCausalLM.from_config(config)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(path)
    model.save_pretrained(path, safe_serialization=True)
    return path
