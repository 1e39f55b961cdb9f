"""What a run directory says beside the model (issue 41): the data's own user count only where the
neighbouring relation lets neighbours share it, and a secure run's file times."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
from conftest import compose_cfg

from fedpriv.release.rundir import FIXED_TIME
from fedpriv.schema import sampler_kinds

SMOKE = ("+experiment=smoke", "progress=false", "rounds=1")


def _numbers(value) -> list[float]:
    """Every number in a JSON value (keys aside)."""
    if isinstance(value, dict):
        return [x for v in value.values() for x in _numbers(v)]
    if isinstance(value, list):
        return [x for v in value for x in _numbers(v)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def _published(run_dir: Path) -> list:
    """privacy.json, summary.json and every metrics.jsonl row of a run."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [json.loads((run_dir / name).read_text()) for name in ("privacy.json", "summary.json")] + rows


def test_an_add_remove_run_publishes_the_public_population_only(tmp_path):
    """M3: under add/remove-one, neighbouring datasets differ in their user count, so the data's
    count (40 smoke users) and anything derived from it (8/40) must not be written; a zero-out run
    (N fixed) may state it."""
    from fedpriv.runner import prepare
    from server.app import run_local

    run_local(prepare(compose_cfg(*SMOKE, "population=50", run_dir=tmp_path / "public")))
    run_local(prepare(compose_cfg(*SMOKE, run_dir=tmp_path / "data")))
    privacy, summary, *rows = _published(tmp_path / "public")
    assert privacy["neighboring_relation"] == "add_or_remove_one"
    assert privacy["sampling"]["public_population"] == 50 and "population" not in privacy["sampling"]
    assert "population" not in summary["privacy"]["sampling"] and "num_users" not in summary
    numbers = _numbers([privacy, summary, rows])
    assert 40 not in numbers and 8 / 40 not in numbers and 50 in numbers
    privacy, summary, *_ = _published(tmp_path / "data")
    assert privacy["neighboring_relation"] == "zero_out"
    assert privacy["sampling"]["population"] == 40 and summary["num_users"] == 40


def test_a_secure_run_directory_holds_no_file_times(tmp_path):
    """L6: the files' times gave the training's wall time (the first write against the last). A
    secure run sets every file's and directory's access and modification time to FIXED_TIME; a
    research run keeps real times."""
    from fedpriv.runner import prepare
    from server.app import run_local

    for name, secure in (("secure", "true"), ("research", "false")):
        run_local(prepare(compose_cfg(*SMOKE, "rounds=2", f"privacy.secure_rng={secure}", run_dir=tmp_path / name)))
    secure_dir = tmp_path / "secure"
    paths = [secure_dir, *secure_dir.rglob("*")]
    assert {"privacy.json", "summary.json", "metrics.jsonl", "last.pt"} <= {p.name for p in paths}
    stats = {p: os.stat(p, follow_symlinks=False) for p in paths}  # stat reads no file: atimes untouched
    assert all(s.st_mtime == FIXED_TIME for s in stats.values())
    assert all(s.st_atime == FIXED_TIME for p, s in stats.items() if p.is_file())
    assert os.stat(tmp_path / "research" / "summary.json").st_mtime > FIXED_TIME + 1e9  # a real time


def test_a_path_whose_times_cannot_be_set_warns_and_never_raises(tmp_path, monkeypatch):
    """settle_times runs in train's finally: a file it may not touch (another user's) gives one
    warning, never an exception that would mask the run's own outcome."""
    import warnings

    from fedpriv.release import rundir

    run = rundir.RunDirectory(tmp_path / "r")
    run.path.mkdir()
    (run.path / "theirs.txt").write_text("x")
    (run.path / "ours.txt").write_text("y")
    real = os.utime

    def utime(path, *args, **kwargs):
        if str(path).endswith("theirs.txt"):
            raise PermissionError(1, "Operation not permitted")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(rundir.os, "utime", utime)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.settle_times()
    assert [str(w.message) for w in caught if "theirs.txt" in str(w.message)]
    assert os.stat(run.path / "ours.txt").st_mtime == FIXED_TIME


