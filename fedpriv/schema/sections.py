"""The config sections: one dataclass per fixed section (client, public, privacy, audit), the base
of every section, and the contract of each option group (its base class: what an option must
implement to be registered). The fields hold the only copy of every default."""

from __future__ import annotations

import abc
import dataclasses
import functools
import inspect
import io
import math
import re
import textwrap
import tokenize
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Optional, Union

from fedpriv.errors import ConfigError
from fedpriv.schema.checks import (LOCATION, PRESENTATION, _fail, _key, divisible, in_unit_interval, nonnegative,
                                   positive)


# --- what each key means ---------------------------------------------------------------------------

def meanings(section: type) -> dict[str, str]:
    """Field name -> its one-line meaning: the comment beside the field in its class's source, or
    the comment lines right above it (the one copy; ``python -m fedpriv.simulate --help`` shows it).
    A subclass's comment wins over its base's; a class whose fields mirror another's names it as
    ``meanings_from`` (``data.synthetic``: the generator's); a field without a comment is absent."""
    found: dict[str, str] = {}
    for cls in reversed([c for c in section.__mro__ if dataclasses.is_dataclass(c)]):
        if "meanings_from" in cls.__dict__:
            found.update(_own_meanings(cls.__dict__["meanings_from"]))
        found.update(_own_meanings(cls))
    return {name: text for name, text in found.items() if name in {f.name for f in dataclasses.fields(section)}}


@functools.lru_cache(maxsize=None)
def _own_meanings(cls: type) -> dict[str, str]:
    """The meanings of the fields ``cls`` itself declares (see :func:`meanings`)."""
    try:
        lines = textwrap.dedent(inspect.getsource(cls)).splitlines()
    except (OSError, TypeError):  # defined where no source is kept (an interactive session)
        return {}
    comments = {tok.start[0] - 1: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline)
                if tok.type == tokenize.COMMENT and not tok.string.lstrip("#").strip().startswith("noqa")}
    own = {f.name for f in dataclasses.fields(cls)} & set(getattr(cls, "__annotations__", {}))
    found: dict[str, str] = {}
    for i, line in enumerate(lines):
        match = re.match(r"\s+(\w+)\s*:", line)
        if not match or match.group(1) not in own or line.strip().startswith("#"):
            continue
        above, j = [], i - 1
        while j >= 0 and lines[j].strip().startswith("#") and j in comments:
            above.insert(0, comments[j])
            j -= 1
        text = comments.get(i) or " ".join(above)
        if text:
            found[match.group(1)] = text
    return found


# --- sections --------------------------------------------------------------------------------------

@dataclass
class Section(abc.ABC):  # noqa: B024 — abstract so that group bases can declare abstract methods
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
    """``client.example``: example-level DP-SGD on each client (fedpriv/round/local_dp.py states the math)."""

    sampling_rate: float = 0.25  # each local step Poisson-samples each of the client's rows with this rate
    steps: int = 4  # DP-SGD steps per round
    clip_norm: float = 1.0  # per-example gradient bound
    noise_multiplier: Optional[float] = None  # set directly, or null to calibrate to target_epsilon
    target_epsilon: float = 8.0  # example-level epsilon after `rounds` rounds (client assumed in every round)
    delta: float = 1.0e-6  # example-level delta
    denominator: float = 6.0  # fixed, public divisor of each step's noisy clipped sum
    # how Book-Keeping gets per-example norms: ghost norms, per-example gradients, or per layer the cheaper
    mode: Literal["ghost", "instantiate", "mixopt"] = field(default="mixopt", metadata=PRESENTATION)

    def check(self, path: str) -> None:
        in_unit_interval(self, "sampling_rate", path)
        positive(self, "steps", "clip_norm", "target_epsilon", "denominator", path=path)
        nonnegative(self, "noise_multiplier", path=path)
        in_unit_interval(self, "delta", path, closed_right=False)


