"""A local Hugging Face tokenizer in fedpriv's row layout (optional extra ``hf``; nothing is
downloaded: it loads with ``local_files_only=True``). The row layout and the extra pad id are
described in :mod:`fedpriv.public.hf`, whose teacher shares this tokenizer.

Also the loading that ``model=hf`` (:mod:`fedpriv.models.hf`) and ``public.teacher=hf``
(:mod:`fedpriv.public.hf`) share: :func:`load_causal_lm` and :func:`check_tokenizer_fits`. What
can be judged from these public files is refused in one line before anything trains: a
directory without tokenizer files (``transformers`` would build an empty tokenizer, on which a
run trains to a loss near 0 and accuracy 0), a tokenizer with no ordinary token, one far smaller
than the model's embedding table, weights that do not load or are not finite."""

from __future__ import annotations

from pathlib import Path

import torch

from fedpriv.errors import ConfigError
from fedpriv.release.rundir import short_reason
from fedpriv.text.tokenizers import UNKNOWN_WORD

# the least share of a model's embedding rows its tokenizer must cover: a model's table is at most
# a few percent larger than its own tokenizer (rows padded for speed, e.g. Phi-2's 51200 rows for
# about 50300 ids); a tokenizer much smaller is another model's, or empty
MIN_TOKENIZER_SHARE = 0.9


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


def load_causal_lm(path: str | Path | None, what: str, **kwargs):
    """``AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **kwargs)``; a directory
    it cannot load (no weights, an unknown architecture, a damaged ``model.safetensors``, whose
    errors are safetensors' own type, not an ``OSError``) or weights that are not all finite (NaN
    or inf: a damaged file, or a diverged model) are one :class:`ConfigError` naming ``what``."""
    path, transformers = check_dir(path, what), transformers_module()
    try:
        lm = transformers.AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, **kwargs)
    except Exception as err:  # noqa: BLE001 - any failure to read the user's files is bad input
        raise ConfigError(f"{what} {str(path)!r} does not load as a Hugging Face causal LM "
                          f"({short_reason(err)})") from None
    bad = [name for name, p in lm.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise ConfigError(f"{what} {str(path)!r}: the weights {bad[0]}{more} are not finite (NaN or inf): the "
                          "weights file is damaged, or the model diverged")
    return lm


def check_tokenizer_fits(rows: int, ids: int, what: str) -> None:
    """Refuse a tokenizer of ``ids`` ids for a model with ``rows`` token embeddings when it covers
    fewer than :data:`MIN_TOKENIZER_SHARE` of them (a larger one is refused by the caller's rule,
    which knows what it appends)."""
    if ids < MIN_TOKENIZER_SHARE * rows:
        raise ConfigError(f"{what} has {rows} token embeddings but the tokenizer only {ids} ids (under "
                          f"{MIN_TOKENIZER_SHARE:.0%} of them): it is another model's tokenizer; give the model's own "
                          "(data.tokenizer_path)")


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
        """The tokenizer in the directory ``path``; refused (:class:`ConfigError`, one line) when it
        does not load, when the directory holds none of its files (``tokenizer.json`` or the slow
        tokenizer's vocabulary files: ``transformers`` would otherwise build an empty tokenizer
        from the model's config alone) or when it has no id but its special ones."""
        path, transformers = check_dir(path, "data.tokenizer_path"), transformers_module()
        try:
            tok = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as err:  # noqa: BLE001 - any failure to read the user's files is bad input
            raise ConfigError(f"data.tokenizer_path {str(path)!r}: no tokenizer loads from it "
                              f"({short_reason(err)})") from None
        files = sorted({"tokenizer.json", *getattr(tok, "vocab_files_names", {}).values()})
        if not any((path / name).is_file() for name in files):
            raise ConfigError(f"data.tokenizer_path {str(path)!r} holds no tokenizer files (none of "
                              f"{', '.join(files)}): give the directory of the model's own tokenizer")
        specials = set(tok.all_special_ids)
        if len(tok) <= len(specials):
            raise ConfigError(f"data.tokenizer_path {str(path)!r}: its tokenizer has no token but its {len(specials)} "
                              "special one(s): every word would encode to nothing")
        return cls(tok)

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
