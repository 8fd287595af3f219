"""A refusal's hint never advises granting one team another's keys: a key another role's
grant covers is named as that role's, for its team or the table's owner to act on."""

from __future__ import annotations

import uuid

from dislock import LeaseLock, LockContext
from tests.security.conftest import BILLING_ROLE, REPORTS_ROLE, Fleet, ctl


def test_releasing_another_teams_key_names_its_role_not_a_grant_of_it(fleet: Fleet) -> None:
    theirs = f"reports-{uuid.uuid4().hex[:8]}"
    table = ".".join(fleet.table)
    context = LockContext(
        url=fleet.reports, table_parts=list(fleet.table), lock_key=theirs, run_ttl_seconds=30.0
    )
    with LeaseLock(context):
        status, out, err = ctl(fleet.billing, "release", theirs, table=fleet.table)
    assert status == 1, out
    assert err.startswith("dislockctl: error: release: permission denied: "), err
    assert err.endswith(
        f" for role {BILLING_ROLE} (row-level security is on: {theirs!r} is a key of role"
        f" {REPORTS_ROLE}: ask that team, or the table's owner, to run it,"
        " see docs/security.md)\n"
    ), err
    assert "grant " not in err and table in err


def test_releasing_a_key_nobodys_grant_covers_is_told_the_grant(fleet: Fleet) -> None:
    """The negative control: the same refusal for a key no role claims still names the
    operator's grant that would let billing release it."""
    nobodys = f"payroll-{uuid.uuid4().hex[:8]}"
    status, _, err = ctl(fleet.billing, "release", nobodys, table=fleet.table)
    assert status == 1
    assert err.endswith(
        f"(row-level security is on: as the table's owner, dislockctl URL_VARIABLE grant"
        f" {BILLING_ROLE} --operator --keys 'billing-*' --keys 'reports-nightly'"
        f" --keys '{nobodys}', see docs/security.md)\n"
    ), err
