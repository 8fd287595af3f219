"""A call of the acquiring function by hand stores no lock row without an end (security
review #61, N5): no TTL and no slot end, an infinite or NaN TTL, an infinite slot end or
one at or past 9999-12-31 (where a metadata row's "never" is) are refused, nothing written."""

from __future__ import annotations

import psycopg
import pytest

from tests.security.conftest import Fleet
from tests.security.test_lock_functions import acquire, snapshot

ENDLESS = [
    # (expire_at, ttl): a row without an end, or no end at all; each refused (#61, N5)
    (None, None),
    ("infinity", None),
    ("-infinity", None),
    ("294276-01-01 00:00:00+00", None),
    ("9999-12-31 00:00:00+00", None),
    (None, float("nan")),
    (None, float("inf")),
    (None, 0.0),
    (None, -5.0),
    ("2100-01-01 00:00:00+00", 30.0),
]


@pytest.mark.parametrize(("expire_at", "ttl"), ENDLESS)
def test_a_call_by_hand_stores_no_expiry_without_an_end(
    fleet: Fleet, expire_at: str | None, ttl: float | None
) -> None:
    mode = "schedule" if ttl is None else "lease"
    key, pause = f"cronjob-lock:{mode}:billing-x", "cronjob-lock:pause:billing-x"
    before = snapshot(fleet)
    with (
        fleet.connect(fleet.billing) as billing,
        pytest.raises(psycopg.errors.InvalidParameterValue, match="TTL of more than 0"),
    ):
        acquire(billing, fleet, key, pause, expire_at=expire_at, ttl=ttl)
    assert snapshot(fleet) == before
    # The same calls with an end take the row: only the endless one is refused.
    with fleet.connect(fleet.billing) as billing:
        ends = {"expire_at": "2100-01-01 00:00:00+00", "ttl": None} if ttl is None else {}
        assert acquire(billing, fleet, key, pause, **ends)[0] is True
