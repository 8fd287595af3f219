"""DSN handling and SQL composition, without a database."""

from __future__ import annotations

import pytest

from dislock.core import dsn
from dislock.core.dsn import (
    connection_kwargs,
    host_count,
    longest_connect_timeout,
    one_line,
    redact_dsn,
    scrub,
)
from dislock.core.errors import DatabaseUnreachableError
from dislock.core.lock_queries import queries
from dislock.core.rows import lease_key, schedule_key
from dislock.core.table import create_table_sql

SECRET = "pa55:w@rd"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:pa55%3Aw%40rd@db:5432/app",
        f"host=db user=app password='{SECRET}' dbname=app",
        "postgresql://app@db/app?password=pa55%3Aw%40rd",
    ],
)
def test_redacted_dsn_and_scrubbed_text_hold_no_password(url: str) -> None:
    assert SECRET not in redact_dsn(url)
    assert "host=db" in redact_dsn(url)
    assert scrub(f"failed: {SECRET} and again {SECRET}", url) == "failed: *** and again ***"


def test_every_written_form_of_the_password_is_scrubbed() -> None:
    url = "postgresql://app:p%40ss%2Fw%C3%A9rd@db/app"  # the password is p@ss/wérd
    text = "p@ss/wérd p%40ss%2Fw%C3%A9rd p%40ss%2fw%c3%a9rd p@ss%2Fwérd xp%40ss/w%C3%A9rdy"
    assert scrub(text, url) == "*** *** *** *** x***y"
    # The same in a key=value DSN's password, where no URL encodes it.
    assert scrub(f"[{text}]", "host=db password=p@ss/wérd") == "[*** *** *** *** x***y]"