@dataclass
class Client(Section):
    """``client``: local training of each sampled user."""

    epochs: int = 1  # local passes over the client's data per round
    batch_size: int = 16  # local minibatch size
    lr: float = 1.0  # local SGD step size
    max_steps: Optional[int] = 2  # cap on local steps per round (null: full epochs)
    dp: Literal["none", "example"] = "none"  # example: local steps are example-level DP-SGD through Book-Keeping
    example: ExampleDP = field(default_factory=ExampleDP)
    # clients trained in lockstep as one vectorized computation (1: one after another); on the CPU
    # the loop runs instead unless parallel_on_cpu (measured 1.3-1.4x slower there: docs/BENCHMARKS.md)
    parallel: int = field(default=1, metadata=PRESENTATION)
    parallel_on_cpu: bool = field(default=False, metadata=PRESENTATION)  # true: client.parallel on the CPU too
    # every Book-Keeping engine of the run replays a step's forward (refusing models that mix samples) on its
    # first 4 steps and every N-th after; null: the engine's REPLAY_EVERY; 1: every step (about +25% per step)
    bk_replay_every: Optional[int] = field(default=None, metadata=PRESENTATION)
    # the arithmetic of local training on the device (fedpriv/precision.py): fp32 (IEEE, TF32 off), tf32
    # (TensorFloat-32 matmuls/cuDNN on a GPU; fp32 on a CPU) or bf16 (tf32 + bfloat16 autocast); norms,
    # clipping and noise are IEEE float32 in every mode, evaluation is fp32; not in the research key
    precision: Literal["fp32", "tf32", "bf16"] = field(default="fp32", metadata=PRESENTATION)
    # backend=local simulates dropouts: each round every sampled user (or, under mechanism=ddgauss, every
    # secure-aggregation party with its users) fails to reply with this probability, independently of the data
    dropout_rate: float = 0.0

    def check(self, path: str) -> None:
        positive(self, "epochs", "batch_size", "lr", "max_steps", "parallel", "bk_replay_every", path=path)
        in_unit_interval(self, "dropout_rate", path, closed_right=False, open_left=False)


@dataclass
class TeacherModel(Section):
    """``public.teacher_model``: the embedded teacher transformer (bigger than the default student)."""

    d_model: int = 128  # width of the embedding and residual stream
    num_layers: int = 2  # transformer blocks
    num_heads: int = 4  # attention heads (divide d_model)
    ff_dim: int = 512  # hidden width of each block's feed-forward layer

    def check(self, path: str) -> None:
        positive(self, "d_model", "num_layers", "num_heads", "ff_dim", path=path)
        divisible(self, "d_model", "num_heads", path)


@dataclass
class Public(Section):
    """``public``: public data (no privacy cost), see fedpriv/public/."""

    pretrain_steps: int = 0  # >0: SGD steps on the public corpus before round 1
    pretrain_batch_size: int = 64  # sequences per pre-training step
    pretrain_lr: float = 0.5  # pre-training SGD step size
    pretrain_fraction: float = 1.0  # share of the public pool pre-training draws from (seeded subset)
    # the distillation teacher: none, embedded (trained on the public corpus) or hf (a local Hugging Face LM)
    teacher: Literal["none", "embedded", "hf"] = "none"
    # teacher=hf: local directory with the model and tokenizer (never downloaded)
    teacher_path: Optional[str] = field(default=None, metadata=LOCATION)
    teacher_model: TeacherModel = field(default_factory=TeacherModel)
    teacher_steps: int = 500  # training steps of the embedded teacher on the public corpus
    teacher_batch_size: int = 64  # sequences per teacher training step
    teacher_lr: float = 0.001  # the embedded teacher's Adam step size
    distill_k: int = 10  # top-k teacher logits kept per position
    distill_beta: float = 1.0  # loss = CE + beta * CE(teacher top-k at temperature t, student at t)
    distill_temperature: float = 1.0  # t, the temperature of both distributions in the distillation term
    mid_training_round: Union[int, Literal["half"], None] = None  # T' (half: rounds/2; null: off)
    mid_training_fraction: float = 0.05  # share of the public pool kept by score
    # how public samples are ranked: log p_priv - log p_pub (ratio), their sum, or log p_priv alone
    mid_training_score: Literal["ratio", "sum", "private"] = "ratio"
    mid_training_steps: int = 200  # SGD steps on the kept public samples
    mid_training_lr: float = 0.1  # mid-training SGD step size

    def check(self, path: str) -> None:
        nonnegative(self, "pretrain_steps", "teacher_steps", "mid_training_steps", "distill_beta", path=path)
        positive(self, "pretrain_batch_size", "pretrain_lr", "teacher_batch_size", "teacher_lr", "distill_k",
                 "distill_temperature", "mid_training_lr", path=path)
        in_unit_interval(self, "pretrain_fraction", path)
        in_unit_interval(self, "mid_training_fraction", path)


