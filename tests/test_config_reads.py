"""The config is read in one place (issue 42, item 2): code outside the config package takes the
typed ``RunConfig`` and its sections, never fields of the plain dict, and a run parses its
config once (docs/ARCHITECTURE.md, "Configuration")."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import fedpriv.schema.parser as parser
from fedpriv.runner import prepare
from server.app import run_local
from tests.conftest import compose_cfg

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = ROOT / "fedpriv" / "schema"

# a field read from a plain config: `cfg[...]`, `cfg.get(`, and the same under any name ending in
# cfg/config (`self.cfg[`, `run_cfg.get(`, `public_cfg[`, `config[`); a subscript assigned to is a write
READ = re.compile(r"\b(\w*(?:cfg|config))\s*(\[(?![^\]\n]*\]\s*=[^=])|\.get\()")
NOT_THE_RUN_CONFIG = {"peft_config"}  # peft's adapter configs (fedpriv/models/hf.py)
LIMIT = 5  # today 4: Flower's run config in compose.deployment_config (3), past runs' config.yaml in report (1)


def raw_reads() -> list[str]:
    """Every raw config read in fedpriv/, server/ and client/ outside the config package."""
    found = []
    for room in ("fedpriv", "server", "client"):
        for path in sorted((ROOT / room).rglob("*.py")):
            if SCHEMA in path.parents:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                for match in READ.finditer(line):
                    if match.group(1) not in NOT_THE_RUN_CONFIG:
                        found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return found


def test_raw_config_reads_outside_the_config_package_are_few():
    reads = raw_reads()
    assert len(reads) <= LIMIT, "\n".join(reads)


def test_the_counter_sees_every_spelling():
    """The pattern catches the spellings it must (a test of the test)."""
    lines = ['x = cfg["a"]', "y = session.cfg['b']", 'z = self.cfg.get("c")', 'w = run_cfg.get("d")',
             "v = public_cfg['e']", 'u = config["f"]', 'cfg["g"] = 1', 'config["h"] = 2', 'cfg["i"] == 3']
    assert [bool(READ.search(line)) for line in lines] == [True] * 6 + [False, False, True]


def _call_sites(monkeypatch) -> Counter:
    """Counts, by the calling function outside fedpriv/schema, each time a plain mapping is parsed
    into a typed config or section (``schema.parse`` and ``schema.load`` both enter here)."""
    calls: Counter = Counter()
    depth = [0]

    def counted(inner):
        def wrapper(*args, **kwargs):
            if depth[0] == 0:
                frame = sys._getframe(1)
                while frame is not None and SCHEMA in Path(frame.f_code.co_filename).resolve().parents:
                    frame = frame.f_back
                calls[f"{Path(frame.f_code.co_filename).stem}.{frame.f_code.co_name}"] += 1
            depth[0] += 1
            try:
                return inner(*args, **kwargs)
            finally:
                depth[0] -= 1
        return wrapper

    monkeypatch.setattr(parser, "_section", counted(parser._section))
    monkeypatch.setattr(parser, "_option", counted(parser._option))
    return calls


def test_a_default_run_parses_its_config_once(tmp_path, monkeypatch):
    """A smoke run (prepare, then the rounds with backend=local) parses its plain config once, in
    fedpriv.config.resolve.validate; the task, the public stages, the clients, the audit and the research
    key (server and in-process clients) take typed sections."""
    cfg = compose_cfg("+experiment=smoke", "progress=false", "rounds=2", run_dir=tmp_path / "run")
    calls = _call_sites(monkeypatch)
    run_local(prepare(cfg))
    assert dict(calls) == {"resolve.validate": 1}


def test_prepare_leaves_the_callers_dict_as_the_runs_resolved_config(tmp_path):
    """The caller's dict ends as ``session.cfg`` (config.yaml's content: sampling resolved, the
    mechanism's defaults fitted), so a ClientApp made from it derives the run's research key."""
    from fedpriv.keys.research_key import research_key

    cfg = compose_cfg("+experiment=smoke", "mechanism=bandmf", "progress=false", run_dir=tmp_path / "run")
    session = prepare(cfg)
    assert cfg == session.cfg and cfg["sampling"] != "auto"
    assert cfg["mechanism"]["bands"] == session.spec.mechanism.bands != 16  # fitted to the population
    assert research_key(cfg) == session.randomness.key


def test_the_research_key_of_the_typed_config_is_the_key_of_its_plain_form(tmp_path):
    """The run and its clients take the key from the typed config (no parse); it must be the key
    the plain form (config.yaml) gives, in research and paired mode, and secure mode stays fresh."""
    from fedpriv.config.resolve import run_config
    from fedpriv.keys.research_key import client_randomness, research_key, run_randomness
    from fedpriv.schema import as_dict

    for extra in (("+experiment=smoke",), ("+experiment=smoke", "mechanism=bandmf"),
                  ("+experiment=smoke", "privacy.research_key=seed", "seed=3"),
                  ("+experiment=smoke", "audit.canaries=4"),
                  ("+experiment=[smoke,distill]",)):
        spec = run_config(compose_cfg(*extra, run_dir=tmp_path / "r"))
        plain = as_dict(spec)
        assert research_key(spec) == research_key(plain), extra
        assert run_randomness(spec).key == run_randomness(plain).key
        assert client_randomness(spec).research == client_randomness(plain).research
    secure = run_config(compose_cfg("+experiment=smoke", "privacy.secure_rng=true", run_dir=tmp_path / "s"))
    assert run_randomness(secure).key != run_randomness(secure).key and client_randomness(secure).research is None
