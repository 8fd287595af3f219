"""Contract: the answers a failover gives for a moment are ridden out within the
connect patience, like a refused connection, each try on a fresh connection: a
server that answers read-only (a standby, a demoting primary a proxy still routes
to) and an acquisition synchronous replication did not confirm (handed back).  Past
the patience they are reported as before, saying for how long; without patience,
at once, as before.  Both are made for real: a role whose sessions are read-only
(``default_transaction_read_only``, the answer a standby gives), and a commit that
waits for a synchronous standby that does not exist, the wait cancelled by the
acquisition's statement timeout."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from dislock import LockContext, NotReplicatedError
from dislock.core.rows import lease_key, schedule_key
from tests.support.drivers import CliDriver, Driver, Holding
from tests.support.eventually import eventually
from tests.support.rows import Rows

MakeContext = Callable[..., LockContext]
LIMIT = 20
READ_ONLY = "the database is read-only (cannot execute "
RIDING_OUT = "trying again in"
"""What a lock logs (INFO) as it rides out an answer."""

# Behind the CI's PgBouncer every client is the pooler's one server role.
pytestmark = pytest.mark.direct_postgres


def set_for_role(db: psycopg.Connection[Any], url: str, setting: str, value: str | None) -> None:
    """``ALTER ROLE`` the URL's role: new sessions take it (None: reset it)."""
    role = sql.Identifier(str(conninfo_to_dict(url)["user"]))
    name = sql.Identifier(setting)
    if value is None:
        db.execute(sql.SQL("ALTER ROLE {} RESET {}").format(role, name))
    else:
        db.execute(sql.SQL("ALTER ROLE {} SET {} = {}").format(role, name, sql.Literal(value)))


def said(driver: Driver, caplog: pytest.LogCaptureFixture) -> str:
    """What the lock has logged so far (the wrapper's stderr, as it runs)."""
    if isinstance(driver, CliDriver):
        path = driver.hold_stderr
        return path.read_text() if path is not None and path.exists() else ""
    return caplog.text


def failure(driver: Driver, context: LockContext, strategy: str = "lease") -> Exception:
    """The error ``hold`` raises (the CLI's: ``dislock exited <status>: <stderr>``)."""
    try:
        holding = driver.hold(context, [strategy])
    except Exception as exc:
        return exc
    holding.release()
    raise AssertionError("the lock was taken")


def ridden_out(
    driver: Driver,
    context: LockContext,
    strategy: str,
    caplog: pytest.LogCaptureFixture,
    recover: Callable[[], None],
) -> Holding:
    """``hold`` in a thread: once the lock says it rides an answer out (it cannot
    have taken the lock by then, nor failed), ``recover``; the holding it then gets."""
    outcome: list[Holding | BaseException] = []

    def take() -> None:
        try:
            outcome.append(driver.hold(context, [strategy]))
        except BaseException as exc:
            outcome.append(exc)

    taker = threading.Thread(target=take)
    taker.start()
    try:
        eventually(
            lambda: RIDING_OUT in said(driver, caplog) or outcome,
            timeout=90,
            message="the lock neither rode out the answer nor returned",
        )
        assert outcome == []  # still trying: neither failed nor "held elsewhere"
    finally:
        recover()
        taker.join(90)
    assert len(outcome) == 1 and isinstance(outcome[0], Holding), outcome
    return outcome[0]


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="dislock")
    return caplog


@pytest.mark.parametrize("strategy", ["lease", "schedule"])
def test_a_read_only_server_is_ridden_out_then_the_lock_taken(
    driver: Driver,
    make_context: MakeContext,
    rows: Rows,
    db: psycopg.Connection[Any],
    limited_url: str,
    logged: pytest.LogCaptureFixture,
    strategy: str,
) -> None:
    context = make_context(
        url=limited_url,
        schedule="0 0 1 1 *",
        run_ttl_seconds=10,
        lease_interval_seconds=1,
        connect_patience_seconds=60,
    )
    set_for_role(db, limited_url, "default_transaction_read_only", "on")
    holding = ridden_out(
        driver,
        context,
        strategy,
        logged,
        lambda: set_for_role(db, limited_url, "default_transaction_read_only", None),
    )
    try:
        key = lease_key(context.lock_key) if strategy == "lease" else schedule_key(context.lock_key)
        row = rows.get(key)
        assert row is not None and not row.expired
    finally:
        holding.release()