def _accounting_overrides(kind: str) -> tuple[str, ...] | None:
    """Overrides of a mechanism and accountant that account ``sampling=kind`` with a public
    population (the mechanisms whose default sampler it is first, then the Gaussian): the first
    whose plan builds; None where ``population`` is refused for ``kind``."""
    from fedpriv.errors import ConfigError
    from fedpriv.plan import preflight
    from fedpriv.schema import options

    mechanisms = options("mechanism")
    order = sorted(mechanisms, key=lambda n: (getattr(mechanisms[n], "default_sampling", None) != kind,
                                              n != "gaussian", n))
    refusals = []
    for name in order:
        for accountant in ("rdp", "mc"):
            overrides = (f"sampling={kind}", f"mechanism={name}", f"privacy.accountant={accountant}")
            try:
                preflight(compose_cfg(*SMOKE, *overrides, "population=50", run_dir=None))
            except ConfigError as err:
                refusals.append(str(err))
                continue
            return overrides
    assert all("population" in r for r in refusals[:1]), refusals[:1]
    return None


@pytest.mark.parametrize("kind", sorted(sampler_kinds()))
def test_every_sampler_that_takes_a_public_population_publishes_only_rates_from_it(tmp_path, caplog, kind):
    """Issue 52 item 2: under add/remove-one (``population=50``) the data's own user count is
    private. A run on 40 users and one on 44 must publish the same privacy.json, the same privacy
    and noise blocks of summary.json, the same epsilon per round and the same console lines:
    before, cyclic_poisson and b_min_sep published ``sampling.rate`` = m/40 (m/44). A kind that
    draws from the data's own units refuses ``population`` (nothing to publish)."""
    from fedpriv.release.result_lines import format_result
    from fedpriv.errors import ConfigError
    from fedpriv.runner import prepare
    from fedpriv.sampling import PUBLIC_RATE_KINDS, make_sampler
    from server.app import run_local

    if kind not in PUBLIC_RATE_KINDS:
        with pytest.raises(ConfigError, match="population"):
            make_sampler(kind, 40, 8, None, groups=2, public_population=50)
        return
    overrides = _accounting_overrides(kind)
    assert overrides is not None, f"no registered mechanism accounts sampling={kind} with a public population"
    published = []
    for users in (40, 44):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="fedpriv"):
            session = prepare(compose_cfg(*SMOKE, *overrides, "population=50", f"data.synthetic.num_users={users}",
                                          run_dir=tmp_path / str(users)))
            assert session.ledger.sampler.population == users  # the data's count differs; the run draws from it
            run_local(session)
        privacy, summary, *rows = _published(tmp_path / str(users))
        console = [r.getMessage() for r in caplog.records if "expected cohort" in r.getMessage()]
        assert privacy["neighboring_relation"] == "add_or_remove_one" and "num_users" not in summary
        assert privacy["sampling"]["public_population"] == 50 and "population" not in privacy["sampling"]
        published.append((privacy, summary["privacy"], summary["noise"], [row["epsilon"] for row in rows],
                          console, format_result(summary).splitlines()[1]))
    assert published[0] == published[1]
    numbers = _numbers(published[0][:4])
    assert not {8 / 40, 8 / 44, 40, 44} & set(numbers)


def test_under_a_public_population_no_refusal_or_warning_reads_the_datas_count(tmp_path, caplog):
    """Issue 52 item 4c: with ``population=50`` on 40 users the data's count is private. A cohort
    of 45 was refused for exceeding "the population of 40 users" (a refusal that one user more or
    less decides, printing the count); now the cohort is checked against the public 50 alone, and
    the δ ≥ 1/N warning names N = 50."""
    from fedpriv.config.resolve import run_config, validate_against_data
    from fedpriv.errors import ConfigError
    from fedpriv.plan import preflight

    preflight(compose_cfg(*SMOKE, "population=50", "cohort_size=45", run_dir=tmp_path / "a"))
    with pytest.raises(ConfigError) as refused:
        preflight(compose_cfg(*SMOKE, "population=50", "cohort_size=60", run_dir=tmp_path / "b"))
    assert "population=50" in str(refused.value) and "40" not in str(refused.value)
    spec = run_config(compose_cfg(*SMOKE, "population=50", "privacy.delta=0.03", run_dir=tmp_path / "c"))
    with caplog.at_level(logging.WARNING, logger="fedpriv"):
        validate_against_data(spec, 40)
    assert [r.getMessage() for r in caplog.records if "N = 50 users" in r.getMessage() and "40" not in r.getMessage()]
