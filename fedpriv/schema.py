"""The typed run configuration: one dataclass per config section, and one per option of the
groups that choose between implementations (data, model, algorithm, mechanism, optimizer,
backend), holding the only copy of every default and the checks of its own fields. The sections
(client, public, privacy, the top level) and the backends live here; every other option's
dataclass lives next to its implementation, which registers it (:func:`register_option`), and
public stages may register sections of their own (:func:`register_section`).

All are registered with Hydra's ConfigStore (:func:`register`): the options of a group *are*
ConfigStore entries, so YAML under configs/ keeps only experiments and the defaults list. :func:`parse` turns a composed config (a plain dict) into a :class:`RunConfig`, refusing

* an unknown or misspelt key, naming it and the closest valid key;
* a value of the wrong type — strictly: ``3.0`` is not an int, ``"no"`` is not a bool, ``"abc"``
  is not a number (nothing is coerced, so a typo never turns into a truthy value);
* a value out of its range, and combinations no run supports;

each as one :class:`~fedpriv.errors.ConfigError` line (exit 2 on the CLI), before anything is
written. A composed config already holds every key, so the dict the run computes with is exactly
what Hydra composed (its research key, a hash of the config, is what reproducibility rests on);
a partial dict given to ``fedpriv.config.validate`` is completed with the defaults first.
"""

from __future__ import annotations

import abc
import dataclasses
import difflib
import inspect
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional, Union

from fedpriv.errors import ConfigError


# --- field checks ---------------------------------------------------------------------------------

def _key(path: str, name: str) -> str:
    """The dotted key of field ``name`` of the section at ``path`` ("" for the top level)."""
    return f"{path}.{name}" if path else name


def _fail(path: str, message: str, value: Any) -> typing.NoReturn:
    raise ConfigError(f"{path} must be {message}, got {value!r}")


def positive(section: Any, *names: str, path: str) -> None:
    """Each named field is finite and > 0 (``None`` allowed where the type is Optional)."""
    for name in names:
        value = getattr(section, name)
        if value is not None and not (value > 0 and math.isfinite(value)):
            _fail(_key(path, name), "> 0" if math.isfinite(value) else "finite", value)


def nonnegative(section: Any, *names: str, path: str) -> None:
    """Each named field is finite and >= 0 (``None`` allowed where the type is Optional)."""
    for name in names:
        value = getattr(section, name)
        if value is not None and not (value >= 0 and math.isfinite(value)):
            _fail(_key(path, name), ">= 0" if math.isfinite(value) else "finite", value)


def in_unit_interval(section: Any, name: str, path: str, closed_right: bool = True, open_left: bool = True) -> None:
    value = getattr(section, name)
    ok = (value > 0 if open_left else value >= 0) and (value <= 1 if closed_right else value < 1)
    if not ok:
        _fail(_key(path, name), f"in {'(' if open_left else '['}0, 1{']' if closed_right else ')'}", value)


def divisible(section: Any, name: str, by: str, path: str) -> None:
    """Field ``name`` is a multiple of field ``by`` (attention heads split the model width)."""
    if getattr(section, name) % getattr(section, by):
        raise ConfigError(f"{path}.{name} ({getattr(section, name)}) must be divisible by {path}.{by} "
                          f"({getattr(section, by)})")


# --- field roles in the research key --------------------------------------------------------------

# ``field(metadata=PRESENTATION)``: the field changes how a run is shown, driven or executed, never
# what it computes (the backend, the progress bar, an execution path that equals the reference
# one): it is left out of the research key and may change on resume.
PRESENTATION = {"presentation": True}
# ``field(metadata=LOCATION)``: the field says where an input lives; the research key covers the
# input's identity (its size and content digest, :mod:`fedpriv.content_digest`), not its path.
LOCATION = {"location": True}


# --- sections --------------------------------------------------------------------------------------