@dataclass
class AdaptiveClipping(Section):
    """``privacy.adaptive``: the clip bound's update under ``privacy.clipping=adaptive``
    (fedpriv/round/adaptive_clipping.py states the math; defaults from Andrew et al. 2021)."""

    target_quantile: float = 0.5  # γ: the share of users the bound should leave unclipped
    learning_rate: float = 0.2  # η_C of C_{t+1} = C_t · exp(−η_C (b̃_t − γ))
    # σ_b, std of the privatized count (null: max(expected cohort / 20, σ·√10/2): the count then
    # takes at most a tenth of the query's precision; fedpriv/adaptive_clipping.default_count_noise)
    count_noise: Optional[float] = None
    # normalized: the step is privacy.clip_norm x (sum of clipped updates / C_t + noise) / D, so a growing
    # bound cannot grow the noise on the model; bound: the step scales with C_t (Andrew et al.)
    step: Literal["normalized", "bound"] = "normalized"
    initial_bound: Optional[float] = None  # C_0, the first round's bound (null: privacy.clip_norm)

    def check(self, path: str) -> None:
        in_unit_interval(self, "target_quantile", path, closed_right=False)
        positive(self, "learning_rate", "count_noise", "initial_bound", path=path)


def missing_path_message(source: str) -> str:
    """The error for ``data.public_source=source`` (c4 or text) without ``data.public_path``."""
    if source == "c4":
        return ("data.public_source=c4 needs data.public_path: fedpriv never downloads C4; download shards of "
                "allenai/c4 realnewslike from Hugging Face (e.g. realnewslike/c4-train.00000-of-00512.json.gz) "
                "and pass data.public_path=FILE|DIR|GLOB")
    return "data.public_source=text needs data.public_path (a .txt, .jsonl or .json file, directory or glob)"


@dataclass
class MonteCarloAccounting(Section):
    """``privacy.mc``: the Monte-Carlo accountant (``privacy.accountant=mc``; balls-in-bins sampling),
    fedpriv/accounting/monte_carlo.py. Its samples are public: they only decide how tight the claim is."""

    samples: Optional[int] = None  # per direction of the dominating pair; null: 50 / delta
    confidence: float = 0.999  # probability, over the accountant's samples, that the claimed epsilon holds
    seed: int = 0  # public seed of the accountant's samples; seed k is charged 6/(pi^2 (k+1)^2) of 1 - confidence

    def check(self, path: str) -> None:
        in_unit_interval(self, "confidence", path, closed_right=False)
        nonnegative(self, "seed", path=path)
        if self.samples is not None and self.samples < 100:
            _fail(_key(path, "samples"), "null (50/delta) or at least 100", self.samples)


