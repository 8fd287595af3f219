"""The ``dislock`` namespace: core names eager, sync names lazy."""

from __future__ import annotations

import subprocess
import sys

import pytest

import dislock


def test_core_names_are_exported() -> None:
    for name in ("LockContext", "LeaseLossPolicy", "LEASE_LOST_EXIT_CODE", "DislockError"):
        assert hasattr(dislock, name)
    assert dislock.LEASE_LOST_EXIT_CODE == 75


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
