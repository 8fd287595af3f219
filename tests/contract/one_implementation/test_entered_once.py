"""One ``acquire_locks`` object (the sync API) is entered once: a second entry is refused
and leaves the first one's lease held."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dislock import LockContext
from dislock.core.rows import lease_key
from tests.support.rows import Rows


def test_one_acquisition_is_entered_once(
    make_context: Callable[..., LockContext], rows: Rows
) -> None:
    from dislock import acquire_locks

    context = make_context(run_ttl_seconds=5.0, lease_interval_seconds=1.0)
    locks = acquire_locks(context, ["lease"])
    with locks:
        with pytest.raises(RuntimeError, match="already held"):
            locks.__enter__()
        row = rows.get(lease_key(context.lock_key))
        assert row is not None and not row.expired  # still held by the first entry
    row = rows.get(lease_key(context.lock_key))
    assert row is not None and row.expired