@dataclass
class Section(abc.ABC):
    """A config node: dataclass fields are its keys; ``check`` validates their values."""

    def check(self, path: str) -> None:  # noqa: B027 — most sections need no range checks
        """Range and consistency checks of this section's own fields (types are already checked)."""

    def inert_fields(self) -> tuple[str, ...]:
        """Fields whose values change nothing in this configuration (an audit that inserts no
        canaries): left out of the research key, like fields at their defaults."""
        return ()

    def implied_locations(self) -> dict[str, str]:
        """``LOCATION`` fields left unset whose input is found anyway (the vocabulary beside a data
        file): field -> the path that is read, so the research key covers that input's content."""
        return {}


@dataclass
class ExampleDP(Section):
    """``client.example``: example-level DP-SGD on each client (fedpriv/local_dp.py states the math)."""

    sampling_rate: float = 0.25  # each local step Poisson-samples each of the client's rows with this rate
    steps: int = 4  # DP-SGD steps per round
    clip_norm: float = 1.0  # per-example gradient bound
    noise_multiplier: Optional[float] = None  # set directly, or null to calibrate to target_epsilon
    target_epsilon: float = 8.0  # example-level epsilon after `rounds` rounds (client assumed in every round)
    delta: float = 1.0e-6
    denominator: float = 6.0  # fixed, public divisor of each step's noisy clipped sum
    mode: Literal["ghost", "instantiate", "mixopt"] = field(default="mixopt", metadata=PRESENTATION)

    def check(self, path: str) -> None:
        in_unit_interval(self, "sampling_rate", path)
        positive(self, "steps", "clip_norm", "target_epsilon", "denominator", path=path)
        nonnegative(self, "noise_multiplier", path=path)
        in_unit_interval(self, "delta", path, closed_right=False)


@dataclass
class Client(Section):
    """``client``: local training of each sampled user."""

    epochs: int = 1
    batch_size: int = 16
    lr: float = 1.0
    max_steps: Optional[int] = 2  # cap on local steps per round (null: full epochs)
    dp: Literal["none", "example"] = "none"  # example: local steps are example-level DP-SGD through Book-Keeping
    example: ExampleDP = field(default_factory=ExampleDP)
    # clients trained in lockstep as one vectorized computation (1: one after another)
    parallel: int = field(default=1, metadata=PRESENTATION)

    def check(self, path: str) -> None:
        positive(self, "epochs", "batch_size", "lr", "max_steps", "parallel", path=path)


@dataclass
class TeacherModel(Section):
    """``public.teacher_model``: the embedded teacher transformer (bigger than the default student)."""

    d_model: int = 128
    num_layers: int = 2
    num_heads: int = 4
    ff_dim: int = 512

    def check(self, path: str) -> None:
        positive(self, "d_model", "num_layers", "num_heads", "ff_dim", path=path)
        divisible(self, "d_model", "num_heads", path)


@dataclass
class Public(Section):
    """``public``: public data (no privacy cost), see fedpriv/public/."""

    pretrain_steps: int = 0  # >0: SGD steps on the public corpus before round 1
    pretrain_batch_size: int = 64
    pretrain_lr: float = 0.5
    pretrain_fraction: float = 1.0  # share of the public pool pre-training draws from (seeded subset)
    teacher: Literal["none", "embedded", "hf"] = "none"
    # teacher=hf: local directory with the model and tokenizer (never downloaded)
    teacher_path: Optional[str] = field(default=None, metadata=LOCATION)
    teacher_model: TeacherModel = field(default_factory=TeacherModel)
    teacher_steps: int = 500
    teacher_batch_size: int = 64
    teacher_lr: float = 0.001
    distill_k: int = 10  # top-k teacher logits kept per position
    distill_beta: float = 1.0  # loss = CE + beta * CE(teacher top-k at temperature t, student at t)
    distill_temperature: float = 1.0
    mid_training_round: Union[int, Literal["half"], None] = None  # T' (half: rounds/2; null: off)
    mid_training_fraction: float = 0.05  # share of the public pool kept by score
    mid_training_score: Literal["ratio", "sum", "private"] = "ratio"
    mid_training_steps: int = 200
    mid_training_lr: float = 0.1

    def check(self, path: str) -> None:
        nonnegative(self, "pretrain_steps", "teacher_steps", "mid_training_steps", "distill_beta", path=path)
        positive(self, "pretrain_batch_size", "pretrain_lr", "teacher_batch_size", "teacher_lr", "distill_k",
                 "distill_temperature", "mid_training_lr", path=path)
        in_unit_interval(self, "pretrain_fraction", path)
        in_unit_interval(self, "mid_training_fraction", path)