@dataclass
class Privacy(Section):
    """``privacy``: the user-level guarantee and how its randomness is drawn."""

    target_epsilon: Optional[float] = 8.0  # calibrate the noise multiplier to this epsilon after `rounds` rounds
    delta: float = 1.0e-5  # the delta of the user-level (epsilon, delta) guarantee
    noise_multiplier: Optional[float] = None  # a fixed multiplier instead of a target (0: non-private)
    clip_norm: float = 0.5  # user-level L2 bound on each client delta (adaptive: the initial bound C_0)
    clipping: Literal["fixed", "adaptive"] = "fixed"  # adaptive: the bound follows a quantile of the norms
    adaptive: AdaptiveClipping = field(default_factory=AdaptiveClipping)
    accountant: Literal["rdp", "pld", "mc"] = "rdp"  # mc: Monte Carlo, for sampling=balls_in_bins
    mc: MonteCarloAccounting = field(default_factory=MonteCarloAccounting)
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
        inert = ("adaptive",) if self.clipping == "fixed" else ()  # a fixed clip reads no adaptive key
        return inert + (("mc",) if self.accountant != "mc" else ())  # only the mc accountant reads mc


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
    tokenizer: ClassVar[Optional[str]] = None  # the data.tokenizer its token ids must come from (None: any)
    vmappable: ClassVar[bool] = True  # client.parallel > 1 (fedpriv.models.vmappable) can run it

    def build_model(self, vocab_size: int, pad_id: int, seq_len: int):
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "name"}
        return self.model_class(vocab_size=vocab_size, pad_id=pad_id, **fields, **self.extra_model_args(seq_len))

    def extra_model_args(self, seq_len: int) -> dict:
        """Constructor arguments that come from the data, not the config (a transformer's max_len)."""
        return {}

    def check_selected(self, path: str) -> None:
        """Checks of a run that selects this option (an input it cannot build without; its preset
        itself passes :meth:`check`)."""

    def per_sample_alternative(self) -> str:
        """What else this option offers when per-sample clipping refuses the model it built (text
        that follows a list of alternatives in the refusal, e.g. ", or ..."); "" for nothing."""
        return ""

    def example_overrides(self, directory) -> list[str]:
        """Config overrides of a tiny runnable instance of this model, writing any input it needs
        (a model directory) under ``directory`` (the contract tests, tests/test_plugins.py)."""
        return []

    def release_name(self) -> Optional[str]:
        """The name :meth:`write_release` writes under the run directory, or None (it writes none)."""
        return None

    def write_release(self, model, params, run_path, data, card: str = "") -> Optional[str]:
        """Write the released flat ``params`` of ``model`` (built by :meth:`build_model`) in the
        format its ecosystem loads, under the run directory ``run_path``, all or nothing; the name
        written (:meth:`release_name`, which the run plan lists), or None (the default: the
        parameters are in the checkpoint and nowhere else).
        ``data``: the run's dataset (its tokenizer); ``card``: the run's result lines (its privacy
        claim and randomness mode), which the release must carry. Post-processing only."""
        return None


@dataclass
class MechanismOption(Option):
    """Contract of a ``mechanism`` option: :meth:`build` makes the mechanism (a
    :class:`fedpriv.mechanisms.base.NoiseMechanism`); ``default_sampling`` is what ``sampling=auto``
    picks for it. A mechanism states who adds its noise (``client_noise``) and reads neither the
    backend nor the ``aggregation``: the sum protocol (fedpriv/sums/) checks and plans the rest."""

    default_sampling: ClassVar[str]
    accounting_fields: ClassVar[tuple[str, ...]] = ()  # fields its DpEvent depends on: a calculator must be told
    # the parties add the noise inside a secure sum (the server adds none); such an option has the fields
    # `shares` (its parties; null: the sum protocol's, fedpriv/sums/) and `min_shares`
    client_noise: ClassVar[bool] = False

    @abc.abstractmethod
    def build(self, noise_multiplier: float, clip_norm: float, noise=None, rounds: int | None = None,
              sampler=None, dimension: int | None = None):
        """The mechanism with multiplier σ and clip C, drawing from ``noise`` (None: accounting
        only), sized for ``rounds``, (where it optimises for one) the ``sampler``'s pattern and
        (where its noise is sized by it) the model's ``dimension``, the trained parameters."""

    def check_run(self, spec) -> None:  # noqa: B027 — most mechanisms serve every run their sampler allows
        """Refuse (``ConfigError``) a run configuration (``spec``, the whole ``RunConfig``) this
        mechanism cannot serve, beyond its sampler (checked by its accounting)."""

    def sampling_groups(self) -> int | None:
        """The groups of ``sampling=cyclic_poisson`` (BandMF: its bands)."""
        return None

    def fitted(self, population: int, cohort_size: int, rounds: int, sampling: str) -> "MechanismOption":
        """This option with any default that cannot fit the run (``rounds`` rounds of cohorts of
        ``cohort_size`` from ``population`` units under ``sampling``) replaced by the largest value
        that fits; ``self`` when nothing changes. A value that differs from the default is left as
        given (and refused where it is checked, naming the largest that fits)."""
        return self


@dataclass
class OptimizerOption(Option):
    """Contract of an ``optimizer`` option: :meth:`build` makes the server optimizer (a
    :class:`fedpriv.optim.base.ServerOptimizerBase`)."""

    @abc.abstractmethod
    def build(self, rounds: int | None = None):
        """The optimizer for a run of ``rounds`` rounds (a schedule may need them)."""


