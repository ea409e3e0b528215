"""Run a registration when a module of torch is imported, not before.

Some of what openreg registers with torch lives in modules that are slow to
import (``torch._dynamo`` takes about 1.5 s) and that most programs never load.
``when_imported`` defers the registration to the moment the module has been
executed, so ``import torch`` stays as fast as it was, and the registration is
in place before anything in torch can use the module.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

_lock = threading.Lock()
_pending: dict[str, list[Callable[[ModuleType], None]]] = {}
_finder: _Finder | None = None  # on sys.meta_path while something is pending


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Calls ``callback(module)`` once the module ``name`` has been executed.

    If it already has, the callback runs now. Otherwise it runs right after the
    module's code, inside the import that loads it, so the module's importer
    (and everything after) sees the registration.
    """
    global _finder
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            if _finder is None:
                _finder = _Finder()
                sys.meta_path.insert(0, _finder)
            _pending.setdefault(name, []).append(callback)
            return
    callback(module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the awaited modules with the finders that follow it on sys.meta_path
    and wraps their loader; every other import goes on untouched."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, fullname)
        return spec


class _Loader(importlib.abc.Loader):
    """Delegates to the real loader and runs the callbacks after ``exec_module``."""

    def __init__(self, loader: importlib.abc.Loader, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        # The module spec keeps the real loader, so tracebacks, inspect and
        # importlib.reload see the module as if this wrapper never existed.
        module.__spec__.loader = self._loader
        module.__loader__ = self._loader
        global _finder
        with _lock:
            callbacks = _pending.pop(self._name, [])
            if not _pending and _finder is not None:
                sys.meta_path.remove(_finder)
                _finder = None
        for callback in callbacks:
            callback(module)

    def __getattr__(self, attr: str) -> Any:
        # get_source, get_filename, is_package, ...: what linecache and pkgutil ask.
        return getattr(self._loader, attr)
