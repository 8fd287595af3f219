"""The failover decisions of dislock.core.failover and dislock.cli.admin, without a server."""

from __future__ import annotations

from dislock.cli.admin import read_only_reason
from dislock.core.errors import NotReplicatedError
from dislock.core.failover import (
    SYNCREP_FUNCTION,
    not_replicated,
    timeline_change,
    unconfirmed,
)
from dislock.core.lock_queries import queries

CANCELLED = "canceling wait for synchronous replication due to user request"


def test_the_syncrep_warning_means_not_replicated_whatever_its_language() -> None:
    assert not_replicated(severity="WARNING", source_function=SYNCREP_FUNCTION, message=CANCELLED)
    translated = "Warten auf synchrone Replikation abgebrochen"
    assert not_replicated(severity="WARNING", source_function=SYNCREP_FUNCTION, message=translated)
    # terminating, not cancelling: the same function, another reason
    shutdown = "canceling the wait for synchronous replication and terminating connection"
    assert not_replicated(severity="WARNING", source_function=SYNCREP_FUNCTION, message=shutdown)


def test_without_source_locations_the_english_message_is_recognised() -> None:
    assert not_replicated(severity="WARNING", source_function=None, message=CANCELLED)
    assert not not_replicated(severity="WARNING", source_function=None, message="something else")


def test_other_notices_are_not_about_replication() -> None:
    assert not not_replicated(
        severity="NOTICE", source_function=SYNCREP_FUNCTION, message=CANCELLED
    )
    assert not not_replicated(
        severity="WARNING", source_function="ExecInsert", message="synchronous replication"
    )


def test_unconfirmed_is_a_not_replicated_error_with_the_servers_words() -> None:
    error = unconfirmed(CANCELLED)
    assert isinstance(error, NotReplicatedError)
    assert CANCELLED in str(error) and "no synchronous standby confirmed it" in str(error)


def test_a_holder_warns_only_when_the_timeline_changed() -> None:
    assert timeline_change(1, 1) is None
    assert timeline_change(None, 2) is None
    assert timeline_change(1, None) is None
    message = timeline_change(1, 2)
    assert message is not None and "timeline 2" in message and "timeline 1" in message


def test_check_explains_a_standby_and_a_read_only_session() -> None:
    assert read_only_reason(in_recovery=False, read_only=False) is None
    standby = read_only_reason(in_recovery=True, read_only=True)
    assert standby is not None and "standby" in standby
    assert "target_session_attrs=read-write" in standby
    session = read_only_reason(in_recovery=False, read_only=True)
    assert session is not None and "default_transaction_read_only" in session


def test_both_acquisitions_carry_the_lock_delay_and_renewals_do_not() -> None:
    stmts = queries(("key_value",), True)
    for statement in (stmts.acquire_for, stmts.acquire_until):
        text = statement.as_string(None)
        assert "pg_walfile_name(pg_current_wal_lsn())" in text
        assert "(SELECT calm FROM dislock_calm)" in text
        assert "RETURNING held.fence, (SELECT timeline FROM dislock_server)" in text
        assert text.startswith("WITH dislock_server AS (")  # data-modifying CTEs on top
    for statement in (stmts.renew_batch, stmts.release):
        assert "dislock_" not in statement.as_string(None)


def test_the_max_ttl_row_never_expires_as_an_open_pause_does() -> None:
    # A finite far-future end that every server can subtract NOW() from (not 'infinity').
    from datetime import datetime

    from dislock.core.limits import NEVER_EXPIRES
    from dislock.core.pause import UNTIL_RESUMED

    assert datetime.fromisoformat(NEVER_EXPIRES) == UNTIL_RESUMED
