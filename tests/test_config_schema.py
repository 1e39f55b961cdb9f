"""The typed config schema (fedpriv/schema/): unknown keys name the closest valid one, values
are type-checked strictly (no truthy strings, no 3.0 for an int), ranges are checked before
anything is written, defaults live in one place, and experiments combine."""

from __future__ import annotations

import pytest

from conftest import compose_cfg
from fedpriv import schema
from fedpriv.config.compose import check_overrides, compose_config
from fedpriv.errors import ConfigError

# (overrides, text the one-line error must contain): each crashed mid-run, gave a traceback, or
# was silently wrong before the schema (issue 14's list)
BAD = [
    (["privacy.clip_nrom=1"], "'privacy.clip_nrom' (did you mean 'privacy.clip_norm'?)"),
    (["+privacy.clip_nrom=1"], "'privacy.clip_nrom' (did you mean 'privacy.clip_norm'?)"),
    (["optimizer=dpadam_ime", "optimizer.ime_fractoin=0.3"], "did you mean 'optimizer.ime_fraction'"),
    (["rounds_=3"], "did you mean 'rounds'"),
    (["seed=-1"], "seed must be >= 0"),
    (["seed=abc"], "seed must be an integer"),
    (["model.hidden_size=0"], "model.hidden_size must be > 0"),
    (["model.embed_dim=-1"], "model.embed_dim must be > 0"),
    (["client.max_steps=abc"], "client.max_steps must be an integer or null"),
    (["client.max_steps=0"], "client.max_steps must be > 0"),
    (["rounds=3.0"], "rounds must be an integer"),
    (["eval_every=abc"], "eval_every must be an integer or null"),
    (["eval_every=0"], "eval_every must be > 0"),
    (["ema_decay=abc"], "ema_decay must be a number"),
    (["ema_decay=1"], "ema_decay must be in [0, 1)"),
    (["mechanism=bandmf", "mechanism.bands=abc"], "mechanism.bands must be an integer"),
    (["resume=no"], "resume must be true or false"),
    (["privacy.secure_rng=abc"], "privacy.secure_rng must be true or false or null"),
    (["optimizer.lr=-1"], "optimizer.lr must be > 0"),
    (["optimizer.momentum=5"], "optimizer.momentum must be in [0, 1)"),
    (["privacy.delta=1"], "privacy.delta must be in (0, 1)"),
    (["client.dp=example", "client.example.clip_norm=inf"], "client.example.clip_norm must be finite"),
    (["client.lr=inf"], "client.lr must be finite"),
    (["privacy.accountant=rpd"], "unknown privacy.accountant 'rpd'"),
    (["optimizer=adamw"], "unknown optimizer 'adamw'"),
    (["+experiment=[smoke,distil]"], "unknown experiment 'distil'"),
    (["model=transformer", "model.num_heads=5"], "divisible"),
    (["algorithm=dpsgd", "backend=flower"], "algorithm=dpsgd is central"),
    (["algorithm=dp_fedsgd", "client.dp=example"], "client.dp=example needs algorithm=dp_fedavg"),
]


@pytest.mark.parametrize("overrides,message", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_overrides_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError) as err:
        check_overrides(["+experiment=smoke", *overrides])
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_sweep_members_are_each_checked_and_need_multirun():
    check_overrides(["privacy.target_epsilon=2,4,8"], multirun=True)
    with pytest.raises(ConfigError, match="privacy.target_epsilon must be > 0, got -4"):
        check_overrides(["privacy.target_epsilon=2,-4"], multirun=True)
    with pytest.raises(ConfigError, match="add -m"):
        check_overrides(["privacy.target_epsilon=2,4"])


def test_unknown_key_in_a_python_config_is_refused(tmp_path):
    from fedpriv.runner import prepare

    cfg = compose_cfg("+experiment=smoke", run_dir=tmp_path / "run")
    cfg["client"]["example"]["stpes"] = 3
    with pytest.raises(ConfigError, match=r"'client\.example\.stpes' \(did you mean 'client\.example\.steps'\?\)"):
        prepare(cfg)
    assert not (tmp_path / "run").exists()


def test_resume_of_a_directory_with_no_run_is_refused(tmp_path):
    from fedpriv.runner import prepare

    cfg = compose_cfg("+experiment=smoke", "resume=true", run_dir=tmp_path / "typo")
    with pytest.raises(ConfigError, match="holds no run to resume"):
        prepare(cfg)
    assert not (tmp_path / "typo").exists()


def test_experiments_combine():
    cfg = compose_config(["+experiment=[smoke,distill]"])
    assert cfg["rounds"] == 3 and cfg["public"]["pretrain_steps"] == 300 and cfg["public"]["teacher"] == "embedded"
    check_overrides(["+experiment=[smoke,distill]"])


@pytest.mark.parametrize("group", schema.GROUPS)
def test_every_option_composes_to_its_schema_defaults(group):
    for name, option in schema.options(group).items():
        composed = compose_config([f"{group}={name}"])[group]
        want = schema.as_dict(option)
        if group == "data":  # the one interpolated default: the teacher's directory (null by default)
            assert want.pop("tokenizer_path") == "${public.teacher_path}" and composed.pop("tokenizer_path") is None
        assert composed == want, f"{group}={name}"