@dataclass
class AdaptiveClipping(Section):
    """``privacy.adaptive``: the clip bound's update under ``privacy.clipping=adaptive``
    (fedpriv/adaptive_clipping.py states the math; defaults from Andrew et al. 2021)."""

    target_quantile: float = 0.5  # γ: the share of users the bound should leave unclipped
    learning_rate: float = 0.2  # η_C of C_{t+1} = C_t · exp(−η_C (b̃_t − γ))
    count_noise: Optional[float] = None  # σ_b, std of the privatized count (null: expected cohort / 20)

    def check(self, path: str) -> None:
        in_unit_interval(self, "target_quantile", path, closed_right=False)
        positive(self, "learning_rate", "count_noise", path=path)


@dataclass
class Privacy(Section):
    """``privacy``: the user-level guarantee and how its randomness is drawn."""

    target_epsilon: Optional[float] = 8.0  # calibrate the noise multiplier to this epsilon after `rounds` rounds
    delta: float = 1.0e-5
    noise_multiplier: Optional[float] = None  # a fixed multiplier instead of a target (0: non-private)
    clip_norm: float = 0.5  # user-level L2 bound on each client delta (adaptive: the initial bound C_0)
    clipping: Literal["fixed", "adaptive"] = "fixed"  # adaptive: the bound follows a quantile of the norms
    adaptive: AdaptiveClipping = field(default_factory=AdaptiveClipping)
    accountant: Literal["rdp", "pld"] = "rdp"
    secure_rng: Optional[bool] = None  # true: secure mode; false: research mode; null: secure for deployments
    # research mode only. config: the key covers the run's computing config (no two runs that differ
    # share randomness); seed: the key is the seed's alone, so runs of one seed share cohorts and
    # noise whatever else differs (paired comparisons; never for release)
    research_key: Literal["config", "seed"] = "config"

    def check(self, path: str) -> None:
        if self.noise_multiplier is None:
            if self.target_epsilon is None:
                raise ConfigError(f"{path}.target_epsilon or {path}.noise_multiplier must be set")
            positive(self, "target_epsilon", path=path)
        nonnegative(self, "noise_multiplier", path=path)
        in_unit_interval(self, "delta", path, closed_right=False)
        positive(self, "clip_norm", path=path)
        if self.target_epsilon is not None and not math.isfinite(self.target_epsilon):
            _fail(_key(path, "target_epsilon"), "finite", self.target_epsilon)  # also beside a fixed sigma

    def inert_fields(self) -> tuple[str, ...]:
        return ("adaptive",) if self.clipping == "fixed" else ()  # a fixed clip reads no adaptive key


@dataclass
class Audit(Section):
    """``audit``: the empirical privacy audit of a run (fedpriv/audit/; docs/PRIVACY.md)."""

    canaries: int = 0  # M canary units with a secret inclusion coin, plus M never inserted (0: no audit)
    support: int = 4096  # coordinates of each canary's random direction (0: all of the model's)
    confidence: float = field(default=0.95, metadata=PRESENTATION)  # of the one-run lower bound

    def check(self, path: str) -> None:
        nonnegative(self, "canaries", "support", path=path)
        if self.canaries == 1:
            _fail(_key(path, "canaries"), "0 (off) or at least 2", self.canaries)
        in_unit_interval(self, "confidence", path, closed_right=False)

    def inert_fields(self) -> tuple[str, ...]:
        return () if self.canaries else tuple(f.name for f in dataclasses.fields(self))  # no audit


# --- options of the polymorphic groups --------------------------------------------------------------

@dataclass
class Option(Section):
    """An option of a config group; ``name`` selects the implementation."""

    name: str = ""


