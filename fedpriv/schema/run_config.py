"""The whole run's typed config: the top-level keys, the fixed sections and one option per group."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from fedpriv.errors import ConfigError
from fedpriv.schema.checks import PRESENTATION, _key, in_unit_interval, nonnegative, positive
from fedpriv.schema.registry import _default, sampler_kinds
from fedpriv.schema.sections import (AlgorithmOption, Audit, BackendOption, Client, LocalBackend, MechanismOption,
                                     ModelOption, OptimizerOption, PlanOption, Privacy, Public, Section, SumOption,
                                     TextPipeline)


def secure_mode(secure_rng: bool | None, backend: str | None) -> bool:
    """``privacy.secure_rng``, where null means: secure for deployments, research otherwise."""
    return backend == "deployment" if secure_rng is None else secure_rng


def resolve_secure(cfg: Mapping[str, Any]) -> bool:
    """``privacy.secure_rng`` of a plain config (:func:`secure_mode`), its type checked."""
    value = (cfg.get("privacy") or {}).get("secure_rng")
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"privacy.secure_rng must be true, false or null (by backend), got {value!r}")
    return secure_mode(value, (cfg.get("backend") or {}).get("name"))


@dataclass
class RunConfig(Section):
    """The whole run. Top-level keys, the fixed sections, and one option per group."""

    seed: int = 0  # model init and public stages; in research mode also the randomness key
    # where tensors live (auto: cuda when available)
    device: Literal["auto", "cpu", "cuda"] = field(default="auto", metadata=PRESENTATION)
    rounds: int = 220  # server rounds; sigma is calibrated and epsilon accounted for exactly these
    cohort_size: int = 150  # expected users per round (Poisson: rate cohort_size / population)
    sampling: str = "auto"  # auto: the mechanism's default_sampling; else a registered sampler (fedpriv/sampling.py)
    # public population size N fixing the Poisson rates q = cohort_size / N (add/remove-one holds);
    # null: q from the dataset's count, accounted under zero-out (docs/PRIVACY.md, "The population")
    population: Optional[int] = None
    ema_decay: float = 0.95  # >0: release/evaluate the EMA of the server iterates (post-processing); 0: off
    # evaluate on the test set every k rounds (and after the last); null: last only
    eval_every: Optional[int] = field(default=20, metadata=PRESENTATION)
    resume: bool = field(default=False, metadata=PRESENTATION)  # true: continue the run in run_dir
    # the tqdm round bar on stderr; shown only when stderr is a terminal (never in a log file or pipe)
    progress: bool = field(default=True, metadata=PRESENTATION)
    verbose: bool = field(default=False, metadata=PRESENTATION)  # one structured log line per round
    # research mode only: statistics of training users (NOT covered by epsilon)
    diagnostics: bool = field(default=True, metadata=PRESENTATION)
    tensorboard: bool = field(default=False, metadata=PRESENTATION)  # TensorBoard scalars in RUN_DIR/tensorboard
    # the run directory: config.yaml, metrics.jsonl, privacy.json, summary.json, checkpoints/
    run_dir: str = field(default="outputs/${now:%Y-%m-%d}/${now:%H-%M-%S}", metadata=PRESENTATION)
    client: Client = field(default_factory=Client)
    public: Public = field(default_factory=Public)
    privacy: Privacy = field(default_factory=Privacy)
    audit: Audit = field(default_factory=Audit)
    # the sum protocol (fedpriv/sums/): plain, each node's clipped updates reach the server in the clear; secagg,
    # only the sum of the nodes' clipped sums, through Flower's SecAgg+ (backend=flower or deployment; docs/PRIVACY.md)
    aggregation: SumOption = field(default_factory=_default("aggregation"))
    data: TextPipeline = field(default_factory=_default("data"))
    model: ModelOption = field(default_factory=_default("model"))
    algorithm: AlgorithmOption = field(default_factory=_default("algorithm"))
    mechanism: MechanismOption = field(default_factory=_default("mechanism"))
    optimizer: OptimizerOption = field(default_factory=_default("optimizer"))
    backend: BackendOption = field(default_factory=_default("backend"), metadata=PRESENTATION)
    # fixed: the config as given; auto: cohort, rounds, mechanism, clip and server step chosen from public quantities
    plan: PlanOption = field(default_factory=_default("plan"))

    @property
    def secure(self) -> bool:
        return secure_mode(self.privacy.secure_rng, self.backend.name)

    def check(self, path: str = "") -> None:
        nonnegative(self, "seed", path=path)
        if not self.run_dir.strip():  # `run_dir=$UNSET`: never the current directory
            raise ConfigError(f"{_key(path, 'run_dir')} is empty (an unset shell variable?): give a directory, "
                              "or leave run_dir out for outputs/<date>/<time>")
        kinds = sampler_kinds()
        if self.sampling != "auto" and self.sampling not in kinds:
            raise ConfigError(f"unknown {_key(path, 'sampling')} {self.sampling!r} (choose one of: "
                              f"{', '.join(['auto', *sorted(kinds)])})")
        positive(self, "rounds", "cohort_size", "eval_every", "population", path=path)
        in_unit_interval(self, "ema_decay", path, closed_right=False, open_left=False)
        if self.algorithm.central and not isinstance(self.backend, LocalBackend):
            raise ConfigError(f"algorithm={self.algorithm.name} is central (pooled data, no clients): "
                              "use backend=local")
        if self.privacy.research_key == "seed" and self.secure:
            raise ConfigError("privacy.research_key=seed shares randomness between runs: research mode only "
                              "(privacy.secure_rng=false, and not backend=deployment)")
        self.model.check_selected(_key(path, "model"))
        self.data.check_run(self)
        self.aggregation.check_run(self)  # the sum protocol first: it checks the mechanism's noise placement
        self.mechanism.check_run(self)
        if self.client.dropout_rate and not isinstance(self.backend, LocalBackend):
            raise ConfigError(f"client.dropout_rate simulates dropouts in backend=local; under "
                              f"backend={self.backend.name} nodes drop out for real (backend.round_timeout)")
        if self.client.dropout_rate and (self.algorithm.central or getattr(self.algorithm, "one_pass", False)):
            raise ConfigError(f"client.dropout_rate simulates clients that fail to reply; "
                              f"algorithm={self.algorithm.name} runs one pass over the whole cohort (use "
                              "algorithm.one_pass=false, or dp_fedavg)")
        if self.model.tokenizer is not None and self.data.tokenizer != self.model.tokenizer:
            raise ConfigError(f"model={self.model.name} reads the token ids of its own tokenizer: add "
                              f"data.tokenizer={self.model.tokenizer} (data.tokenizer_path defaults to model.path)")
        if self.client.parallel > 1 and not self.model.vmappable:
            raise ConfigError(f"client.parallel={self.client.parallel} runs clients under torch.func.vmap, which "
                              f"model={self.model.name} does not support: use client.parallel=1")
        if self.client.dp == "example" and not self.algorithm.local_training:
            raise ConfigError(f"client.dp=example needs algorithm=dp_fedavg (local DP-SGD steps), "
                              f"not {self.algorithm.name}")