@dataclass
class AlgorithmOption(Option):
    """Contract of an ``algorithm`` option: ``algorithm_class`` (a :class:`fedpriv.round.algorithms.Algorithm`)
    built from the option by :meth:`build`."""

    algorithm_class: ClassVar[type]
    central: ClassVar[bool] = False  # pooled data, no clients: in-process only
    local_training: ClassVar[bool] = False  # clients run local steps (client.dp=example applies to them)

    def build(self, client: "Client"):
        """The algorithm this option selects, given the client section (``client.dp``)."""
        return self.algorithm_class(self)


@dataclass
class PlanOption(Option):
    """Contract of a ``plan`` option: :meth:`apply` turns the parsed config into the config the run
    executes, from public quantities only — ``population`` (the public number of units, None where
    the run has none: the data's count is not public under add/remove-one) and ``dimension`` (the
    trained parameters) and ``public_pool`` (the sentences of the run's public corpus, None where it
    has none) — and says what it chose (None: nothing). Deterministic and idempotent: the config it
    returns, applied again, is returned unchanged (a resumed run and a deployment's clients apply it
    again)."""

    @abc.abstractmethod
    def apply(self, spec, population: Optional[int], dimension: int,
              public_pool: Optional[int] = None) -> tuple[Any, Optional[dict]]:
        """``(the executed RunConfig, the choice as plain values or None)``; ``ConfigError`` where it
        cannot plan."""


@dataclass
class FixedPlan(PlanOption):
    """The config as given (the default)."""

    name: str = "fixed"

    def apply(self, spec, population: Optional[int], dimension: int,
              public_pool: Optional[int] = None) -> tuple[Any, Optional[dict]]:
        return spec, None


@dataclass
class SumOption(Option):
    """Contract of an ``aggregation`` option: a sum protocol (fedpriv/sums/: how a round's clipped
    updates reach the server, and who may add the noise). It declares what the server ``sees`` and
    who may add the noise (``noise_by``: ``server``, ``parties``: the mechanism's ``client_noise``),
    refuses at parse time a run it cannot serve (:meth:`check_run`) and plans the run's frozen
    :class:`fedpriv.sums.SumPlan` (:meth:`plan`) that the server and every node read."""

    sees: ClassVar[str]  # what the server sees of a round
    noise_by: ClassVar[tuple[str, ...]]  # who may add the noise under it: "server", "parties"

    @abc.abstractmethod
    def check_run(self, spec) -> None:
        """Refuse (``ConfigError``) a run configuration (``spec``, the whole ``RunConfig``) this
        protocol cannot serve: its backend, its mechanism's noise placement, what else of the run
        needs a user's update at the server."""

    @abc.abstractmethod
    def plan(self, spec, mechanism, dimension: int, expected_cohort: float):
        """The run's :class:`fedpriv.sums.SumPlan` for the checked ``spec``, its key-less
        ``mechanism`` at its σ, the model's ``dimension`` and the expected cohort (public
        quantities only; ``ValueError`` where the protocol cannot hold the run)."""

    def resolved_mechanism(self, spec) -> "MechanismOption":
        """``spec``'s mechanism option with what it leaves to the protocol taken from ``spec``
        (over SecAgg+ a distributed mechanism's parties are the nodes); idempotent."""
        return spec.mechanism


@dataclass
class BackendOption(Option):
    """A ``backend`` option: how rounds reach clients (server/ implements each; no DP here)."""

    batched_rounds: ClassVar[bool] = False  # runs an algorithm's batched round (one pass) where it has one