@dataclass
class ModelOption(Option):
    """Contract of a ``model`` option: ``model_class`` (an ``nn.Module`` language model:
    ``forward(tokens [B, T]) -> logits [B, T, V]``, every trainable layer one Book-Keeping knows)
    built with this option's fields by :meth:`build_model`."""

    model_class: ClassVar[type]

    def build_model(self, vocab_size: int, pad_id: int, seq_len: int):
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "name"}
        return self.model_class(vocab_size=vocab_size, pad_id=pad_id, **fields, **self.extra_model_args(seq_len))

    def extra_model_args(self, seq_len: int) -> dict:
        """Constructor arguments that come from the data, not the config (a transformer's max_len)."""
        return {}


@dataclass
class MechanismOption(Option):
    """Contract of a ``mechanism`` option: :meth:`build` makes the mechanism (a
    :class:`fedpriv.mechanisms.base.NoiseMechanism`); ``default_sampling`` is what ``sampling=auto``
    picks for it."""

    default_sampling: ClassVar[str]
    accounting_fields: ClassVar[tuple[str, ...]] = ()  # fields its DpEvent depends on: a calculator must be told

    @abc.abstractmethod
    def build(self, noise_multiplier: float, clip_norm: float, noise=None, rounds: int | None = None,
              sampler=None):
        """The mechanism with multiplier σ and clip C, drawing from ``noise`` (None: accounting
        only), sized for ``rounds`` and (where it optimises for one) the ``sampler``'s pattern."""

    def sampling_groups(self) -> int | None:
        """The groups of ``sampling=cyclic_poisson`` (BandMF: its bands)."""
        return None


@dataclass
class OptimizerOption(Option):
    """Contract of an ``optimizer`` option: :meth:`build` makes the server optimizer (a
    :class:`fedpriv.optim.base.ServerOptimizerBase`)."""

    @abc.abstractmethod
    def build(self, rounds: int | None = None):
        """The optimizer for a run of ``rounds`` rounds (a schedule may need them)."""


@dataclass
class AlgorithmOption(Option):
    """Contract of an ``algorithm`` option: ``algorithm_class`` (a :class:`fedpriv.algorithms.Algorithm`)
    built from the option by :meth:`build`."""

    algorithm_class: ClassVar[type]
    central: ClassVar[bool] = False  # pooled data, no clients: in-process only
    local_training: ClassVar[bool] = False  # clients run local steps (client.dp=example applies to them)

    def build(self, client: "Client"):
        """The algorithm this option selects, given the client section (``client.dp``)."""
        return self.algorithm_class(self)


@dataclass
class BackendOption(Option):
    """A ``backend`` option: how rounds reach clients (server/ implements each; no DP here)."""


@dataclass
class TextPipeline(Option):
    """Contract of a ``data`` option: :meth:`load_words` reads the users' sentences; the keys every
    dataset shares (the public corpus and the tokenizer, fedpriv/data/text_pipeline.py) are here."""

    seq_len: int = 20
    seed: int = 0
    public_source: Literal["embedded", "c4", "text", "none"] = "none"
    # c4: local c4-*.json.gz shard(s), a directory or glob; text: .txt/.jsonl/.json(.gz)
    public_path: Optional[str] = field(default=None, metadata=LOCATION)
    public_max_sentences: int = 20000
    public_text_field: str = "text"  # JSON field holding the text (text source)
    tokenizer: Literal["word", "sentencepiece", "hf"] = "word"  # sentencepiece: trained on the public corpus only
    # tokenizer=hf: its directory (default: the teacher's)
    tokenizer_path: Optional[str] = field(default="${public.teacher_path}", metadata=LOCATION)
    sp_vocab_size: int = 2000
    sp_model_type: Literal["bpe", "unigram"] = "bpe"
    sp_seq_len: Optional[int] = None  # subword tokens per row (null: 2 x seq_len)

    def check(self, path: str) -> None:
        positive(self, "seq_len", "public_max_sentences", "sp_vocab_size", "sp_seq_len", path=path)
        nonnegative(self, "seed", path=path)

    def example_overrides(self, directory) -> list[str]:
        """Config overrides of a tiny runnable instance of this dataset, writing any input file it
        needs under ``directory`` (the contract tests, tests/test_plugins.py, run a round of it)."""
        return []

    @abc.abstractmethod
    def load_words(self):
        """The dataset as a :class:`fedpriv.data.federated.FederatedDataset` of word ids (users'
        training sentences, a test split, the public corpus where the option has one)."""


