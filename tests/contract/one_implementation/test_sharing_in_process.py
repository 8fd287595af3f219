"""The shared connection inside one Python process: a forked child never uses the
parent's, and a lease whose renewer cannot start is handed back."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from dislock import LockContext
from dislock.core.rows import lease_key
from tests.support.backends import backends, settled_backends
from tests.support.eventually import eventually
from tests.support.rows import Rows

MakeContext = Callable[..., LockContext]
LEASE = {"run_ttl_seconds": 1.5, "lease_interval_seconds": 0.2}

pytestmark = [pytest.mark.needs("python-api"), pytest.mark.direct_postgres]


def test_a_forked_child_never_uses_the_parents_connection(
    make_context: MakeContext,
    rows: Rows,
    db: psycopg.Connection[Any],
    tagged_url: str,
) -> None:
    """Sync only: a child forked while the parent holds a lease takes its own locks
    on its own connection, and the parent's session carries on untouched."""
    import dislock

    with dislock.LeaseLock(make_context(url=tagged_url, lock_key="parent", **LEASE)) as lock:
        (parent_backend,) = backends(db, tagged_url)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
            child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child
            code = 1
            try:
                with dislock.LeaseLock(make_context(url=tagged_url, lock_key="child", **LEASE)):
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # Renewals go on in the parent: for a whole TTL past where its row stood.
        stood = rows.get(lease_key("parent"))
        assert stood is not None
        a_ttl_on = stood.expire_at + timedelta(seconds=LEASE["run_ttl_seconds"])
        eventually(
            lambda: (
                (row := rows.get(lease_key("parent"))) is not None and row.expire_at >= a_ttl_on
            ),
            message="the parent's renewals stopped after the fork",
        )
        assert not lock.is_lost()
        assert settled_backends(db, tagged_url, lambda found: len(found) == 1) == [parent_backend]
    child_row, parent_row = rows.get(lease_key("child")), rows.get(lease_key("parent"))
    assert child_row is not None and child_row.expired  # taken and released by the child
    assert parent_row is not None and parent_row.expired


def test_a_lease_whose_renewer_cannot_start_is_handed_back(
    make_context: MakeContext,
    rows: Rows,
    db: psycopg.Connection[Any],
    tagged_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sync only: when no thread can be started (a process at its limits), entering
    fails, the row just taken is released and the connection is not leaked."""
    import dislock
    import dislock._sync._renewer as renewer_module
    from dislock._sync._compat import local_registry

    def no_thread(target: Callable[[], None], name: str) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(renewer_module, "spawn", no_thread)
    context = make_context(url=tagged_url, **LEASE)
    with pytest.raises(RuntimeError, match="new thread"):
        dislock.LeaseLock(context).__enter__()
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and row.expired
    assert settled_backends(db, tagged_url, lambda found: not found) == []
    assert tagged_url not in local_registry().hubs
