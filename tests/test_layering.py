"""The rooms of the code base (docs/ARCHITECTURE.md) and which may import which, checked on the
import statements themselves (``ast``, including ``importlib.import_module("...")`` literals)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imports_of(path: Path, package: str | None = None) -> set[str]:
    """Absolute dotted names ``path`` imports (relative imports resolved against its package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    if package is None:
        package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
        elif (isinstance(node, ast.Call)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            out.add(node.args[0].value)
    return out


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
    ("server", ("client",)),  # server and clients meet only through fedpriv.codec
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


# the round's pieces take explicit inputs (fedpriv.replies.RoundInputs): none of them reaches back
# into the run loop, and the wire format knows no server state
ROUND_PIECES = ("algorithms.py", "dpfedavg.py", "task.py", "codec.py", "replies.py", "clients.py", "training.py",
                "cohort.py", "aggregation.py", "queries.py")


@pytest.mark.parametrize("name", ROUND_PIECES)
def test_round_pieces_never_import_the_run_loop(name):
    forbidden = ("fedpriv.runner",) + (("fedpriv.dpfedavg",) if name == "codec.py" else ())
    assert _offenders([ROOT / "fedpriv" / name], forbidden) == []


def test_no_import_hides_behind_type_checking():
    """An ``if TYPE_CHECKING:`` import is how a cycle hides; the library has none."""
    hidden = [p.relative_to(ROOT).as_posix() for p in _modules("fedpriv") if "TYPE_CHECKING" in p.read_text()]
    assert hidden == []
