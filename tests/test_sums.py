"""The sum protocol as one registered, planned thing (fedpriv/sums/, issue 54 item 1): the
``aggregation`` option group, the rules of who reads the trust model (checked on the source with
``ast``), the one user→party rule, Flower's int32 limit written once, and a node planning its
:class:`~fedpriv.sums.SumPlan` with the server's own function."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from conftest import compose_cfg
from fedpriv.errors import ConfigError
from fedpriv.schema import options, parse

ROOT = Path(__file__).resolve().parent.parent
NODES = 4
SECAGG = ("+experiment=smoke", "progress=false", "backend=flower", "aggregation=secagg",
          f"backend.num_supernodes={NODES}")

# ---- reading the source ---------------------------------------------------------------------------

# what a line reads when it reads the trust model: the protocol option (``spec.aggregation``), the
# mechanism's noise placement (``client_noise``) or the sum plan's (``noise_by``, ``protocol``)
TRUST = frozenset({"aggregation", "client_noise", "noise_by", "protocol"})
# where reading it is the job: the sum protocol itself, the config and the planner
TRUST_HOMES = ("fedpriv/sums/", "fedpriv/schema/", "fedpriv/plan/")


def _reads(tree: ast.AST, names: frozenset[str]) -> list[tuple[int, str]]:
    """(line, outermost function or ``<module>``) of each read of an attribute in ``names``:
    ``x.name`` loaded, or ``getattr(x, "name", ...)``. Class-level assignments (a mechanism
    declaring ``client_noise = True``) are not reads."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            here = where
            if where == "<module>" and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                here = f"{node.name}.{child.name}" if isinstance(node, ast.ClassDef) else child.name
            if isinstance(child, ast.Attribute) and child.attr in names and isinstance(child.ctx, ast.Load):
                found.append((child.lineno, here))
            elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id == "getattr"
                  and len(child.args) >= 2 and isinstance(child.args[1], ast.Constant)
                  and child.args[1].value in names):
                found.append((child.lineno, here))
            visit(child, here)

    visit(tree, "<module>")
    return found


def _sources(*rooms: str) -> list[Path]:
    return sorted(p for room in rooms for p in (ROOT / room).rglob("*.py"))


