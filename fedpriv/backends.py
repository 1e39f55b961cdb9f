"""Backends resolve by name: the library never imports its Flower glue (``server/``, ``client/``).

The glue registers itself as entry points of the installed package (pyproject.toml):

* ``fedpriv.backends``: ``name = "module:function"``, a function ``(RunSession) -> summary`` that
  runs a prepared session (``local``: in process; ``flower``: Flower's simulation engine);
* ``fedpriv.client_apps``: ``default = "module:function"``, ``(cfg) -> flwr ClientApp`` — what the
  simulation backends run on their nodes.

A deployment needs neither: ``flwr run`` starts ``server.deploy:app`` and ``client.deploy:app``.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from fedpriv.errors import ConfigError

BACKEND_GROUP = "fedpriv.backends"
CLIENT_APP_GROUP = "fedpriv.client_apps"


def _registered(group: str) -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=group)}


def backend_names() -> list[str]:
    return sorted(_registered(BACKEND_GROUP))


def backend(name: str) -> Callable[..., dict]:
    """The run function of backend ``name``; ``ConfigError`` naming the registered ones otherwise."""
    found = _registered(BACKEND_GROUP)
    if name not in found:
        known = ", ".join(sorted(found)) or "none: is fedpriv installed (pip install -e .)?"
        raise ConfigError(f"no backend {name!r} is registered (registered: {known})")
    return found[name].load()


def client_app_factory(name: str = "default") -> Callable[[dict], Any]:
    """The factory of the ClientApp the simulation backends run (``cfg -> ClientApp``)."""
    found = _registered(CLIENT_APP_GROUP)
    if name not in found:
        raise ConfigError(f"no client app {name!r} is registered in {CLIENT_APP_GROUP!r} (is fedpriv installed?)")
    return found[name].load()