@dataclass
class LocalBackend(BackendOption):
    name: str = "local"


@dataclass
class FlowerBackend(BackendOption):
    """Flower's simulation engine (Ray)."""

    name: str = "flower"
    num_supernodes: int = 2
    client_cpus: float = 1
    client_gpus: float = 0  # GPUs per worker (Ray's num_gpus; a fraction shares one): each runs on device=auto
    num_cpus: int = 2
    round_timeout: Optional[float] = None

    def check(self, path: str) -> None:
        positive(self, "num_supernodes", "client_cpus", "num_cpus", "round_timeout", path=path)
        nonnegative(self, "client_gpus", path=path)


@dataclass
class DeploymentBackend(BackendOption):
    """A real Flower deployment (``flwr run`` against a SuperLink)."""

    name: str = "deployment"
    num_supernodes: int = 2  # wait for this many nodes before round 1
    node_wait_timeout: float = 120  # seconds to wait for them (then start with those connected, at least one)
    round_timeout: float = 60  # seconds a round waits for replies; late or lost replies count as dropped
    skip_rounds: int = 10  # a node that missed a round's deadline gets no users for this many rounds

    def check(self, path: str) -> None:
        positive(self, "num_supernodes", "node_wait_timeout", "round_timeout", path=path)
        nonnegative(self, "skip_rounds", path=path)


def secure_mode(secure_rng: bool | None, backend: str | None) -> bool:
    """``privacy.secure_rng``, where null means: secure for deployments, research otherwise."""
    return backend == "deployment" if secure_rng is None else secure_rng


# group -> option name -> its defaults (the ConfigStore entries). The options register themselves
# from the modules that implement them (register_option); options() imports those modules.
OPTIONS: dict[str, dict[str, Option]] = {}
PLUGINS = {"data": "fedpriv.data", "model": "fedpriv.models", "algorithm": "fedpriv.algorithms",
           "mechanism": "fedpriv.mechanisms", "optimizer": "fedpriv.optim"}
GROUPS = ("data", "model", "algorithm", "mechanism", "optimizer", "backend")
# the default option of each group (config.yaml's defaults list names the same)
DEFAULT_OPTIONS = {"data": "synthetic", "model": "lstm", "algorithm": "dp_fedavg", "mechanism": "gaussian",
                   "optimizer": "momentum", "backend": "local"}


# group -> the contract its options meet (register_option checks it)
GROUP_BASES: dict[str, type[Option]] = {"data": TextPipeline, "model": ModelOption, "algorithm": AlgorithmOption,
                                        "mechanism": MechanismOption, "optimizer": OptimizerOption,
                                        "backend": BackendOption}
_CLASS_ATTRIBUTES = {"model": ("model_class",), "algorithm": ("algorithm_class",), "mechanism": ("default_sampling",)}


def register_option(group: str, name: str, option: Option) -> None:
    """Make ``option`` (its dataclass and defaults) selectable as ``group=name``: called by the
    module implementing it, so adding an option touches no list elsewhere. The option must meet its
    group's contract (:data:`GROUP_BASES`): an instance of the group's base, every abstract method
    implemented, every class attribute the run reads defined (``TypeError`` otherwise)."""
    if group not in GROUP_BASES:
        raise TypeError(f"unknown option group {group!r} (one of: {', '.join(GROUP_BASES)})")
    base = GROUP_BASES[group]
    cls = type(option)
    if not (dataclasses.is_dataclass(option) and isinstance(option, base)):
        raise TypeError(f"{group} option {name!r} must be a dataclass instance of {base.__module__}.{base.__name__}")
    missing = sorted(getattr(cls, "__abstractmethods__", ())) + [
        attr for attr in _CLASS_ATTRIBUTES.get(group, ()) if not hasattr(cls, attr)]
    if missing or inspect.isabstract(cls):
        raise TypeError(f"{group} option {name!r} ({cls.__name__}) does not implement: {', '.join(missing)}")
    if not isinstance(option.name, str) or not option.name:
        raise TypeError(f"{group} option {name!r} has no name")
    OPTIONS.setdefault(group, {})[name] = option


