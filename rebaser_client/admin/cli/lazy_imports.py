"""What the ``rebaser`` commands import late: nats-py's aiohttp.

nats-py imports aiohttp with itself (``nats.aio.transport``), for its WebSocket transport (``ws://``, ``wss://``):
about a quarter of what a command that talks to NATS spends before it sends anything, though most commands connect
with ``nats://``. :func:`defer_aiohttp` arranges that nats-py's ``import aiohttp``, whenever it comes, binds a
stand-in module instead, which imports the real aiohttp on its first use (a WebSocket connection). Only nats-py's
import is affected: the stand-in is in ``sys.modules`` only while nats-py is being imported, so anything else that
imports aiohttp gets the real one, as usual.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence
from typing import Any

__all__ = ["defer_aiohttp"]


class _Deferred(types.ModuleType):
    """Stands in for a module: its attributes are the real module's, imported on first use."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(importlib.import_module(self.__name__), name)


class _NatsLoader(importlib.abc.Loader):
    """nats-py's own loader, with the aiohttp stand-in in place while the package runs."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)  # get_source, is_package, resources: as the loader it wraps

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        stand_in = None if "aiohttp" in sys.modules else _Deferred("aiohttp")
        if stand_in is not None:
            sys.modules["aiohttp"] = stand_in
        try:
            self._loader.exec_module(module)
        finally:
            if stand_in is not None and sys.modules.get("aiohttp") is stand_in:
                del sys.modules["aiohttp"]


class _NatsFinder(importlib.abc.MetaPathFinder):
    """Finds the ``nats`` package once, as the other finders do, and wraps its loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "nats":
            return None
        sys.meta_path.remove(self)  # once: nats-py is imported once
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _NatsLoader(spec.loader)
        return spec


def defer_aiohttp() -> None:
    """From now on, nats-py's import of aiohttp is deferred to its first use (nothing if nats-py or aiohttp is
    imported already: nothing to gain)."""
    if "nats" in sys.modules or "aiohttp" in sys.modules:
        return
    if not any(isinstance(finder, _NatsFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _NatsFinder())