@pytest.mark.parametrize("patience", [0.0, 2.0])
def test_a_server_that_stays_read_only_is_reported_once_the_patience_is_spent(
    driver: Driver,
    make_context: MakeContext,
    db: psycopg.Connection[Any],
    limited_url: str,
    logged: pytest.LogCaptureFixture,
    patience: float,
) -> None:
    """Without patience, at once and in today's words; with some, once it is spent
    (not before), saying for how long; the advice stays the same."""
    context = make_context(
        url=limited_url,
        run_ttl_seconds=10,
        lease_interval_seconds=1,
        connect_patience_seconds=patience,
    )
    set_for_role(db, limited_url, "default_transaction_read_only", "on")
    started = time.monotonic()
    error = failure(driver, context)
    assert time.monotonic() - started >= patience  # it did not give up early
    message = str(error)
    assert " in a read-only transaction" in message, message
    if isinstance(driver, CliDriver):
        assert message.startswith("dislock exited 1: ") and READ_ONLY in message, message
        assert message.count("dislock: error: ") == 1
        assert message.endswith("; point the URL at the primary, not a replica\n"), message
    else:
        assert isinstance(error, psycopg.errors.ReadOnlySqlTransaction), repr(error)
        assert message.startswith("cannot execute "), message
    if patience == 0:
        assert RIDING_OUT not in said(driver, logged)
        assert "answered so for" not in message
    else:
        assert RIDING_OUT in said(driver, logged)
        assert f"within a connect patience of {patience:g} s)" in message


@pytest.fixture
def synchronous_standby_nowhere(db: psycopg.Connection[Any], database_url: str) -> Iterator[None]:
    """Every commit of the server waits for a standby that does not exist: only on a
    server of the test run's own (each worker's embedded one), since on a server that
    TEST_DATABASE_URL names another worker's commits would wait too."""
    from tests.support.replication import synchronous_standby_nowhere

    if os.environ.get("TEST_DATABASE_URL"):
        pytest.skip("changes the whole server's synchronous_standby_names: embedded server only")

    with synchronous_standby_nowhere(db, database_url):
        yield


@pytest.mark.parametrize("patience", [0.0, 60.0])
def test_an_acquisition_replication_did_not_confirm_is_ridden_out(
    driver: Driver,
    make_context: MakeContext,
    rows: Rows,
    db: psycopg.Connection[Any],
    limited_url: str,
    logged: pytest.LogCaptureFixture,
    synchronous_standby_nowhere: None,
    patience: float,
) -> None:
    """Handed back, then tried again once the role's commits stop waiting for the
    standby (as once a failover reached a primary whose standby confirms); without
    patience, reported at once, as before."""
    context = make_context(
        url=limited_url,
        run_ttl_seconds=10,
        lease_interval_seconds=1,
        connect_patience_seconds=patience,
    )
    if patience == 0:
        error = failure(driver, context)
        if isinstance(driver, CliDriver):
            assert str(error).startswith("dislock exited 1: "), error
        else:
            assert isinstance(error, NotReplicatedError), repr(error)
        assert "was not acquired (handed back)" in str(error)
        assert RIDING_OUT not in said(driver, logged)
        return
    holding = ridden_out(
        driver,
        context,
        "lease",
        logged,
        lambda: set_for_role(db, limited_url, "synchronous_commit", "local"),
    )
    try:
        assert "was not acquired (handed back)" in said(driver, logged)
        row = rows.get(lease_key(context.lock_key))
        assert row is not None and not row.expired
    finally:
        holding.release()
