"""``model=hf``: a local Hugging Face causal LM (and its tokenizer) as a fedpriv language model,
fully fine-tuned or with LoRA adapters only (optional extra ``hf``; nothing is downloaded).

:class:`HFCausalLM` wraps ``AutoModelForCausalLM.from_pretrained(path, local_files_only=True)``
(float32, no KV cache, no dropout: :meth:`HFCausalLM.train`) in fedpriv's model contract,
``forward(tokens [B, T]) -> logits [B, T, V]`` with ``V`` the data's vocabulary
(``data.tokenizer=hf``, the model's own tokenizer in fedpriv's row layout,
:mod:`fedpriv.text.hf_tokenizer`):

- a tokenizer without a pad token gets one appended id (``V = rows + 1``, ``rows`` the model's
  embedding rows). That pad is never a target; as an input it only follows the row's EOS, which
  a causal model never lets earlier positions see, so it is fed as id 0 and its logit is ``-inf``
  (never predicted). Any other id the model has no row for is refused. A model with more rows
  than the tokenizer has ids (rows padded for speed) returns the first ``V`` logits; a tokenizer
  of fewer than 90% of the rows is another model's, and refused
  (:func:`fedpriv.text.hf_tokenizer.check_tokenizer_fits`).
- ``features``/``head`` split the forward at the last hidden state (``lm.base_model``) and the
  output embedding (with Gemma-2's final logit soft-capping), so that the output layer can run
  on the non-pad targets only (``keep``, :func:`fedpriv.clipping.flat_positions`). The split is
  checked once, at load, against the model's own logits on a probe; a family whose head does
  something else keeps the whole forward in ``features`` (same logits, no saving).
- ``lora_rank > 0``: :func:`fedpriv.models.lora.add_lora` freezes every base weight, so the trainable
  parameters (what is clipped, noised, sent, checkpointed) are the adapters only; the embedding
  pre-hook that lets Book-Keeping trace the first adapters' inputs sits on this wrapper, the
  module the engine is given.

:func:`save_release` writes a released flat parameter vector as a Hugging Face directory: the
full model (LoRA merged into the base weights) with the tokenizer, loadable by
``AutoModelForCausalLM.from_pretrained``, and with LoRA also the adapter alone in peft's format.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import stat
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Optional

import torch
from torch import nn

from fedpriv.clipping import flat_positions
from fedpriv.release.atomic import fsync_directory, write_atomic
from fedpriv.errors import ConfigError, OutputError
from fedpriv.models.lora import add_lora, look_up_embeddings_first, merge_adapters
from fedpriv.models.flat import set_flat_params
from fedpriv.models.tiny_hf import write_model_dir
from fedpriv.schema import LOCATION, ModelOption, nonnegative, positive, register_option
from fedpriv.text.hf_tokenizer import check_tokenizer_fits, load_causal_lm

RELEASE_DIR = "hf_model"  # the released model beside the run's other outputs
PROBE_TOLERANCE = 1e-4  # |head(features(x)) - lm(x).logits| / max|logits| for the split to be used


class HFCausalLM(nn.Module):
    """``forward(tokens [B, T], keep=None) -> logits [B, T, V]`` of a Hugging Face causal LM ``lm``
    (see the module docstring); ``inputs_embeds`` replaces ``tokens`` (the LoRA pre-hook)."""

    def __init__(self, lm: nn.Module, vocab_size: int, pad_id: int) -> None:
        super().__init__()
        self.lm = lm
        self.rows = int(lm.get_input_embeddings().num_embeddings)
        self.vocab_size, self.pad_id = int(vocab_size), int(pad_id)
        if self.vocab_size > self.rows and not (self.vocab_size == self.rows + 1 and self.pad_id == self.rows):
            raise ConfigError(f"the model has {self.rows} token embeddings but the tokenizer uses "
                              f"{self.vocab_size} ids (more than an appended pad): give the model's own "
                              "tokenizer (data.tokenizer_path)")
        check_tokenizer_fits(self.rows, self.vocab_size, "the model")
        self.softcap = getattr(getattr(lm, "config", None), "final_logit_softcapping", None)
        if self.vocab_size > self.rows:
            # before any other pre-hook (Book-Keeping's traces the ids it is given as the model's input)
            self.register_forward_pre_hook(_feed_pad_as_zero, with_kwargs=True, prepend=True)
        self.split = True
        self.split = self._split_matches()

    @classmethod
    def load(cls, path: str | Path | None, vocab_size: int, pad_id: int, lora_rank: int = 0,
             lora_targets: Optional[list[str]] = None, lora_alpha: Optional[float] = None) -> "HFCausalLM":
        """The model at ``path`` (config and weights, local only) in float32, with LoRA adapters of
        ``lora_rank`` on ``lora_targets`` (None: the family's defaults) when ``lora_rank > 0``."""
        lm = load_causal_lm(path, "model.path", dtype=torch.float32)
        lm.config.use_cache = False
        model = cls(lm, vocab_size, pad_id)
        if lora_rank > 0:
            try:
                add_lora(lm, lora_rank, targets=lora_targets, alpha=lora_alpha)
            except ValueError as err:
                raise ConfigError(f"model.lora_targets: {err}") from None
            lm._fedpriv_lora_embed_hook.remove()  # the engine hooks the wrapper: the lookup happens there
            del lm._fedpriv_lora_embed_hook
            look_up_embeddings_first(model, lookup=model.embed)
        return model

    def train(self, mode: bool = True) -> "HFCausalLM":
        """The wrapper's mode; the Hugging Face model itself always runs in eval mode, so training
        uses no dropout: dropout would draw from torch's global generator, which a resumed run does
        not restore (research runs must equal their uninterrupted selves) and which no privacy
        guarantee needs."""
        super().train(mode)
        self.lm.eval()
        return self

    def get_input_embeddings(self) -> nn.Module:
        return self.lm.get_input_embeddings()

    def _ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` with the appended pad (no model row) fed as id 0 (see the module docstring)."""
        return tokens.masked_fill(tokens >= self.rows, 0) if self.vocab_size > self.rows else tokens

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The model's input embeddings of ``tokens``."""
        return self.get_input_embeddings()(self._ids(tokens))

    def features(self, tokens: Optional[torch.Tensor] = None,
                 inputs_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The head's input [B, T, d] (the model's last hidden state; its logits where the split
        does not hold)."""
        return self._features(None if tokens is None else self._ids(tokens), inputs_embeds)

    def _features(self, ids: Optional[torch.Tensor], inputs_embeds: Optional[torch.Tensor]) -> torch.Tensor:
        inputs = {"inputs_embeds": inputs_embeds} if inputs_embeds is not None else {"input_ids": ids}
        if self.split:
            return self.lm.base_model(**inputs, use_cache=False)[0]
        return self.lm(**inputs, use_cache=False).logits

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the data's ``V`` ids from :meth:`features` (at all or at kept positions)."""
        logits = h
        if self.split:
            logits = self.lm.get_output_embeddings()(h)
            if self.softcap:
                logits = torch.tanh(logits / self.softcap) * self.softcap
        if self.vocab_size > self.rows:  # the appended pad: never predicted
            return torch.cat([logits, logits.new_full((*logits.shape[:-1], 1), float("-inf"))], dim=-1)
        return logits[..., :self.vocab_size]

    def forward(self, tokens: Optional[torch.Tensor] = None, keep: Optional[torch.Tensor] = None,
                inputs_embeds: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``tokens``: int [B, T] → logits [B, T, V]; with a bool ``keep`` [B, T], the logits at the
        kept positions only, [N, V] (:func:`fedpriv.clipping.flat_positions`)."""
        features = self._features(tokens, inputs_embeds)  # ids already fed in range (the pre-hook)
        return self.head(features if keep is None else flat_positions(features, keep))

    @torch.no_grad()
    def _split_matches(self) -> bool:
        was_training = self.training
        self.eval()
        try:
            x = torch.arange(min(8, self.rows), device=next(self.lm.parameters()).device)[None] % self.rows
            whole = self.lm(input_ids=x, use_cache=False).logits
            if self.softcap is None and getattr(self.lm.config, "final_logit_softcapping", None):
                return False
            split = self.head(self.features(x))[..., :min(self.rows, self.vocab_size)]
            whole = whole[..., :split.shape[-1]]
            scale = whole.abs().max().clamp(min=1e-12)
            return bool(((split - whole).abs().max() / scale) <= PROBE_TOLERANCE)
        except Exception:  # noqa: BLE001 - a family whose base model cannot be called alone
            return False
        finally:
            self.train(was_training)


def _feed_pad_as_zero(module: HFCausalLM, args: tuple, kwargs: dict):
    """Forward pre-hook: the appended pad id (no model row) in the tokens fed as id 0."""
    if args and isinstance(args[0], torch.Tensor) and not args[0].is_floating_point():
        return (module._ids(args[0]),) + tuple(args[1:]), kwargs
    return None


# a Hugging Face Hub repository id: namespace/name
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")


def base_model_name(path: str | Path) -> str:
    """The base model's own name for a release (never a local path, which means nothing elsewhere):
    the ``_name_or_path`` its ``config.json`` records when that is a Hub id (``namespace/name``);
    else, for a Hugging Face cache snapshot (``models--NS--NAME/snapshots/REV``), ``NS/NAME``;
    else the directory's name. A loader resolves it as usual: from the Hub (or its cache), or as
    a directory of that name under its working directory."""
    path = Path(path).resolve()
    try:
        recorded = json.loads((path / "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if isinstance(recorded, str) and _HUB_ID.fullmatch(recorded) and ".." not in recorded:
        return recorded
    if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
        return path.parent.parent.name[len("models--"):].replace("--", "/")
    return path.name


def save_release(model: HFCausalLM, params: torch.Tensor, directory: str | Path, tokenizer=None,
                 base_name: str | None = None) -> Path:
    """Write ``params`` (flat, trainable parameters in ``get_flat_params`` order) as a Hugging
    Face model directory ``directory`` (``save_pretrained``, safetensors), LoRA adapters merged
    into the base weights, with ``tokenizer`` (an :class:`~fedpriv.text.hf_tokenizer.HFTokenizer`)
    beside it. With adapters, ``directory/adapter`` also holds them alone in peft's format
    (``adapter_config.json`` with ``task_type`` ``CAUSAL_LM`` and ``base_name`` as the base,
    :func:`base_model_name`; ``adapter_model.safetensors``), which ``peft.AutoPeftModelForCausalLM``
    loads."""
    directory = Path(directory)
    replica = copy.deepcopy(model).cpu()
    set_flat_params(replica, params.detach().cpu())
    lm = replica.lm
    adapters = getattr(lm, "peft_config", None)
    if adapters:
        _save_adapter(lm, directory / "adapter", base_name)
        lm = merge_adapters(lm)
    for p in lm.parameters():
        p.requires_grad_(True)
    lm.config.use_cache = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers' own deprecations inside save_pretrained
        lm.save_pretrained(directory, safe_serialization=True)
    if tokenizer is not None and getattr(tokenizer, "tok", None) is not None:
        tokenizer.tok.save_pretrained(directory)
    return directory


def _save_adapter(lm: nn.Module, directory: Path, base_name: str | None) -> None:
    import peft  # lazy: optional package (the hf extra)
    from safetensors.torch import save_file  # lazy: optional package (comes with the hf extra)

    directory.mkdir(parents=True, exist_ok=True)
    state = peft.get_peft_model_state_dict(lm, adapter_name="default")
    save_file({f"base_model.model.{k}": v.detach().contiguous() for k, v in state.items()},
              str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = copy.deepcopy(lm.peft_config["default"])
    config.base_model_name_or_path = base_name
    config.task_type = peft.TaskType.CAUSAL_LM  # what AutoPeftModelForCausalLM (and PeftModel) dispatch on
    config.inference_mode = True
    config.save_pretrained(str(directory))


def _share_modes(directory: Path, reference: Path) -> None:
    """Give every file under ``directory`` the mode of ``reference``, a file fedpriv wrote (0644
    masked by the process umask, :mod:`fedpriv.release.atomic`; the umask is never read or changed):
    safetensors creates its files owner-only, and a release is for sharing. Directories keep the
    mode ``mkdir`` gave them (0777 masked by the umask)."""
    mode = stat.S_IMODE(reference.stat().st_mode)
    for item in directory.rglob("*"):
        if item.is_file() and not item.is_symlink():
            os.chmod(item, mode)


_MODEL_CARD = """# Released by fedpriv

Fine-tuned from `{base}` with federated learning under differential privacy. The run printed:

```
{card}
```

The epsilon covers these weights (post-processing of the released model); the run's config and
privacy ledger are `../config.yaml` and `../privacy.json`. A model from a run in research mode is
reproducible from its seed and config and must not be released.
"""


# --- config option (fedpriv/schema registers it with Hydra) -------------------------------------


@dataclass
class HFModel(ModelOption):
    """A local Hugging Face causal LM (``model.path``: a directory with config and weights, never
    downloaded), fine-tuned fully (``lora_rank=0``) or through LoRA adapters of rank ``lora_rank``
    on ``lora_targets`` (null: the family's attention and MLP projections)."""

    model_class: ClassVar[type] = HFCausalLM
    tokenizer: ClassVar[Optional[str]] = "hf"  # its token ids are the model's own tokenizer's
    vmappable: ClassVar[bool] = False
    name: str = "hf"
    path: Optional[str] = field(default=None, metadata=LOCATION)  # local model directory (never downloaded)
    lora_rank: int = 0  # 0: every weight trains; R > 0: LoRA adapters of rank R only
    lora_targets: Optional[list[str]] = None  # module names (e.g. [q_proj,v_proj]); null: the family's default
    lora_alpha: Optional[float] = None  # LoRA scale alpha / rank; null: alpha = rank

    def check(self, path: str) -> None:
        if self.path is not None and not (Path(self.path) / "config.json").is_file():
            raise ConfigError(f"{path}.path must be a local directory holding a Hugging Face causal LM "
                              f"(config.json and weights; nothing is downloaded), got {self.path!r}")
        nonnegative(self, "lora_rank", path=path)
        positive(self, "lora_alpha", path=path)
        if self.lora_rank == 0 and (self.lora_targets is not None or self.lora_alpha is not None):
            raise ConfigError(f"{path}.lora_targets and {path}.lora_alpha apply to LoRA only: set {path}.lora_rank")

    def check_selected(self, path: str) -> None:
        if not self.path:
            raise ConfigError(f"{path}.path is required: a local directory holding a Hugging Face causal LM "
                              "(config.json and weights; nothing is downloaded)")

    def per_sample_alternative(self) -> str:
        if self.lora_rank > 0:
            return ""
        return (", or LoRA adapters with any algorithm (model.lora_rank=R, and model.lora_targets=[...] where the "
                "family has no default), which freeze every base layer")

    def build_model(self, vocab_size: int, pad_id: int, seq_len: int) -> HFCausalLM:
        return HFCausalLM.load(self.path, vocab_size, pad_id, self.lora_rank, self.lora_targets, self.lora_alpha)

    def example_overrides(self, directory) -> list[str]:
        """A random-init two-layer Llama and its word tokenizer for the smoke run's words, written
        under ``directory`` (:mod:`fedpriv.models.tiny_hf`)."""
        words = tuple(f"w{i}" for i in range(1, 301))  # the synthetic datasets' words
        out = write_model_dir(Path(directory) / "hf_llama", words, "llama", hidden=32, layers=2, heads=4)
        return [f"model.path={out}", "data.tokenizer=hf"]

    def release_name(self) -> str:
        return RELEASE_DIR

    def write_release(self, model, params, run_path, data, card: str = "") -> str:
        """``run_path/hf_model``: :func:`save_release` into a temporary directory, with a model card
        (``README.md``: the run's privacy claim and randomness mode), then swapped in."""
        final = Path(run_path) / RELEASE_DIR
        tmp = Path(run_path) / f".{RELEASE_DIR}.tmp"
        old = Path(run_path) / f".{RELEASE_DIR}.old"
        for stale in (tmp, old):
            shutil.rmtree(stale, ignore_errors=True)
        try:
            base = base_model_name(self.path)
            save_release(model, params, tmp, getattr(data, "tokenizer", None), base_name=base)
            write_atomic(tmp / "README.md", _MODEL_CARD.format(base=base, card=card).encode())
            _share_modes(tmp, tmp / "README.md")
        except OSError as err:
            raise OutputError(f"could not write the released model to {final}: {err}") from None
        finally:
            if not (tmp / "config.json").exists() or not (tmp / "model.safetensors").exists():
                shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written is left
        if final.exists():
            final.rename(old)
        tmp.rename(final)
        fsync_directory(Path(run_path))
        shutil.rmtree(old, ignore_errors=True)
        return RELEASE_DIR


register_option("model", "hf", HFModel())


def describe(model: HFCausalLM) -> dict:
    """What the run trains (for summary.json): the family, trainable and total parameter counts."""
    total = sum(p.numel() for p in model.lm.parameters())
    trainable = sum(p.numel() for p in model.lm.parameters() if p.requires_grad)
    return {"model_type": getattr(model.lm.config, "model_type", None), "trainable_parameters": trainable,
            "total_parameters": total}


__all__ = ["HFCausalLM", "HFModel", "base_model_name", "describe", "save_release"]