def test_passwords_beside_the_url_are_scrubbed_in_every_form(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # PGPASSWORD, PGSSLPASSWORD and a password a connection used (a passfile's or a
    # service file's, ``conn.info.password``) beside a URL that has none.
    monkeypatch.setattr(dsn, "_USED", set())
    monkeypatch.setenv("PGPASSWORD", "env/p@ss")
    monkeypatch.setenv("PGSSLPASSWORD", "key-phrase")
    dsn.learn_password("file:pw!")
    dsn.learn_password(None)  # a connection without a password: nothing learned
    url = "postgresql://app@db/app"
    text = "env/p@ss env%2Fp%40ss xenv%2fp%40ssy key-phrase file:pw! file%3Apw%21 app@db"
    assert scrub(text, url) == "*** *** x***y *** *** *** app@db"
    assert scrub("env/p@ss", "") == "***"  # the default connection (libpq's variables)
    assert scrub("env/p@ss", "unparseable ' url") == "***"
    monkeypatch.delenv("PGPASSWORD")
    assert scrub("env/p@ss file:pw!", url) == "env/p@ss ***"


def test_a_short_password_is_scrubbed_as_a_whole_word_only() -> None:
    url = "postgresql://app:e%2F1@db/app"  # e/1: shorter than GLUED_LENGTH
    assert scrub("e/1 e%2f1 (e%2F1) were e/1x", url) == "*** *** (***) were e/1x"
    assert scrub("sixsix glued: xsixsixy, xsixsiy", "postgresql://a:sixsix@db") == (
        "*** glued: x***y, xsixsiy"
    )


def test_unparseable_dsn_is_never_shown() -> None:
    assert redact_dsn("postgresql//x:secret@h") == "<unparseable database URL>"
    assert "secret" not in scrub("bad dsn postgresql//x:secret@h", "postgresql//x:secret@h")


def test_connection_kwargs_disable_prepares_and_autocommit() -> None:
    kwargs = connection_kwargs("postgresql://db/app", 2.5)
    assert kwargs == {
        "autocommit": True,
        "prepare_threshold": None,
        "connect_timeout": 3,
        "application_name": "dislock",
    }


def test_connection_kwargs_leave_url_settings_alone() -> None:
    kwargs = connection_kwargs("postgresql://db/app?connect_timeout=30&application_name=x", 2)
    assert "connect_timeout" not in kwargs
    assert "application_name" not in kwargs


def test_a_patient_try_sets_its_own_timeout_bounded_by_the_url() -> None:
    url = "postgresql://db/app?connect_timeout=30"
    assert connection_kwargs(url, 2, attempt_timeout=2.5)["connect_timeout"] == 3
    assert longest_connect_timeout(url, 10) == 30
    assert longest_connect_timeout("postgresql://db/app", 10) == 10
    assert longest_connect_timeout("postgresql://db/app?connect_timeout=0", 10) == 10
    assert host_count("postgresql://db/app") == 1
    assert host_count("host=a,b,/run/postgresql port=1,2,3 dbname=app") == 3
    assert host_count("dbname=app") == 1  # libpq's default host


def test_keys_are_prefixed_by_mode() -> None:
    assert schedule_key("daily-report") == "cronjob-lock:schedule:daily-report"
    assert lease_key("importer") == "cronjob-lock:lease:importer"


def test_table_names_are_quoted_identifiers() -> None:
    hostile = 'kv"; DROP TABLE users; --'
    text = queries(("ops", hostile)).renew_batch.as_string(None)
    assert '"ops"."kv""; DROP TABLE users; --"' in text
    assert create_table_sql(("key_value",)).startswith('CREATE TABLE IF NOT EXISTS "key_value"')


def test_acquire_is_one_conditional_upsert_that_checks_the_pause() -> None:
    text = queries(("key_value",)).acquire_for.as_string(None)
    # One statement: the lock-delay check and the pause ride along as common
    # table expressions; the row is inserted or taken over by the upsert.
    assert text.count(";") == 0 and text.startswith("WITH dislock_server AS (")
    assert "pause AS (" in text
    assert "INSERT INTO" in text and "ON CONFLICT (key) DO UPDATE" in text
    assert "WHERE held.expire_at <= NOW()" in text
    assert "WHERE NOT EXISTS (SELECT FROM pause)" in text
    # No read of the lock row itself comes first: the upsert decides.
    assert text.count("SELECT value, expire_at FROM") == 1 and "key = %(pause)s" in text


def test_a_slot_is_only_claimed_while_it_lasts() -> None:
    text = queries(("key_value",)).acquire_until.as_string(None)
    assert "NOT EXISTS (SELECT FROM pause)" in text
    assert "WHERE %(expire_at)s::timestamptz > NOW()" in text
    assert "WHERE held.expire_at <= NOW()" in text


def test_renewal_and_release_are_guarded_by_owner_and_expiry() -> None:
    stmts = queries(("key_value",))
    assert "held.value = batch.value" in stmts.renew_batch.as_string(None)
    assert "value = %(owner)s" in stmts.release.as_string(None)
    for statement in (stmts.renew_batch, stmts.release):
        assert "expire_at > NOW()" in statement.as_string(None)


def test_a_release_and_a_hand_back_wake_the_waiters_of_the_lease() -> None:
    from dislock.core.lock_statements import statements
    from dislock.core.rows import lease_key, schedule_key
    from dislock.core.waiting import WAKE_CHANNEL, wake_key

    stmts = queries(("key_value",))
    exchanges = statements(("key_value",))
    for statement in (stmts.release, stmts.hand_back):
        text = statement.as_string(None)
        assert "pg_notify(%(channel)s" in text and "%(wake_key)s" in text
        assert "value = %(owner)s" in text and "expire_at > NOW()" in text
    assert "key = ANY(%(keys)s" in stmts.hand_back.as_string(None)
    released = exchanges.release(lease_key("job"), "owner-1", "job").params
    assert released["key"] == lease_key("job") and released["wake_key"] == wake_key("job")
    slots = [lease_key("job"), f"{lease_key('job')}#2"]
    for keys in (slots, [schedule_key("job")]):
        params = exchanges.hand_back(keys, "owner-1", "job").params
        assert params["keys"] == keys and params["owner"] == "owner-1"
        assert params["channel"] == WAKE_CHANNEL and params["wake_key"] == wake_key("job")


def test_renewals_only_touch_expire_at() -> None:
    # The HOT-update premise: no indexed column changes.
    text = queries(("key_value",)).renew_batch.as_string(None)
    assignments = text.split(" SET ")[1].split(" FROM ")[0]
    assert assignments.startswith("expire_at =") and "," not in assignments.split("(")[0]


def test_a_short_password_does_not_mangle_the_message() -> None:
    from dislock.cli.diagnosis import describe_database_error

    error = OSError("connection failed: server closed the connection unexpectedly")
    message = describe_database_error(
        error, table_parts=("key_value",), url="postgresql://u:e@db.example/app"
    )
    assert "connection failed: server closed the connection unexpectedly" in message


@pytest.mark.parametrize(
    ("message", "line"),
    [
        # libpq's refusal and its hint, two sentences on two lines
        (
            'connection failed: connection to server at "127.0.0.1", port 1 failed:'
            " Connection refused\n\tIs the server running on that host and accepting"
            " TCP/IP connections?\n",
            'connection failed: connection to server at "127.0.0.1", port 1 failed:'
            " Connection refused. Is the server running on that host and accepting"
            " TCP/IP connections?",
        ),
        # several hosts: a line ending in ":" goes on with a space; list items with "; "
        (
            "connection timeout expired\nMultiple connection attempts failed. All failures"
            " were:\n- host: 'a', port: '5432': connection timeout expired\n- host: 'b',"
            " port: '5432': session is read-only",
            "connection timeout expired. Multiple connection attempts failed. All failures"
            " were: - host: 'a', port: '5432': connection timeout expired; - host: 'b',"
            " port: '5432': session is read-only",
        ),
        ("one  line\twith   blanks", "one line with blanks"),
        (
            "duplicate key\n\nDETAIL:  Key (key)=(k) exists.",
            "duplicate key. DETAIL: Key (key)=(k) exists.",
        ),
        ("", ""),
    ],
)
def test_a_message_of_several_lines_is_one_line_with_separators(message: str, line: str) -> None:
    assert one_line(message) == line


def test_one_attempt_is_not_attempts() -> None:
    from dislock.cli.diagnosis import describe_database_error

    def message(attempts: int, lost: str | None = None) -> str:
        error = DatabaseUnreachableError(
            "x",
            detail="Connection refused",
            unreachable_for=0.5,
            attempts=attempts,
            patience=0.5,
            lost_answer_of=lost,
        )
        return describe_database_error(error, table_parts=("key_value",), url="postgresql://h/d")

    assert "unreachable for 0.5 s, 1 attempt (LOCK_CONNECT_PATIENCE_SECONDS=0.5)" in message(1)
    assert "unreachable for 0.5 s, 2 attempts (LOCK_CONNECT" in message(2)
    assert "unreachable for 0.5 s, 1 attempt (LOCK_CONNECT" in message(1, "lease 'k'")
    assert "1 attempts" not in message(1) + message(1, "lease 'k'")


def test_statements_are_rendered_once_per_connection() -> None:
    from dislock.core.exchange import Rendered

    render = Rendered(None)
    stmts = queries(("ops", "locks"))
    first = render(stmts.release)
    assert first == stmts.release.as_bytes(None) and b'"ops"."locks"' in first
    assert render(stmts.release) is first  # not rendered again
    other = queries(("ops", "other")).release
    assert render(other) != first
    for n in range(Rendered.LIMIT + 1):  # a bounded cache: it starts over when full
        render(queries((f"t{n}",)).release)
    assert len(render._by_id) <= Rendered.LIMIT
