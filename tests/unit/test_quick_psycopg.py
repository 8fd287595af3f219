"""``dislock.cli.quick_psycopg``: the command line's processes import psycopg without
``importlib.metadata``, and psycopg still knows its version, as a module of its
package that the import system found."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

IMPLEMENTATIONS = [
    name for name in ("psycopg_binary", "psycopg_c") if importlib.util.find_spec(name) is not None
]
"""psycopg's compiled implementations installed here (psycopg alone runs on libpq
through ctypes: the tests then check psycopg's own version module only)."""


def run(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout


def test_psycopg_imported_after_dislock_cli_skips_importlib_metadata() -> None:
    checks = "".join(
        f"import {name}\n"
        f"print({name}.__version__ == metadata.version({name.replace('_', '-')!r}))\n"
        for name in IMPLEMENTATIONS
    )
    shown = run(
        "import sys\n"
        "import dislock.cli\n"
        "import psycopg\n"
        "print('importlib.metadata' in sys.modules)\n"
        "from importlib import metadata\n"
        "print(psycopg.__version__ == metadata.version('psycopg'))\n" + checks
    )
    assert shown.split() == ["False", "True"] + ["True"] * len(IMPLEMENTATIONS)


def test_without_dislock_cli_psycopg_imports_as_usual() -> None:
    # The control: the same import, not primed, does read importlib.metadata (were it
    # not to, the test above would prove nothing).
    assert run("import sys, psycopg\nprint('importlib.metadata' in sys.modules)").split() == [
        "True"
    ]


def test_the_version_module_is_psycopgs_as_the_import_system_knows_it() -> None:
    shown = run(
        "import importlib.util, sys\n"
        "import dislock.cli\n"
        "import psycopg\n"
        "print(psycopg.version is sys.modules['psycopg.version'])\n"
        "print(importlib.util.find_spec('psycopg.version').origin == psycopg.version.__file__)\n"
        "print(psycopg.version.__version__ == psycopg.__version__)\n"
        "print('importlib.metadata' in sys.modules)\n"
    )
    assert shown.split() == ["True", "True", "True", "False"]


def test_a_name_the_primed_module_lacks_comes_from_the_real_module() -> None:
    shown = run(
        "import dislock.cli\n"
        "import psycopg\n"
        "print(psycopg.version.metadata.__name__)\n"  # version.py's own import
        "try:\n"
        "    psycopg.version.no_such_name\n"
        "except AttributeError:\n"
        "    print('AttributeError')\n"
    )
    assert shown.split() == ["importlib.metadata", "AttributeError"]


@pytest.mark.parametrize("first", ["psycopg", "importlib.metadata"])
def test_psycopg_imported_first_is_left_alone(first: str) -> None:
    shown = run(
        f"import sys, {first}, psycopg\n"
        "real = sys.modules['psycopg.version']\n"
        "import dislock.cli\n"
        "print(sys.modules['psycopg.version'] is real)\n"
        "print(hasattr(real, 'metadata'))\n"  # the real module, which imported it
    )
    assert shown.split() == ["True", "True"]
