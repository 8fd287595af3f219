"""``dislock.cli.quick_psycopg``: the command line's processes import psycopg without
``importlib.metadata``, and psycopg still knows its version."""

from __future__ import annotations

import subprocess
import sys


def run(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout


def test_psycopg_imported_after_dislock_cli_skips_importlib_metadata() -> None:
    shown = run(
        "import sys\n"
        "import dislock.cli\n"
        "import psycopg, psycopg_binary\n"
        "print('importlib.metadata' in sys.modules)\n"
        "from importlib import metadata\n"
        "print(psycopg.__version__ == metadata.version('psycopg'))\n"
        "print(psycopg_binary.__version__ == metadata.version('psycopg-binary'))\n"
    )
    assert shown.split() == ["False", "True", "True"]


def test_without_dislock_cli_psycopg_imports_as_usual() -> None:
    # The control: the same import, not primed, does read importlib.metadata (were it
    # not to, the test above would prove nothing).
    assert run("import sys, psycopg\nprint('importlib.metadata' in sys.modules)").split() == [
        "True"
    ]


def test_a_name_the_primed_module_lacks_comes_from_the_real_module() -> None:
    shown = run(
        "import sys\n"
        "import dislock.cli\n"
        "version = sys.modules['psycopg.version']\n"
        "print(version.metadata.__name__)\n"  # version.py's own import
        "try:\n"
        "    version.no_such_name\n"
        "except AttributeError:\n"
        "    print('AttributeError')\n"
    )
    assert shown.split() == ["importlib.metadata", "AttributeError"]


def test_psycopg_imported_first_is_left_alone() -> None:
    shown = run(
        "import sys, psycopg\n"
        "real = sys.modules['psycopg.version']\n"
        "import dislock.cli\n"
        "print(sys.modules['psycopg.version'] is real)\n"
    )
    assert shown.split() == ["True"]
