"""A fleet moving to roles while some machines still run dislock 0.1.0: a 0.1.0 wrapper
on a granted role locks the role's keys as before, and the server holds it to them.

0.1.0 knows nothing of grants; the policies judge the rows it writes like anyone's.
"""

from __future__ import annotations

import os
import subprocess
import uuid

import pytest
from psycopg import sql

from tests.security.conftest import BILLING_ROLE, Fleet, plain_writes
from tests.support.old_release import PyPIUnreachable, old_dislock_venv

pytestmark = pytest.mark.slow  # a download on the first run


@pytest.fixture(scope="session")
def old_wrapper() -> list[str]:
    try:
        return [str(old_dislock_venv() / "bin" / "python"), "-m", "dislock"]
    except PyPIUnreachable as exc:
        pytest.skip(f"{exc}; the tests of a mixed 0.1.0/0.2.0 fleet need it")


def run_old(
    wrapper: list[str], fleet: Fleet, url: str, key: str
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "LOCK_KEY": key,
        "LOCK_STRATEGY": "lease",
        "RUN_LOCK_TTL_SECONDS": "30",
        "LOCK_TABLE": ".".join(fleet.table),
    }
    return subprocess.run(
        [*wrapper, "DATABASE_URL", "true"], env=env, capture_output=True, text=True, timeout=60
    )


def rows_of(fleet: Fleet, key: str) -> list[tuple[str]]:
    with fleet.connect(fleet.admin_url) as admin:
        return admin.execute(
            sql.SQL("SELECT key FROM {} WHERE key LIKE %s").format(sql.Identifier(*fleet.table)),
            (f"%:{key}",),
        ).fetchall()


def test_a_010_wrapper_locks_its_roles_keys_only(old_wrapper: list[str], fleet: Fleet) -> None:
    # 0.1.0 writes the table itself: its role is granted so (docs/migrating.md).
    plain_writes(fleet, BILLING_ROLE)
    mine = f"billing-{uuid.uuid4().hex[:8]}"
    done = run_old(old_wrapper, fleet, fleet.billing, mine)
    assert done.returncode == 0, done.stderr
    assert rows_of(fleet, mine) == [(f"cronjob-lock:lease:{mine}",)]

    theirs = f"payroll-{uuid.uuid4().hex[:8]}"
    refused = run_old(old_wrapper, fleet, fleet.billing, theirs)
    assert refused.returncode != 0
    assert rows_of(fleet, theirs) == []
