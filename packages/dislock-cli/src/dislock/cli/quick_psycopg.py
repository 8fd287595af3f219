"""psycopg's import without ``importlib.metadata``, for the command line's processes.

Importing psycopg imports ``importlib.metadata`` (with ``email``, ``zipfile``, ``csv``
and the rest) only so that ``psycopg/version.py`` and ``psycopg_binary/version.py``
can each look their distribution's version up: 12-17 ms of every ``dislock`` run
on a 2-core machine, more than everything dislock itself adds to one
(``benchmarks/cli.py``).  Before psycopg is first imported, ``prime`` puts those
two modules in place with ``__version__`` read from the name of the
``<name>-<version>.dist-info`` folder beside the package, which is what
``importlib.metadata`` finds too; any other name asked of them loads the real
module then.  Where the folder is not found (an egg, a zip, two versions side by
side, a source tree), nothing is primed and psycopg imports as usual.

Only the console scripts call it (``dislock.cli``'s ``__init__``), so only processes
that are dislock's own see psycopg primed; code that imports the libraries does not.
"""

from __future__ import annotations

import os
import sys
import types
from importlib.machinery import PathFinder
from importlib.util import module_from_spec, spec_from_file_location

VERSIONED = (("psycopg", "psycopg"), ("psycopg_binary", "psycopg_binary"))
"""Each package whose ``version`` module reads ``importlib.metadata``, and the name its
``.dist-info`` folder starts with (the distribution's, normalised by the installer)."""


def prime() -> None:
    """Put psycopg's version modules in place, unless psycopg is imported already."""
    if "psycopg" in sys.modules:
        return
    listings: dict[str, list[str]] = {}  # both packages are usually in one folder: listed once
    for package, distribution in VERSIONED:
        module = _version_module(package, distribution, listings)
        if module is not None:
            sys.modules[module.__name__] = module


def _version_module(
    package: str, distribution: str, listings: dict[str, list[str]]
) -> types.ModuleType | None:
    """``package.version`` with ``__version__`` from its ``.dist-info`` folder, or None
    (``listings``: the folders listed so far, by path)."""
    spec = PathFinder.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = spec.submodule_search_locations[0]
    path = os.path.join(folder, "version.py")
    parent = os.path.dirname(folder)
    if parent not in listings:
        try:
            listings[parent] = os.listdir(parent)
        except OSError:
            return None
    beside = listings[parent]
    prefix, suffix = f"{distribution}-", ".dist-info"
    versions = [
        entry[len(prefix) : -len(suffix)]
        for entry in beside
        if entry.startswith(prefix) and entry.endswith(suffix)
    ]
    if len(versions) != 1 or not os.path.isfile(path):
        return None
    name = f"{package}.version"
    module = types.ModuleType(name)
    module.__file__ = path
    module.__version__ = versions[0]  # type: ignore[attr-defined]

    def real(attribute: str) -> object:
        # A name the primed module lacks: the real module knows it (PEP 562).  Not
        # the import system's questions (``__path__``: is it a package?).
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        spec = spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        loaded = module_from_spec(spec)
        spec.loader.exec_module(loaded)
        return getattr(loaded, attribute)

    module.__getattr__ = real  # type: ignore[method-assign]
    return module
