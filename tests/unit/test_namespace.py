"""The ``dislock`` namespace: every name resolved on first use, nothing imported before."""

from __future__ import annotations

import subprocess
import sys

import pytest

import dislock


def test_core_names_are_exported() -> None:
    for name in ("LockContext", "LeaseLossPolicy", "LEASE_LOST_EXIT_CODE", "DislockError"):
        assert hasattr(dislock, name)
    assert dislock.LEASE_LOST_EXIT_CODE == 75


def test_importing_dislock_imports_neither_psycopg_nor_a_flavour() -> None:
    code = (
        "import sys, dislock\n"
        "assert 'psycopg' not in sys.modules, 'psycopg'\n"
        "assert 'dislock.core.public' not in sys.modules\n"
        "from dislock import LockContext\n"
        "assert 'psycopg' in sys.modules and 'dislock._sync' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_core_names_module_lists_what_public_exports() -> None:
    from dislock.core import public

    CORE_NAMES = dislock._CORE_NAMES

    assert _public(public) == set(CORE_NAMES)


def test_sync_names_resolve_lazily() -> None:
    code = (
        "import sys, dislock\n"
        "assert 'dislock._sync' not in sys.modules\n"
        "from dislock import ScheduleLock\n"
        "assert 'dislock._sync' in sys.modules\n"
        "assert 'dislock.aio' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_sync_distribution_names_the_install_command() -> None:
    code = (
        "import sys\n"
        "sys.modules['dislock._sync'] = None  # as if the dislock wheel were absent\n"
        "try:\n"
        "    from dislock import ScheduleLock\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    )
    assert "pip install dislock" in result.stdout


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        dislock.NoSuchThing  # noqa: B018


def _public(module: object) -> set[str]:
    """What ``from module import *`` would give without ``__all__``: the public
    names, less the submodules the package happens to have loaded."""
    return {
        name
        for name in vars(module)
        if not name.startswith("_") and not isinstance(getattr(module, name), type(sys))
    }


def test_every_flavour_exports_exactly_the_listed_names() -> None:
    import dislock._sync
    import dislock.aio

    CORE_NAMES, LOCK_NAMES = dislock._CORE_NAMES, dislock._LOCK_NAMES

    expected = {*CORE_NAMES, *LOCK_NAMES}
    assert len(expected) == len(CORE_NAMES) + len(LOCK_NAMES)
    for module in (dislock, dislock.aio, dislock._sync):
        assert sorted(module.__all__) == sorted(expected), module.__name__
        for name in expected:
            assert getattr(module, name) is not None, (module.__name__, name)
    # Nothing public beyond the lists (a name added to a module but not to them).
    assert _public(dislock.aio) == expected
    assert _public(dislock._sync) == expected
    # One object per name: the core's everywhere, the sync flavour's in dislock.
    for name in CORE_NAMES:
        assert getattr(dislock.aio, name) is getattr(dislock, name) is getattr(dislock._sync, name)
    for name in LOCK_NAMES:
        assert getattr(dislock, name) is getattr(dislock._sync, name)
        assert getattr(dislock.aio, name) is not getattr(dislock._sync, name)


def test_aio_users_need_no_other_import() -> None:
    from dislock.aio import (  # noqa: F401
        LEASE_LOST_EXIT_CODE,
        ConfigurationError,
        LeaseLossPolicy,
        LeaseLostError,
        LockContext,
        LockNotAcquiredError,
    )

    assert LockContext is dislock.LockContext


def test_dir_shows_the_api_and_no_helpers() -> None:
    CORE_NAMES, LOCK_NAMES = dislock._CORE_NAMES, dislock._LOCK_NAMES

    listed = dir(dislock)
    assert {*CORE_NAMES, *LOCK_NAMES} <= set(listed)
    assert "__version__" in listed
    extra = {name for name in listed if not name.startswith("__")} - {*CORE_NAMES, *LOCK_NAMES}
    assert extra == set(), extra  # e.g. Any, TYPE_CHECKING, extend_path


def test_the_names_for_type_checkers_are_the_lock_names() -> None:
    # dislock/__init__.py imports the sync names under TYPE_CHECKING, for type
    # checkers that cannot follow __getattr__: the same list.
    import ast
    from pathlib import Path

    LOCK_NAMES = dislock._LOCK_NAMES

    tree = ast.parse(Path(dislock.__file__).read_text())
    guarded = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    )
    imported = {
        alias.asname or alias.name
        for node in guarded.body
        if isinstance(node, ast.ImportFrom) and node.module == "dislock._sync"
        for alias in node.names
    }
    assert imported == set(LOCK_NAMES)