for _backend in (LocalBackend(), FlowerBackend(), DeploymentBackend()):
    register_option("backend", _backend.name, _backend)


def options(group: str) -> dict[str, Option]:
    """The options of ``group`` (importing the package whose modules register them)."""
    if group in PLUGINS:
        import importlib

        importlib.import_module(PLUGINS[group])
    return OPTIONS.get(group, {})


# parent section class -> key -> the section class another module registered under it
SECTIONS: dict[type, dict[str, type]] = {}
SECTION_PLUGINS = ("fedpriv.public",)  # packages whose modules register sections (public stages)


def register_section(parent: type, key: str, section: type) -> None:
    """Add the section ``section`` (a dataclass with defaults) under ``parent`` as ``key``: a
    public stage's settings live in ``public.<key>`` without an edit of this file."""
    SECTIONS.setdefault(parent, {})[key] = section


def _import_section_plugins() -> None:
    import importlib
    import sys

    for name in SECTION_PLUGINS:
        if name not in sys.modules:
            importlib.import_module(name)


def _default(group: str):
    return lambda: dataclasses.replace(options(group)[DEFAULT_OPTIONS[group]])


def option_preset(group: str, name: Any) -> Option | None:
    """The registered defaults of option ``name`` (``optimizer=dpadagrad_bc`` has lr 0.1, not the
    class's 0.01): the preset registered under that name, else the first whose ``name`` it is."""
    found = options(group)
    if name in found and found[name].name == name:
        return found[name]
    return next((o for o in found.values() if o.name == name), None)


def option_class(group: str, name: Any, path: str) -> type[Option]:
    """The dataclass of the option whose ``name`` is ``name`` (several presets may share one)."""
    classes = {opt.name: type(opt) for opt in options(group).values()}
    if name not in classes:
        raise ConfigError(f"unknown {path}.name {name!r} (choose one of: {', '.join(sorted(classes))})")
    return classes[name]


