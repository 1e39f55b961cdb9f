"""A Hugging Face causal LM from a local directory as the public teacher (optional extra ``hf``:
``pip install -e ".[hf]"``, which installs ``transformers``). Nothing is downloaded: both the
model and its tokenizer load with ``local_files_only=True``.

The student must share the teacher's tokenizer so that token ids, and so top-k logits, align:
``data.tokenizer=hf`` re-encodes every split with :class:`HFTokenizer` (``data.tokenizer_path``,
by default ``public.teacher_path``). Row layout: ``BOS t_1 … t_k EOS PAD …`` with the tokenizer's
own BOS/EOS (falling back to EOS, then to an appended id) and, when the tokenizer has no pad token
(GPT-2 style), one extra id ``len(tokenizer)`` appended for padding — the student's vocabulary is
then one larger than the teacher's, and :class:`HFTeacher` feeds EOS where the row holds that pad
(right padding under a causal mask never changes earlier positions) and gives the pad a logit of
``-inf``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from fedpriv.errors import ConfigError
from fedpriv.public.tokenizers import UNKNOWN_WORD


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ConfigError('public.teacher=hf / data.tokenizer=hf need transformers: pip install -e ".[hf]"') from None
    return transformers


def _check_dir(path: str | Path | None, what: str) -> Path:
    if not path or not Path(path).is_dir():
        raise ConfigError(f"{what} must be a local directory holding a Hugging Face model/tokenizer, got {path!r}")
    return Path(path)


class HFTokenizer:
    """A local Hugging Face tokenizer in fedpriv's row layout (see the module docstring)."""

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        n = len(tokenizer)
        extra = n
        if tokenizer.pad_token_id is None:
            self.pad_id, extra = extra, extra + 1
        else:
            self.pad_id = int(tokenizer.pad_token_id)
        eos = tokenizer.eos_token_id
        if eos is None:
            eos, extra = extra, extra + 1
        self.eos_id = int(eos)
        self.bos_id = int(tokenizer.bos_token_id) if tokenizer.bos_token_id is not None else self.eos_id
        self.oov_id = int(tokenizer.unk_token_id) if tokenizer.unk_token_id is not None else None
        self.teacher_size = n  # ids the teacher itself knows
        self.size = extra
        self._pieces: dict[str, list[int]] = {}

    @classmethod
    def load(cls, path: str | Path | None) -> "HFTokenizer":
        path = _check_dir(path, "data.tokenizer_path")
        return cls(_transformers().AutoTokenizer.from_pretrained(str(path), local_files_only=True))

    def encode_word(self, word: str) -> list[int]:
        """A word as it appears after a space (``" word"``), memoized; ``<unk>`` is the unk id."""
        pieces = self._pieces.get(word)
        if pieces is None:
            if word == UNKNOWN_WORD and self.oov_id is not None:
                pieces = [self.oov_id]
            else:
                pieces = list(self.tok.encode(" " + word, add_special_tokens=False))
            self._pieces[word] = pieces
        return pieces


class HFTeacher(nn.Module):
    """``forward(x) -> logits [B, L, student_vocab]`` of a local causal LM over fedpriv rows."""

    def __init__(self, model: nn.Module, tokenizer: HFTokenizer) -> None:
        super().__init__()
        self.model, self.tokenizer = model.eval(), tokenizer

    @classmethod
    def load(cls, path: str | Path | None, tokenizer: HFTokenizer) -> "HFTeacher":
        path = _check_dir(path, "public.teacher_path")
        model = _transformers().AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
        rows = model.get_input_embeddings().num_embeddings
        if rows < tokenizer.teacher_size:
            raise ConfigError(f"the teacher at {str(path)!r} has {rows} token embeddings but the tokenizer "
                              f"{tokenizer.teacher_size} tokens: use the teacher's own tokenizer")
        return cls(model, tokenizer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tok = self.tokenizer
        ids = x.masked_fill(x >= tok.teacher_size, tok.eos_id if tok.eos_id < tok.teacher_size else 0)
        logits = self.model(input_ids=ids).logits[..., :tok.teacher_size].float()
        if tok.size > tok.teacher_size:  # ids only the student has (pad, appended EOS) are never predicted
            logits = torch.cat([logits, logits.new_full((*logits.shape[:-1], tok.size - tok.teacher_size),
                                                        float("-inf"))], dim=-1)
        return logits