@dataclass
class TextPipeline(Option):
    """Contract of a ``data`` option: :meth:`load_words` reads the users' sentences; the keys every
    dataset shares (the public corpus and the tokenizer, fedpriv/data/text_pipeline.py) are here."""

    seq_len: int = 20  # tokens per training row (sentences are cut or padded to it)
    seed: int = 0  # the dataset's own seed (generation, subsets)
    # public corpus: the generator's (embedded), local C4 shards, local text files, or none
    public_source: Literal["embedded", "c4", "text", "none"] = "none"
    # c4: local c4-*.json.gz shard(s), a directory or glob; text: .txt/.jsonl/.json(.gz)
    public_path: Optional[str] = field(default=None, metadata=LOCATION)
    public_max_sentences: int = 20000  # cap on public sentences read
    public_text_field: str = "text"  # JSON field holding the text (text source)
    tokenizer: Literal["word", "sentencepiece", "hf"] = "word"  # sentencepiece: trained on the public corpus only
    # tokenizer=hf: its directory (default: the teacher's)
    tokenizer_path: Optional[str] = field(default="${public.teacher_path}", metadata=LOCATION)
    sp_vocab_size: int = 2000  # SentencePiece vocabulary size
    sp_model_type: Literal["bpe", "unigram"] = "bpe"  # SentencePiece model kind
    sp_seq_len: Optional[int] = None  # subword tokens per row (null: 2 x seq_len)

    def check(self, path: str) -> None:
        positive(self, "seq_len", "public_max_sentences", "sp_vocab_size", "sp_seq_len", path=path)
        nonnegative(self, "seed", path=path)
        if self.public_source in ("c4", "text") and not self.public_path:  # local files only, never downloaded
            raise ConfigError(missing_path_message(self.public_source))

    def example_overrides(self, directory) -> list[str]:
        """Config overrides of a tiny runnable instance of this dataset, writing any input file it
        needs under ``directory`` (the contract tests, tests/test_plugins.py, run a round of it)."""
        return []

    def public_population(self) -> Optional[int]:
        """The number of training users when the config itself fixes it (a generator's), so that it
        is public; None when only the data tells it (then ``population`` must state it)."""
        return None

    def check_run(self, spec) -> None:  # noqa: B027 — most datasets need nothing else of the run
        """Refuse (``ConfigError``) a run configuration (``spec``, the whole ``RunConfig``) that
        selects this option without an input it cannot load without (its preset itself passes
        :meth:`check`): checked when the config is parsed, before anything is written."""

    @abc.abstractmethod
    def load_words(self):
        """The dataset as a :class:`fedpriv.data.federated.FederatedDataset` of word ids, or of the
        ids of the subword tokenizer it set (``data=files``: its ``tokenizer``; users' training
        sentences, a test split, the public corpus where the option has one)."""


@dataclass
class LocalBackend(BackendOption):
    batched_rounds: ClassVar[bool] = True
    name: str = "local"


@dataclass
class FlowerBackend(BackendOption):
    """Flower's simulation engine (Ray)."""

    name: str = "flower"
    num_supernodes: int = 2  # simulated SuperNodes (the users are spread over them)
    client_cpus: float = 1  # CPUs per worker (Ray's num_cpus)
    client_gpus: float = 0  # GPUs per worker (Ray's num_gpus; a fraction shares one): each runs on device=auto
    num_cpus: int = 2  # CPUs Ray may use in all
    round_timeout: Optional[float] = None  # seconds the server waits for a round's replies (null: no limit)
    # true: Ray's and Flower's own warnings and the simulated nodes' output on stderr too (node ids, rounds,
    # tracebacks; the terminal, never the run directory); false: only their errors, the nodes' output in Ray's logs
    library_logs: bool = False

    def check(self, path: str) -> None:
        positive(self, "num_supernodes", "client_cpus", "num_cpus", "round_timeout", path=path)
        nonnegative(self, "client_gpus", path=path)


@dataclass
class DeploymentBackend(BackendOption):
    """A real Flower deployment (``flwr run`` against a SuperLink)."""

    name: str = "deployment"
    num_supernodes: int = 2  # wait for this many nodes before round 1
    node_wait_timeout: float = 120  # seconds to wait for them (then start with those connected, at least one)
    # seconds a round waits for replies, after which a node's users count as dropped; null: no deadline (a node's
    # time grows with its users' data, so a deadline makes whose updates are summed depend on it: docs/PRIVACY.md)
    round_timeout: Optional[float] = None
    skip_rounds: int = 10  # a node that missed a round's deadline gets no users for this many rounds

    def check(self, path: str) -> None:
        positive(self, "num_supernodes", "node_wait_timeout", "round_timeout", path=path)
        nonnegative(self, "skip_rounds", path=path)