@dataclass
class RunConfig(Section):
    """The whole run. Top-level keys, the fixed sections, and one option per group."""

    seed: int = 0
    # where tensors live (auto: cuda when available)
    device: Literal["auto", "cpu", "cuda"] = field(default="auto", metadata=PRESENTATION)
    rounds: int = 220
    cohort_size: int = 150
    sampling: str = "auto"  # auto: the mechanism's default_sampling; else a registered sampler (fedpriv/sampling.py)
    # public population size N fixing the Poisson rates q = cohort_size / N (add/remove-one holds);
    # null: q from the dataset's count, accounted under zero-out (docs/PRIVACY.md, "The population")
    population: Optional[int] = None
    ema_decay: float = 0.95  # >0: release/evaluate the EMA of the server iterates (post-processing); 0: off
    # evaluate on the test set every k rounds (and after the last); null: last only
    eval_every: Optional[int] = field(default=20, metadata=PRESENTATION)
    resume: bool = field(default=False, metadata=PRESENTATION)  # true: continue the run in run_dir
    progress: bool = field(default=True, metadata=PRESENTATION)
    verbose: bool = field(default=False, metadata=PRESENTATION)  # one structured log line per round
    # research mode only: statistics of training users (NOT covered by epsilon)
    diagnostics: bool = field(default=True, metadata=PRESENTATION)
    tensorboard: bool = field(default=False, metadata=PRESENTATION)
    run_dir: str = field(default="outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}", metadata=PRESENTATION)
    client: Client = field(default_factory=Client)
    public: Public = field(default_factory=Public)
    privacy: Privacy = field(default_factory=Privacy)
    audit: Audit = field(default_factory=Audit)
    data: TextPipeline = field(default_factory=_default("data"))
    model: ModelOption = field(default_factory=_default("model"))
    algorithm: AlgorithmOption = field(default_factory=_default("algorithm"))
    mechanism: MechanismOption = field(default_factory=_default("mechanism"))
    optimizer: OptimizerOption = field(default_factory=_default("optimizer"))
    backend: BackendOption = field(default_factory=_default("backend"), metadata=PRESENTATION)

    @property
    def secure(self) -> bool:
        return secure_mode(self.privacy.secure_rng, self.backend.name)

    def check(self, path: str = "") -> None:
        nonnegative(self, "seed", path=path)
        from fedpriv.sampling import SAMPLERS  # registered samplers (sampling imports this module)

        if self.sampling != "auto" and self.sampling not in SAMPLERS:
            raise ConfigError(f"unknown {_key(path, 'sampling')} {self.sampling!r} (choose one of: "
                              f"{', '.join(['auto', *sorted(SAMPLERS)])})")
        positive(self, "rounds", "cohort_size", "eval_every", "population", path=path)
        in_unit_interval(self, "ema_decay", path, closed_right=False, open_left=False)
        if self.algorithm.central and not isinstance(self.backend, LocalBackend):
            raise ConfigError(f"algorithm={self.algorithm.name} is central (pooled data, no clients): use backend=local")
        if self.privacy.research_key == "seed" and self.secure:
            raise ConfigError("privacy.research_key=seed shares randomness between runs: research mode only "
                              "(privacy.secure_rng=false, and not backend=deployment)")
        if self.client.dp == "example" and not self.algorithm.local_training:
            raise ConfigError(f"client.dp=example needs algorithm=dp_fedavg (local DP-SGD steps), "
                              f"not {self.algorithm.name}")


# --- parsing ---------------------------------------------------------------------------------------

# scalar annotation -> (what a value must be, the test it must pass); no coercion anywhere
_SCALARS: dict[Any, tuple[str, Any]] = {
    bool: ("true or false", lambda v: isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
            and not (isinstance(v, float) and math.isnan(v))),
    str: ("a string", lambda v: isinstance(v, str)),
}