def test_a_partial_option_takes_its_presets_defaults():
    """`optimizer=dpadagrad_bc` has lr 0.1 (its preset), not the dataclass's 0.01 — also from a
    partial dict, and the filled config equals the composed one."""
    from fedpriv.config.resolve import validate

    assert schema.load("optimizer", {"name": "dpadagrad_bc"}).lr == 0.1
    partial = {"optimizer": {"name": "dpadagrad_bc"}, "data": {"name": "synthetic"}}
    validate(partial)
    assert partial["optimizer"] == compose_config(["optimizer=dpadagrad_bc"])["optimizer"]
    assert partial["data"]["tokenizer_path"] is None  # the ${public.teacher_path} default, resolved


def test_defaults_live_in_the_schema_only():
    """The top level composes to RunConfig's defaults, and validate() fills a partial dict with them."""
    from fedpriv.config.resolve import validate

    composed = compose_config([])
    top = {k: v for k, v in schema.as_dict(schema.RunConfig()).items() if k not in schema.GROUPS}
    assert {k: composed[k] for k in top if k != "run_dir"} == {k: v for k, v in top.items() if k != "run_dir"}
    partial = {"rounds": 2, "privacy": {"clip_norm": 1.0}, "mechanism": {"name": "tree"}}
    validate(partial)
    assert partial["client"]["lr"] == schema.Client().lr
    assert partial["privacy"]["clip_norm"] == 1.0 and partial["privacy"]["delta"] == schema.Privacy().delta
    assert partial["mechanism"] == {"name": "tree", "estimator": "efficient", "restart_every": None}


def test_smoke_runs_with_a_tiny_transformer(tmp_path):
    from fedpriv.runner import prepare
    from server.app import run_local

    check_overrides(["+experiment=smoke", "model=transformer"])  # composes (was a TypeError)
    session = prepare(compose_cfg("+experiment=smoke", "model=transformer_tiny", "rounds=1", "progress=false",
                                  run_dir=tmp_path / "run"))
    summary = run_local(session)
    assert summary["rounds"] == 1 and summary["model"] == "transformer"


def test_cli_unknown_key_exits_2_naming_it(run_cli, tmp_path):
    done = run_cli("+experiment=smoke", "privacy.clip_nrom=1", f"run_dir={tmp_path / 'run'}", timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: unknown config key 'privacy.clip_nrom' (did you mean 'privacy.clip_norm'?)"]
    assert not (tmp_path / "run").exists()


def test_a_new_mechanism_is_its_module_only(tmp_path):
    """Extension point: an option registered by its own module (tests/plugin_scaled_gaussian.py:
    dataclass + mechanism + one register_option) is selectable, checked, built — and, with no
    line of its own, gets every contract test of tests/test_plugins.py (docs/ARCHITECTURE.md)."""
    cfg = compose_config(["+experiment=smoke", "mechanism=scaled_gaussian", "mechanism.factor=3"])
    assert cfg["mechanism"] == {"name": "scaled_gaussian", "factor": 3}
    assert schema.parse(cfg).mechanism.build(0.5, 1.0).noise_multiplier == 1.5
    with pytest.raises(ConfigError, match="mechanism.factor must be > 0"):
        check_overrides(["mechanism=scaled_gaussian", "mechanism.factor=-1"])


# --- one copy of each default and each validator (issue 27: four disagreements resolved) ----------

def test_the_synthetic_generator_and_its_config_section_share_defaults_and_checks():
    import dataclasses

    from fedpriv.data.synthetic import SyntheticConfig, SyntheticParams

    generator = SyntheticConfig()
    for f in dataclasses.fields(SyntheticParams):
        assert getattr(SyntheticParams(), f.name) == getattr(generator, f.name), f.name
    assert generator.num_users == 10000  # the run's default, and the generator's
    # num_public_topics = 0 is fine without public-only samples, refused with them: one rule, one message
    SyntheticParams(num_public_topics=0, public_private_fraction=1.0).check("data.synthetic")
    with pytest.raises(ConfigError, match="data.synthetic.num_public_topics must be >= 1 for public-only samples"):
        SyntheticParams(num_public_topics=0).check("data.synthetic")
    with pytest.raises(ConfigError, match="data.synthetic.num_public_topics must be >= 1 for public-only"):
        check_overrides(["data.synthetic.num_public_topics=0"])


def test_max_test_sentences_has_one_rule_for_the_option_and_the_loader(tmp_path):
    from fedpriv.data.stackoverflow import load_stackoverflow

    message = "data.max_test_sentences must be >= 1, got 0"
    with pytest.raises(ConfigError, match=message):
        check_overrides(["data=stackoverflow", "data.max_test_sentences=0"])
    with pytest.raises(ConfigError, match=message):
        load_stackoverflow(tmp_path / "absent.sqlite", max_test_sentences=0)


def test_the_text_pipeline_reads_each_datasets_own_public_source_default():
    from fedpriv.schema import load

    assert load("data", {"name": "stackoverflow"}).public_source == "none"  # no public corpus of its own
    assert load("data", {"name": "synthetic"}).public_source == "embedded"
    assert load("data", {}).public_source == "embedded"  # a partial mapping: the default dataset's
