"""Field checks shared by every config section (one copy of each validator), and the roles a
field may declare for the research key (:data:`PRESENTATION`, :data:`LOCATION`)."""

from __future__ import annotations

import math
import typing
from typing import Any

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
# input's identity (its size and content digest, :mod:`fedpriv.keys.content_digest`), not its path.
LOCATION = {"location": True}