def _type_name(tp: Any) -> str:
    if tp in _SCALARS:
        return _SCALARS[tp][0]
    if typing.get_origin(tp) is Literal:
        return "one of: " + ", ".join(str(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", str(tp))


def _value(value: Any, tp: Any, path: str) -> Any:
    """``value`` checked against the annotation ``tp`` (no coercion; dataclasses parsed)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _value(value, arg, path)
            except ConfigError as err:
                errors.append(err)
        names = [_type_name(a) for a in args if a is not type(None)] + (["null"] if type(None) in args else [])
        raise ConfigError(f"{path} must be {' or '.join(names)}, got {value!r}")
    if origin is Literal:
        if value not in typing.get_args(tp) or isinstance(value, bool):
            raise ConfigError(f"unknown {path} {value!r} (choose one of: "
                              f"{', '.join(str(a) for a in typing.get_args(tp))})")
        return value
    if tp in _SCALARS:
        what, ok = _SCALARS[tp]
        if not ok(value):
            _fail(path, what, value)
        return value
    if tp is Any:
        return value
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _section(value, tp, path)
    raise TypeError(f"schema: unsupported annotation {tp!r} at {path}")


def unknown_key(path: str, key: str, known: list[str]) -> ConfigError:
    """The error for an unknown ``key`` under ``path``, naming the closest of the ``known`` keys."""
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f" (did you mean '{_key(path, close[0])}'?)" if close else ""
    return ConfigError(f"unknown config key '{_key(path, key)}'{hint}")


def _fields(cls: type) -> tuple[list[str], dict[str, Any]]:
    """A section's keys and their annotations: its dataclass fields, then the sections other
    modules registered under it (:func:`register_section`)."""
    _import_section_plugins()
    hints = dict(typing.get_type_hints(cls))
    names = [f.name for f in dataclasses.fields(cls)]
    for name, sub in SECTIONS.get(cls, {}).items():
        names.append(name)
        hints[name] = sub
    return names, hints


def _section(data: Any, cls: type, path: str, base: Any = None) -> Any:
    """``data`` parsed as section ``cls``; missing keys take ``base``'s values (a group option's
    registered preset) or the class defaults."""
    if not isinstance(data, dict):
        _fail(path or "the config", "a mapping", data)
    names, hints = _fields(cls)
    for key in data:
        if key not in names:
            raise unknown_key(path, str(key), names)
    kwargs, extra = {}, {}
    own = {f.name for f in dataclasses.fields(cls)}
    for name in names:
        sub = _key(path, name)
        if name not in data:
            if name not in own:
                extra[name] = hints[name]()  # a registered section's defaults
            continue  # its default
        tp = hints[name]
        if name in GROUPS and cls is RunConfig:  # a group: the option its `name` selects
            kwargs[name] = _option(name, data[name], sub)
            continue
        (kwargs if name in own else extra)[name] = _value(data[name], tp, sub)
    section = dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    for name, value in extra.items():
        setattr(section, name, value)
    section.check(path)
    return section


def _option(group: str, data: Any, path: str) -> Option:
    """The option of ``group`` that ``data["name"]`` selects, its missing keys from its preset."""
    if not isinstance(data, dict):
        _fail(path, "a mapping", data)
    name = data.get("name", DEFAULT_OPTIONS.get(group))  # a partial mapping: the group's default option
    return _section(dict(data), option_class(group, name, path), path, option_preset(group, name))


def parse(plain: dict) -> RunConfig:
    """The typed, validated view of a composed config (``ConfigError`` on the first problem)."""
    return _section(plain, RunConfig, "")


def as_dict(section: Any) -> Any:
    """The plain-dict form of a section (what Hydra composes and the run computes with),
    registered sections included (with their defaults where the instance has none)."""
    if not (dataclasses.is_dataclass(section) and not isinstance(section, type)):
        return section
    out = {f.name: as_dict(getattr(section, f.name)) for f in dataclasses.fields(section)}
    for name, sub in SECTIONS.get(type(section), {}).items():
        out[name] = as_dict(getattr(section, name, None) or sub())
    return out


def register() -> None:
    """Register every group option, and the top-level defaults as ``fedpriv_defaults``, with
    Hydra's ConfigStore (plain-dict nodes: types are checked by :func:`parse`, with fedpriv's
    messages). Idempotent."""
    from hydra.core.config_store import ConfigStore

    _import_section_plugins()
    store = ConfigStore.instance()
    top = {k: v for k, v in as_dict(RunConfig()).items() if k not in GROUPS}
    store.store(name="fedpriv_defaults", node=top)
    for group in GROUPS:
        for name, option in options(group).items():
            store.store(group=group, name=name, node=as_dict(option))


def known_keys(path: str) -> list[str] | None:
    """The valid keys under the node at dotted ``path`` ("" for the top level; for a group, those
    of any of its options), or None when ``path`` names no section."""
    cls: Any = RunConfig
    classes = [cls]
    for part in [p for p in path.split(".") if p]:
        nxt = []
        for c in classes:
            if c is RunConfig and part in GROUPS:
                nxt += list({type(o) for o in options(part).values()})
                continue
            tp = _fields(c)[1].get(part)
            if isinstance(tp, type) and dataclasses.is_dataclass(tp):
                nxt.append(tp)
        if not nxt:
            return None
        classes = nxt
    return sorted({name for c in classes for name in _fields(c)[0]})


def load(kind: type[Section] | str, data: Any, path: str = "") -> Any:
    """One section from a plain mapping, checked and with its defaults: ``kind`` is a section
    class (``load(Public, cfg["public"], "public")``) or a group name, whose option the mapping's
    ``name`` selects (``load("mechanism", {"name": "tree"})``)."""
    if isinstance(kind, str):
        return _option(kind, data, path or kind)
    return _section(dict(data) if data is not None else {}, kind, path)
