"""The rooms of the code base (docs/ARCHITECTURE.md) and which may import which, checked on the
import statements themselves (``ast``, including ``importlib.import_module("...")`` literals)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imported(path: Path, package: str | None = None) -> list[tuple[str, tuple[str, ...]]]:
    """Per import: (the dotted name it loads, the names ``from NAME import ...`` takes from it)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    if package is None:
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            out.append((base, tuple(f"{base}.{alias.name}" for alias in node.names)))
        elif (isinstance(node, ast.Call)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.append((node.args[0].value, ()))
    return out


def imports_of(path: Path, package: str | None = None) -> set[str]:
    """Absolute dotted names ``path`` imports (relative imports resolved against its package)."""
    return {name for base, names in _imported(path, package) for name in (base, *names)}


def _modules(room: str) -> list[Path]:
    return sorted((ROOT / room).rglob("*.py"))


def _offenders(paths: list[Path], forbidden: tuple[str, ...], package: str | None = None) -> list[str]:
    bad = []
    for path in paths:
        for name in imports_of(path, package):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.name} imports {name}")
    return bad


@pytest.mark.parametrize("room,forbidden", [
    ("fedpriv", ("server", "client")),  # the library never imports its Flower glue
    ("server", ("client",)),  # server and clients meet only through fedpriv.round.codec
    ("client", ("server",)),
    ("fedpriv/clipping", ("fedpriv.models",)),  # per-sample clipping knows no model
    ("fedpriv/data", ("fedpriv.public",)),  # the text pipeline's pieces live in fedpriv/text
    ("fedpriv/public", ("fedpriv.data",)),
    ("fedpriv/text", ("fedpriv.data", "fedpriv.public")),
    # the audit knows no model, dataset or stage, and never the run loop that calls it
    ("fedpriv/audit", ("fedpriv.models", "fedpriv.data", "fedpriv.public", "fedpriv.clipping", "fedpriv.runner")),
])
def test_rooms_import_only_what_they_may(room, forbidden):
    assert _modules(room), f"no modules under {room}"
    assert _offenders(_modules(room), forbidden) == []


def test_the_checker_sees_imports(tmp_path):
    """The checker is not vacuous: it finds absolute, relative and import_module imports."""
    planted = tmp_path / "probe.py"
    planted.write_text("import importlib\nfrom server.app import run_local\nfrom ..models import lstm\n"
                       "importlib.import_module('client.app')\n")
    assert sorted(_offenders([planted], ("server", "client", "fedpriv.models"), package="fedpriv.clipping")) == [
        "probe.py imports client.app", "probe.py imports fedpriv.models", "probe.py imports fedpriv.models.lstm",
        "probe.py imports server.app", "probe.py imports server.app.run_local"]


# the round's pieces take explicit inputs (fedpriv.round.replies.RoundInputs): none of them reaches back
# into the run loop, and the wire format knows no server state
ROUND_PIECES = ("round/algorithms.py", "round/dpfedavg.py", "task.py", "round/codec.py", "round/replies.py",
                "round/clients.py", "round/training.py", "round/cohort.py", "round/aggregation.py", "round/queries.py",
                "sums/secure_sum.py")


@pytest.mark.parametrize("name", ROUND_PIECES)
def test_round_pieces_never_import_the_run_loop(name):
    forbidden = ("fedpriv.runner",) + (("fedpriv.round.dpfedavg",) if name == "round/codec.py" else ())
    assert _offenders([ROOT / "fedpriv" / name], forbidden) == []


def test_no_import_hides_behind_type_checking():
    """An ``if TYPE_CHECKING:`` import is how a cycle hides; the library has none."""
    hidden = [p.relative_to(ROOT).as_posix() for p in _modules("fedpriv") if "TYPE_CHECKING" in p.read_text()]
    assert hidden == []


