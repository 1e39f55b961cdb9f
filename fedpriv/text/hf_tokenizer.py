"""A local Hugging Face tokenizer in fedpriv's row layout (optional extra ``hf``; nothing is
downloaded: it loads with ``local_files_only=True``). The row layout and the extra pad id are
described in :mod:`fedpriv.public.hf`, whose teacher shares this tokenizer."""

from __future__ import annotations

from pathlib import Path

from fedpriv.errors import ConfigError
from fedpriv.text.tokenizers import UNKNOWN_WORD


def transformers_module():
    try:
        import transformers  # lazy: optional package (the hf extra)
    except ImportError:
        raise ConfigError('model=hf / public.teacher=hf / data.tokenizer=hf need transformers: '
                          'pip install -e ".[hf]"') from None
    transformers.utils.logging.disable_progress_bar()  # no per-load bars in a run's output
    return transformers


def check_dir(path: str | Path | None, what: str) -> Path:
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
        path = check_dir(path, "data.tokenizer_path")
        return cls(transformers_module().AutoTokenizer.from_pretrained(str(path), local_files_only=True))

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