def _shown(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def trust_readers() -> dict[str, set[str]]:
    """File -> the functions that read the trust model, outside its homes (:data:`TRUST_HOMES`)."""
    out: dict[str, set[str]] = {}
    for path in _sources("fedpriv", "server", "client"):
        name = _shown(path)
        if name.startswith(TRUST_HOMES):
            continue
        reads = _reads(ast.parse(path.read_text()), TRUST)
        if reads:
            out[name] = {where for _, where in reads}
    return out


def test_the_source_scanner_sees_reads():
    """Not vacuous: attribute reads, getattr with a literal and methods are found; a declaration is not."""
    source = ("class M:\n    client_noise = True\n    def f(self, spec):\n        return spec.aggregation\n"
              "def g(m):\n    return getattr(m, 'client_noise', False)\n"
              "def h(plan):\n    def inner():\n        return plan.noise_by\n    return inner\n")
    assert _reads(ast.parse(source), TRUST) == [(4, "M.f"), (6, "g"), (9, "h")]


def test_mechanisms_read_neither_the_backend_nor_the_aggregation():
    """A mechanism states its noise (``client_noise``) and its accounting; where its sum travels and on
    which backend is the sum protocol's business (fedpriv/sums/)."""
    reads = {_shown(p): _reads(ast.parse(p.read_text()), frozenset({"backend", "aggregation"}))
             for p in _sources("fedpriv/mechanisms")}
    assert {name: found for name, found in reads.items() if found} == {}


def test_only_the_two_dispatches_read_the_trust_model():
    """Outside fedpriv/sums/, fedpriv/schema/ and fedpriv/plan/, one function of the server and one of
    the node read who adds the noise and how the sum travels: the server's ``round_fn_for`` and the
    node's ``reply`` (each names the protocol's server or node half); the library reads it nowhere."""
    assert trust_readers() == {"server/app.py": {"round_fn_for"}, "client/app.py": {"reply"}}


# ---- the option group -----------------------------------------------------------------------------

def test_aggregation_is_an_option_group_of_declared_protocols():
    """``plain`` and ``secagg`` are registered options of the contract: each declares what the server
    sees and who may add the noise; an option that does not plan a sum is refused at registration."""
    from fedpriv.schema import SumOption, register_option

    found = options("aggregation")
    assert {"plain", "secagg"} <= set(found)
    for option in found.values():
        assert isinstance(option, SumOption) and option.sees and set(option.noise_by) <= {"server", "parties"}

    @dataclass
    class Unplanned(SumOption):
        sees = "nothing"
        noise_by = ("server",)
        name: str = "unplanned"

        def check_run(self, spec) -> None:
            pass

    @dataclass
    class Undeclared(SumOption):
        name: str = "unplanned"

        def check_run(self, spec) -> None:
            pass

        def plan(self, spec, mechanism, dimension, expected_cohort):
            return None

    with pytest.raises(TypeError, match="abstract method plan"):
        Unplanned()
    with pytest.raises(TypeError, match="does not implement: sees, noise_by"):
        register_option("aggregation", "unplanned", Undeclared())
    assert "unplanned" not in options("aggregation")


def test_the_old_secagg_keys_still_work(tmp_path):
    """``secagg.*`` (the section before the group) is read as ``aggregation.*`` for a release: the same
    parsed run; both spellings at once with two values, or under ``aggregation=plain``, are refused;
    an old config.yaml (``aggregation: secagg`` beside a ``secagg`` section) parses the same."""
    old = parse(compose_cfg(*SECAGG, "secagg.bits=18", "secagg.threshold=3", run_dir=tmp_path / "o"))
    new = parse(compose_cfg(*SECAGG, "aggregation.bits=18", "aggregation.threshold=3", run_dir=tmp_path / "o"))
    assert old == new and new.aggregation.bits == 18 and new.aggregation.threshold == 3
    with pytest.raises(ConfigError, match="both given"):
        parse(compose_cfg(*SECAGG, "secagg.bits=18", "aggregation.bits=19", run_dir=tmp_path / "o"))
    with pytest.raises(ConfigError, match="a setting of aggregation=secagg"):
        parse(compose_cfg("+experiment=smoke", "secagg.bits=18", run_dir=tmp_path / "o"))
    written = compose_cfg(*SECAGG, run_dir=tmp_path / "o")
    written.update(aggregation="secagg", secagg={"bits": 18, "threshold": 3})
    assert parse(written) == new
    alone = compose_cfg(*SECAGG, run_dir=tmp_path / "o")  # the old string form without a secagg section
    alone.pop("secagg", None)
    alone["aggregation"] = "secagg"
    assert parse(alone).aggregation.name == "secagg"


# ---- one rule, one limit ----------------------------------------------------------------------------

def test_one_user_to_party_rule(monkeypatch):
    """Users are dealt to parties (in process) and to nodes (Flower) by one function: user u to party
    u mod n; the nodes' dealing follows it, whatever it is."""
    import server.strategy as strategy
    from fedpriv.sums import assign_parties

    cohort = np.array([9, 3, 5, 7, 1, 12])
    assert assign_parties(cohort, 3) == [[3, 9, 12], [1, 7], [5]]
    assert strategy.assign_users(cohort, [30, 10, 20]) == {10: [3, 9, 12], 20: [1, 7], 30: [5]}
    monkeypatch.setattr(strategy, "assign_parties", lambda users, n: [sorted(int(u) for u in users)] + [[]] * (n - 1))
    assert strategy.assign_users(cohort, [30, 10, 20]) == {10: [1, 3, 5, 7, 9, 12], 20: [], 30: []}


def test_flowers_int32_limit_is_written_once(tmp_path):
    """The most bits Flower's int32 quantizer holds is one constant (fedpriv/sums/wire.py); no other
    module compares a number of bits with its own 30 or 31."""
    from fedpriv.sums.wire import FLOWER_MAX_BITS

    assert FLOWER_MAX_BITS == 30
    limit = re.compile(r"bits\s*(>=|>|<=|<|==)\s*3[01]\b|\b3[01]\s*(>=|>|<=|<)\s*\w*bits|FIELD_BITS\s*=")
    written = [f"{_shown(p)}:{i}" for p in _sources("fedpriv", "server", "client")
               for i, line in enumerate(p.read_text().splitlines(), 1) if limit.search(line)]
    assert written == []
    with pytest.raises(ConfigError, match=r"< 31 \(Flower quantizes into int32\)"):
        parse(compose_cfg(*SECAGG, "aggregation.bits=31", run_dir=tmp_path / "x"))


# ---- the plan: one function for the server and every node -------------------------------------------

@pytest.mark.parametrize("extra", [(), ("mechanism=ddgauss", "privacy.noise_multiplier=0.5")])
def test_a_node_plans_its_sum_with_the_servers_function(tmp_path, monkeypatch, extra):
    """The server's run plan and a node's own plan call the same planner (``fedpriv.sums.plan_sum``,
    through ``fedpriv.plan.build_plan``) with equal inputs and get equal frozen plans; the node's codec
    (party noise) is the server's."""
    import client.secagg as node
    import fedpriv.plan.run_plan as run_plan
    from fedpriv.config.resolve import run_config
    from fedpriv.plan import preflight
    from fedpriv.sums import SumPlan, party_codec

    calls: list[tuple] = []
    planner = run_plan.plan_sum

    def spy(spec, mechanism, dimension, expected_cohort):
        plan = planner(spec, mechanism, dimension, expected_cohort)
        calls.append((spec, mechanism.name, mechanism.noise_multiplier, dimension, expected_cohort, plan))
        return plan

    monkeypatch.setattr(run_plan, "plan_sum", spy)
    monkeypatch.setattr(node, "_PLANS", {})
    cfg = compose_cfg(*SECAGG, "cohort_size=12", *extra, run_dir=tmp_path / "s")
    server = preflight(cfg)
    own = node.node_plan(run_config(cfg))
    assert len(calls) == 2 and calls[0] == calls[1]
    assert isinstance(own.sums, SumPlan) and own.sums == server.sums
    assert own.sums.protocol == "secagg" and own.sums.parties == NODES and own.sums.field is not None
    codec = party_codec(server.sums, server.ledger.mechanism)
    assert (own.codec is None) == (codec is None) == (not extra)
    if codec is not None:
        assert own.codec.digest() == codec.digest() and own.sums.noise_by == "parties"
    else:
        assert own.sums.noise_by == "server" and own.sums.node_clip == server.sums.quantization.node_clip


@pytest.mark.parametrize("pair", [("aggregation.bits=20", "secagg.bits=16"), ("secagg.bits=16", "aggregation.bits=20"),
                                  ("aggregation.threshold=null", "secagg.threshold=3")])
def test_both_spellings_on_one_command_line_are_refused_even_at_the_default(pair):
    """The composed config cannot tell a new-spelling value equal to its default from one not given
    (``aggregation.bits=20 secagg.bits=16`` used to run with 16): the command line is checked for
    the pair itself, as a key given twice is."""
    from fedpriv.config.compose import check_overrides

    with pytest.raises(ConfigError, match="are both given: secagg.[a-z]+ is the old spelling of aggregation"):
        check_overrides([*SECAGG, *pair])