# ---- the floors (docs/ARCHITECTURE.md "Floors"): the file import graph has no cycle, and the
# never-rules below hold. Every import counts, a function-level one too.
GRAPH_ROOMS = ("fedpriv", "server", "client")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(rooms: tuple[str, ...] = GRAPH_ROOMS, from_loads_package: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of ``rooms`` it imports. ``from pkg import name`` imports the module
    ``pkg.name`` where that is one, else ``pkg`` (with ``from_loads_package``: ``pkg`` too, whose
    ``__init__`` the spelling names); a name outside ``rooms`` maps to its nearest enclosing module
    of ``rooms`` (none: dropped)."""
    paths = {_module_name(p): p for room in rooms for p in _modules(room)}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for base, names in _imported(path, package):
            extra = [base] if from_loads_package and names else []
            for target in [n if n in paths else base for n in names] + extra or [base]:
                while target and target not in paths:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _is_cli(name: str) -> bool:
    """An entry point: ``simulate``, a ``__main__`` module, a module with a ``__main__`` block."""
    path = ROOT / Path(*name.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    return (name == "fedpriv.simulate" or name.endswith(".__main__")
            or 'if __name__ == "__main__":' in path.read_text())


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


# (importer, forbidden importee, "imports" (directly) or "reaches" (through any chain), why);
# patterns are full-match regular expressions on dotted module names. A CLI importer is exempt:
# it is the top floor.
_PKG = r"(\..+)?"
# read by more than one data source: word-count files, TFF's word rows, the lazy per-user reader
SHARED_TEXT_READING = r"fedpriv\.(text\.vocabulary|data\.word_rows|data\.lazy_users)"
FOUNDATIONS = (r"fedpriv\.(schema(\..+)?|keys\.(research_key|content_digest|randomness|keystream)|cache"
               r"|release\.(rundir|atomic)|devices"
               r"|allocator|errors|precision)")
NEVER = [
    (r"fedpriv\.keys\.randomness", r"(?!fedpriv\.errors$|fedpriv\.keys\.keystream$).*", "imports",
     "randomness takes bytes and keys: nothing above errors (and the keystream it draws from)"),
    (r"fedpriv\.schema" + _PKG, r"fedpriv\.(runner|config|plan|sampling|accounting|mechanisms|sums)" + _PKG, "imports",
     "the config knows no run, sampler, accountant, mechanism or sum protocol (registries are filled from below)"),
    (FOUNDATIONS, "(?!" + FOUNDATIONS + "$).*", "imports", "a foundation imports foundations only"),
    (r"fedpriv\.mechanisms" + _PKG, r"fedpriv\.clipping" + _PKG, "imports", "mechanisms never import clipping"),
    (r"fedpriv\.accounting" + _PKG, r"fedpriv\.mechanisms" + _PKG, "imports",
     "accounting never imports mechanisms (mechanisms state their events to it)"),
    (r"fedpriv\.(models|data)" + _PKG, r"fedpriv\.(config\.compose|runner)", "reaches",
     "a model or dataset never reaches up to the composer or the runner"),
    (r".*", "CLI", "imports", "CLIs live on the top floor: nothing imports one"),
    (r"fedpriv\.release\.console", r"fedpriv\.(audit|round|sums|plan)" + _PKG, "imports",
     "the console formats what every command prints; the run's end-of-run lines quote the audit "
     "(release/result_lines.py)"),
    (SHARED_TEXT_READING, r"fedpriv\.data\.(?!federated$|word_rows$|lazy_users$).+", "imports",
     "the pieces every federated text source shares (issue 53) know no source"),
]


# the floors (docs/ARCHITECTURE.md), top first: a module imports its own floor or lower ones. A
# module no pattern names (a new one) has no floor yet and is not checked here.
FLOORS = [
    ("entry points", "CLI"),
    ("run composition", r"fedpriv\.(config\.compose|runner|degradation|backends|audit\.run"
                        r"|release\.(run_outputs|result_lines|observe|console|tensorboard_events))"
                        r"|fedpriv\.plan" + _PKG),
    ("foundations", FOUNDATIONS),
    # the round before the parts: the simulated secure sum (the round's floor) sits in the sums package
    ("the round", r"fedpriv\.(task|round\.(algorithms|training|cohort|cohort_parallel|clients|dpfedavg|local_dp)"
     r"|sums\.secure_sum|config\.resolve)"),
    ("parts", r"fedpriv\.(models|data|text|mechanisms|accounting|clipping|optim|public|audit|sums)" + _PKG
     + r"|fedpriv\.(sampling|round\.(aggregation|queries|replies|codec|adaptive_clipping)|metrics)"),
]
_FLOOR_ORDER = ["entry points", "run composition", "the round", "parts", "foundations"]


def floor_of(name: str) -> str | None:
    """The floor of module ``name`` (the first pattern of :data:`FLOORS` it matches; server/ and
    client/ are entry points)."""
    import re

    if name.startswith(("server", "client")):
        return "entry points"
    for floor, pattern in FLOORS:
        if _is_cli(name) if pattern == "CLI" else re.fullmatch(pattern, name):
            return floor
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    rank = {floor: i for i, floor in enumerate(_FLOOR_ORDER)}
    bad = []
    for name in sorted(graph):
        here = floor_of(name)
        for target in sorted(graph[name]):
            there = floor_of(target)
            if here and there and rank[there] < rank[here]:
                bad.append(f"{name} ({here}) imports {target} ({there})")
    return bad


def never_violations(graph: dict[str, set[str]]) -> list[str]:
    import re

    bad = []
    for importer, forbidden, how, why in NEVER:
        for name in sorted(graph):
            if _is_cli(name) or not re.fullmatch(importer, name):
                continue
            targets = graph[name] if how == "imports" else _reach(graph, name)
            for target in sorted(targets):
                if _is_cli(target) if forbidden == "CLI" else re.fullmatch(forbidden, target):
                    bad.append(f"{name} {how} {target}: {why}")
    return bad


def test_no_import_cycle():
    graph = import_graph()
    found = cycles(graph)
    shown = ["; ".join(f"{v} -> {', '.join(sorted(graph[v] & set(c)))}" for v in c) for c in found]
    assert shown == []


def test_no_package_init_sits_in_an_import_cycle():
    """``from pkg import submodule`` names ``pkg``'s ``__init__``: where that ``__init__`` imports the
    module back (``fedpriv/data/__init__.py`` imports every source), the two sit in a cycle that the
    module graph above does not show. Imports of a sibling are spelled by module (``import
    pkg.sub as sub``) instead."""
    graph = import_graph(from_loads_package=True)
    packages = {_module_name(p) for room in GRAPH_ROOMS for p in _modules(room) if p.name == "__init__.py"}
    through_init = [sorted(c) for c in cycles(graph) if packages & set(c)]
    assert through_init == []


def test_never_rules_hold():
    assert never_violations(import_graph()) == []


def test_imports_point_down_the_floors():
    assert upward_imports(import_graph()) == []


def test_graph_checks_see_what_they_guard():
    """Not vacuous: the graph has the edges a reader sees, a planted cycle is found, and each rule
    matches the modules it names."""
    graph = import_graph()
    assert {"fedpriv.errors", "fedpriv.keys.randomness"} <= graph["fedpriv.sampling"]
    assert "fedpriv.runner" in graph["fedpriv.simulate"]
    assert len(graph) > 100 and {"server.app", "client.app"} <= set(graph)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    planted = {**graph, "fedpriv.models.lstm": graph["fedpriv.models.lstm"] | {"fedpriv.task"},
               "fedpriv.task": graph["fedpriv.task"] | {"fedpriv.runner"},  # through another module
               "fedpriv.keys.randomness": {"fedpriv.schema"}, "fedpriv.accounting.ledger": {"fedpriv.mechanisms.base"}}
    bad = never_violations(planted)
    assert any(b.startswith("fedpriv.models.lstm reaches fedpriv.runner") for b in bad)
    assert any(b.startswith("fedpriv.keys.randomness imports fedpriv.schema") for b in bad)
    assert any(b.startswith("fedpriv.accounting.ledger imports fedpriv.mechanisms.base") for b in bad)
    assert upward_imports(planted) == ["fedpriv.models.lstm (parts) imports fedpriv.task (the round)",
                                       "fedpriv.task (the round) imports fedpriv.runner (run composition)"]
    assert floor_of("fedpriv.schema.sections") == "foundations" and floor_of("server.app") == "entry points"
    for shared in ("fedpriv.text.vocabulary", "fedpriv.data.word_rows", "fedpriv.data.lazy_users"):
        assert floor_of(shared) == "parts" and shared in graph
    assert {"fedpriv.data.word_rows", "fedpriv.data.lazy_users"} <= graph["fedpriv.data.stackoverflow"]
    assert any(b.startswith("fedpriv.data.word_rows imports fedpriv.data.stackoverflow:") for b in never_violations(
        {**graph, "fedpriv.data.word_rows": graph["fedpriv.data.word_rows"] | {"fedpriv.data.stackoverflow"}}))
    assert _is_cli("fedpriv.simulate") and _is_cli("fedpriv.audit.__main__") and not _is_cli("fedpriv.runner")
    assert floor_of("fedpriv.data.__main__") == "entry points" and floor_of("fedpriv.data.files_inspect") == "parts"
    assert "fedpriv.config.compose" in graph["fedpriv.data.__main__"]  # the CLI composes; the parts below it never do


# ---- function-level imports: a module's imports sit at its top; one inside a function stays there
# only for a stated reason (an optional package, or a light entry point kept light), written as a
# ``# lazy: ...`` comment on its line or in the comment lines right above its group of imports.
# Files being rewritten in parallel (issue 42, item 3) keep their lazy imports uncommented for now.
LAZY_UNCHECKED: tuple[str, ...] = ()  # files whose lazy imports are not checked (none)


def _says_why(lines: list[str], lineno: int) -> bool:
    """Line ``lineno`` (1-based), or a comment above it across its group of imports, has ``# lazy:``."""
    i = lineno - 1
    if "# lazy:" in lines[i]:
        return True
    for text in (line.strip() for line in reversed(lines[:i])):
        if "# lazy:" in text:
            return True
        if not text.startswith(("#", "import ", "from ")):
            return False
    return False


def lazy_imports_without_reason(paths: list[Path]) -> list[str]:
    """``file:line`` of each import inside a function with no ``# lazy:`` reason."""
    bad = []
    for path in paths:
        text = path.read_text()
        functions = [n for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        inner = {n.lineno for f in functions for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
        lines = text.splitlines()
        shown = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
        bad += [f"{shown}:{lineno}" for lineno in sorted(inner) if not _says_why(lines, lineno)]
    return bad


def test_function_level_imports_say_why_they_are_lazy(tmp_path):
    paths = [p for room in GRAPH_ROOMS for p in _modules(room)
             if not p.relative_to(ROOT).as_posix().startswith(LAZY_UNCHECKED)]
    assert lazy_imports_without_reason(paths) == []
    planted = tmp_path / "probe.py"  # the check is not vacuous
    planted.write_text("import os\n\n\ndef f():\n    import json\n\n\ndef g():\n    # lazy: optional\n"
                       "    import a\n    import b\n    x = 1\n    import c  # lazy: optional\n    import d\n"
                       "    y = 2\n    import e\n")
    assert lazy_imports_without_reason([planted]) == ["probe.py:5", "probe.py:16"]
