"""psycopg's import without ``importlib.metadata``, for the command line's processes.

psycopg imports ``importlib.metadata`` (with ``email``, ``zipfile``, ``csv`` and the
rest) only so that its ``version`` modules can look their distribution's version up:
12-17 ms of every ``dislock`` run, more than dislock itself adds (``benchmarks/cli.py``).
``prime`` puts a finder first on ``sys.meta_path`` that loads each of those modules
with its ``__version__`` read from the ``<name>-<version>.dist-info`` folder beside
the package; any other name asked of it loads the real module then.  Where the
folder is not found (an egg, a zip, two versions side by side), the module imports
as usual.  Only the console scripts call it (``dislock.cli``'s ``__init__``).
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from importlib.util import module_from_spec, spec_from_file_location
from typing import Any

VERSIONED = {"psycopg": "psycopg", "psycopg_binary": "psycopg_binary", "psycopg_c": "psycopg_c"}
"""Each package whose ``version`` module reads ``importlib.metadata``: its ``.dist-info``."""


def prime() -> None:
    """Load psycopg's version modules without ``importlib.metadata`` from now on, unless
    psycopg is imported already."""
    if "psycopg" not in sys.modules and not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


class _Finder:
    # (Not importlib.abc's classes: importing that module imports importlib.resources.)
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> ModuleSpec | None:
        package, _, leaf = fullname.partition(".")
        if leaf != "version" or package not in VERSIONED or not path:
            return None
        source = os.path.join(path[0], "version.py")
        version = _installed_version(path[0], VERSIONED[package])
        if version is None or not os.path.isfile(source):
            return None
        loader: Any = _Loader(version)  # exec_module's kind of loader (no load_module)
        return spec_from_file_location(fullname, source, loader=loader)


class _Loader:
    def __init__(self, version: str) -> None:
        self.version = version

    def create_module(self, spec: ModuleSpec) -> None:
        return None  # the import system's own module object

    def exec_module(self, module: types.ModuleType) -> None:
        module.__version__ = self.version  # type: ignore[attr-defined]
        name, source = module.__name__, module.__file__

        def real(attribute: str) -> object:
            # A name the primed module lacks: the real module knows it (PEP 562).  Not
            # the import system's questions (``__path__``: is it a package?).
            if attribute.startswith("__") or source is None:
                raise AttributeError(attribute)
            spec = spec_from_file_location(name, source)
            assert spec is not None and spec.loader is not None
            loaded = module_from_spec(spec)
            spec.loader.exec_module(loaded)
            return getattr(loaded, attribute)

        module.__getattr__ = real  # type: ignore[method-assign]


def _installed_version(folder: str, distribution: str) -> str | None:
    """The version in the one ``<distribution>-<version>.dist-info`` folder beside the
    package ``folder``, or None."""
    prefix, suffix = f"{distribution}-", ".dist-info"
    try:
        beside = os.listdir(os.path.dirname(folder))
    except OSError:
        return None
    versions = [
        entry[len(prefix) : -len(suffix)]
        for entry in beside
        if entry.startswith(prefix) and entry.endswith(suffix)
    ]
    return versions[0] if len(versions) == 1 else None
