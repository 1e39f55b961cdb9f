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
from fedpriv.text.hf_tokenizer import HFTokenizer, check_tokenizer_fits, load_causal_lm


class HFTeacher(nn.Module):
    """``forward(x) -> logits [B, L, student_vocab]`` of a local causal LM over fedpriv rows."""

    def __init__(self, model: nn.Module, tokenizer: HFTokenizer) -> None:
        super().__init__()
        self.model, self.tokenizer = model.eval(), tokenizer

    @classmethod
    def load(cls, path: str | Path | None, tokenizer: HFTokenizer) -> "HFTeacher":
        model = load_causal_lm(path, "public.teacher_path")
        rows = model.get_input_embeddings().num_embeddings
        if rows < tokenizer.teacher_size:
            raise ConfigError(f"the teacher at {str(path)!r} has {rows} token embeddings but the tokenizer "
                              f"{tokenizer.teacher_size} tokens: use the teacher's own tokenizer")
        check_tokenizer_fits(rows, tokenizer.teacher_size, f"the teacher at {str(path)!r}")
        return cls(model, tokenizer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tok = self.tokenizer
        ids = x.masked_fill(x >= tok.teacher_size, tok.eos_id if tok.eos_id < tok.teacher_size else 0)
        logits = self.model(input_ids=ids).logits[..., :tok.teacher_size].float()
        if tok.size > tok.teacher_size:  # ids only the student has (pad, appended EOS) are never predicted
            logits = torch.cat([logits, logits.new_full((*logits.shape[:-1], tok.size - tok.teacher_size),
                                                        float("-inf"))], dim=-1)
        return logits
