"""How the measures run the ``dislock`` wrapper, and the floor they compare it with.

The floor is the least any wrapper run must do: start Python, import psycopg,
connect, run ``SELECT 1`` and exit.  The wrapper does all that too, then takes
the lock, runs the command and releases.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

FLOOR = "import os, psycopg; psycopg.connect(os.environ['DATABASE_URL']).execute('SELECT 1')"


def editable_dislock() -> str:
    """The ``dislock`` command of this environment (the checkout, editable)."""
    return str(Path(sys.executable).parent / "dislock")


def wrapper_env(url: str, strategy: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "LOCK_KEY": f"bench-{uuid.uuid4().hex[:10]}",  # a fresh lock: every run takes it
        "LOCK_STRATEGY": strategy,
        "CRON_SCHEDULE": "* * * * *",
        "RUN_LOCK_TTL_SECONDS": "60",
    }
    return env


def floor_environment(url: str) -> dict[str, str]:
    return {**os.environ, "DATABASE_URL": url}
