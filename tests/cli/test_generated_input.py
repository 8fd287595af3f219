"""Generated input (Hypothesis): every value either works or is refused in one line.

Wrapper environments, ``LockContext`` arguments and ``dislockctl`` arguments are
generated, with URLs carrying odd passwords.  The property: a run that behaves as
documented (the command ran; or exit 1 with one line for a database failure), or a
refusal with exit 2 / ``ConfigurationError`` in one line; never a traceback, never
the password, never a row written by a refused run.

Most examples call ``dislock.cli.wrapper.command.main`` and ``dislock.cli.ctl.main`` in-process
(a subprocess per example would take minutes); ``test_configuration.py`` runs the
regression cases through the real console script.  The example budget is fixed
(``BUDGET``) and the examples derandomized, so every CI leg tries the same cases in
about the same time.  Failures Hypothesis found are kept as ``@example``s.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from datetime import timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import dislock
import dislock.cli.ctl
import dislock.cli.wrapper.command
from dislock import ConfigurationError, LockContext
from dislock.core.bounds import escape
from dislock.core.rows import lease_key, schedule_key

BUDGET = {"wrapper": 150, "context": 300, "ctl": 120}
"""Examples per property and CI run (derandomized: the same ones every run)."""

MARK = "sEcret-7f3"  # in every generated password, and in no other generated text


EXPLORE = int(os.environ.get("TEST_FUZZ_EXPLORE", "0") or 0)
"""``TEST_FUZZ_EXPLORE=10``: ten times the budget, new random examples each run
(for looking for new failures by hand; CI runs the fixed budget)."""


def _settings(name: str) -> settings:
    return settings(
        max_examples=BUDGET[name] * max(1, EXPLORE),
        deadline=None,
        derandomize=not EXPLORE,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


NASTY = ["\n", "\r", "\t", "\x00", "\x1b", "\u202e", "\u2028", "\udcff", "é", "🎉", "'", '"']
NASTY += ["%", "\\", "@", ":", "/", "?", "#", "=", " ", "&"]
odd_text = st.text(st.one_of(st.characters(), st.sampled_from(NASTY)), max_size=24)

# libpq cannot carry a NUL in any parameter, so no password holds one.
passwords = st.text(
    st.one_of(st.characters(codec="utf-8", exclude_characters="\x00"), st.sampled_from(NASTY[5:])),
    max_size=12,
).map(lambda middle: f"p{middle}{MARK}")


def _one_line(line: str) -> bool:
    """No control, format or separator character: what prints as one line, honestly."""
    return escape(line) == line


def _leaks(text: str, password: str) -> bool:
    return any(form in text for form in (password, quote(password, safe=""), MARK))


def with_password(url: str, password: str, style: str, extra: str) -> str:
    """The test database's URL carrying ``password`` (trust authentication ignores it)."""
    params = conninfo_to_dict(url)
    if style == "dsn":
        params["password"] = password
        return make_conninfo("", **params) + extra
    host = str(params.pop("host", ""))
    user = str(params.pop("user", "postgres"))
    port = str(params.pop("port", ""))
    dbname = str(params.pop("dbname", "postgres"))
    query = "&".join(f"{key}={quote(str(value), safe='')}" for key, value in params.items())
    if host.startswith("/"):
        query = "&".join(filter(None, [f"host={quote(host, safe='')}", query]))
        host = ""
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}" + (
        f":{port}" if port else ""
    )
    return f"postgresql://{netloc}/{dbname}" + (f"?{query}" if query else "") + extra


url_extras = st.sampled_from(
    ["", "", "", " ", "&application_name=a%20b", "&connect_timeout=3", "&sslmode=disable"]
)

numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["", " ", "abc", "1e400", "-0", "1_000", " 5 ", "0x10", "٣", "1e12", "0.05"]),
    st.floats(min_value=0.1, max_value=120).map(lambda value: f"{value:.3f}"),
)
# A valid jitter is slept: keep those tiny; out-of-range ones are refused first.
jitters = st.one_of(
    st.sampled_from(["", "0", "0.001", "-1", "1e9", "nan", "inf", "abc", "3600.5", "1e400"]),
    st.floats(min_value=3600.001, allow_infinity=False).map(str),
    st.floats(max_value=-1e-9, allow_infinity=False).map(str),
)
schedules = st.one_of(
    st.sampled_from(
        [
            "* * * * *",
            "*/5 * * * *",
            "0 3 * * *",
            "0 0 29 2 *",
            "* * * * * */10",
            "0 0 30 2 *",
            "0 0 1 1 * 0 2020",
            "@hourly",
            "*/0 * * * *",
            "61 * * * *",
            "0 9-17 * * 1-5",
            "",
            "daily",
        ]
    ),
    st.lists(
        st.sampled_from(
            [
                "*",
                "*/7",
                "0",
                "59",
                "60",
                "1-5",
                "5-1",
                "L",
                "?",
                "a",
                "-1",
                "1,2",
                "H",
                "*/0",
                "0-0",
            ]
        ),
        min_size=4,
        max_size=7,
    ).map(" ".join),
    odd_text,
)
zones = st.one_of(
    st.sampled_from(
        [
            "",
            "UTC",
            "Europe/Berlin",
            "Etc/GMT+5",
            "Mars/Base",
            "../etc/passwd",
            ":UTC",
            "EST5EDT,M3.2.0,M11.1.0",
            "/usr/share/zoneinfo/Asia/Tokyo",
            "/etc/localtime",
        ]
    ),
    odd_text,
)


def _rows(db: psycopg.Connection[Any], table: tuple[str, str]) -> list[tuple[str, str]]:
    return [
        (key, value)
        for key, value in db.execute(
            sql.SQL("SELECT key, value FROM {}").format(sql.Identifier(*table))
        ).fetchall()
    ]


def _call(
    main: Any, argv: Sequence[str], environ: Mapping[str, str], capsys: Any
) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        status = main(list(argv), dict(environ))
    except SystemExit as exc:  # argparse, in dislockctl
        status = exc.code if isinstance(exc.code, int) else 2
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def nasty_rows(db: psycopg.Connection[Any], lock_table: tuple[str, str]) -> list[str]:
    """Rows another version (or a hand) wrote, with characters that break lines."""
    keys = [schedule_key("nasty\nkey\u202e"), lease_key("tab\tkey")]
    for key in keys:
        db.execute(
            sql.SQL("INSERT INTO {} VALUES (%s, %s, NOW() + interval '1 hour')").format(
                sql.Identifier(*lock_table)
            ),
            (key, "owner\r\nforged line"),
        )
    return keys


# ---------------------------------------------------------------------------
# The wrapper


PLAIN = st.characters(exclude_categories=("Cc", "Cf", "Cs", "Zl", "Zp"))

# A working value for every variable (None: unset)...
VALID: dict[str, st.SearchStrategy[str | None]] = {
    "LOCK_KEY": st.one_of(st.just("job"), st.text(PLAIN, min_size=1, max_size=30)),
    "LOCK_STRATEGY": st.sampled_from([None, "schedule", "lease", "schedule,lease", " Lease "]),
    "CRON_SCHEDULE": st.sampled_from(["* * * * *", "0 3 * * *", "*/5 * * * *", "0 0 29 2 *"]),
    "CRON_TZ": st.sampled_from([None, None, "UTC", "Europe/Berlin", "Etc/GMT+5", ":UTC"]),
    "TZ": st.sampled_from([None, None, "Asia/Tokyo", "/usr/share/zoneinfo/Europe/Paris"]),
    "LOCK_TABLE": st.just("OURS"),
    "RUN_LOCK_TTL_SECONDS": st.one_of(
        st.none(), st.floats(min_value=1, max_value=120).map(lambda value: f"{value:.3f}")
    ),
    "LOCK_LEASE_INTERVAL": st.sampled_from([None, None, "0.5", "1"]),
    "LOCK_JITTER_SECONDS": st.sampled_from([None, "0", "0.001"]),
    "LOCK_ON_LEASE_LOSS": st.sampled_from([None, "terminate", "CONTINUE"]),
    "LOCK_FENCING": st.sampled_from([None, "0", "no"]),
    "CRONJOB_LOCK_LOG_LEVEL": st.sampled_from([None, "INFO", "warning"]),
    # A fresh key is never held, so a wait never waits.
    "LOCK_WAIT_SECONDS": st.sampled_from([None, None, "0", "30"]),
    "LOCK_WAIT_POLL_SECONDS": st.sampled_from([None, "0.5"]),
    "LOCK_WAIT_LISTEN": st.sampled_from([None, "auto", "0"]),
    "LOCK_SLOTS": st.sampled_from([None, None, "1", "3"]),
    "LOCK_CONFLICT_EXIT_CODE": st.sampled_from([None, "0", "3"]),
}
# ... and what a user may type by accident, or on purpose.
HOSTILE: dict[str, st.SearchStrategy[str]] = {
    "LOCK_KEY": st.one_of(odd_text, st.text("ab", min_size=2040, max_size=2060)),
    "LOCK_STRATEGY": st.one_of(st.sampled_from(["mutex", "schedule,", ""]), odd_text),
    "CRON_SCHEDULE": schedules,
    "CRON_TZ": zones,
    "TZ": zones,
    "LOCK_TABLE": st.one_of(st.sampled_from(["a.b.c", "x" * 64, "no_such", "."]), odd_text),
    "RUN_LOCK_TTL_SECONDS": numbers,
    "LOCK_LEASE_INTERVAL": numbers,
    "LOCK_JITTER_SECONDS": jitters,
    "LOCK_ON_LEASE_LOSS": st.one_of(st.just("ignore"), odd_text),
    "LOCK_FENCING": st.one_of(st.sampled_from(["1", "yes", "maybe", "\n"]), odd_text),
    "CRONJOB_LOCK_LOG_LEVEL": st.one_of(st.sampled_from(["LOUD", "DEBUG"]), odd_text),
    "LOCK_WAIT_SECONDS": numbers,
    "LOCK_WAIT_POLL_SECONDS": numbers,
    "LOCK_WAIT_LISTEN": st.one_of(st.sampled_from(["maybe", "2"]), odd_text),
    "LOCK_SLOTS": st.one_of(numbers, st.sampled_from(["1001", "0", "2.5", "1e3"])),
    "LOCK_CONFLICT_EXIT_CODE": st.one_of(numbers, st.sampled_from(["256", "-1", "x"])),
}


@st.composite
def wrapper_environments(draw: st.DrawFn) -> dict[str, str | None]:
    """A working environment with up to three variables given hostile values."""
    variables = {name: draw(strategy) for name, strategy in VALID.items()}
    for name in draw(st.lists(st.sampled_from(sorted(HOSTILE)), max_size=3, unique=True)):
        variables[name] = draw(HOSTILE[name])
    return variables


@_settings("wrapper")
@given(
    variables=wrapper_environments(),
    password=passwords,
    style=st.sampled_from(["url", "dsn"]),
    extra=url_extras,
    url_variable=st.sampled_from(
        ["DATABASE_URL"] * 12 + ["", "MISSING_URL", "postgresql://x", "A=B"]
    ),
    command=st.sampled_from(["touch", "touch", "touch", "/nonexistent/command", ""]),
)
def test_generated_wrapper_environments(
    database_url: str,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    variables: dict[str, str | None],
    password: str,
    style: str,
    extra: str,
    url_variable: str,
    command: str,
) -> None:
    run = uuid.uuid4().hex[:8]
    environ = {
        name: value for name, value in os.environ.items() if not name.startswith(("LOCK_", "CRON"))
    }
    environ.pop("TZ", None)
    environ["DATABASE_URL"] = with_password(database_url, password, style, extra)
    ours = ".".join(lock_table)
    environ["LOCK_TABLE"] = ours
    for name, value in variables.items():
        if value is not None:
            environ[name] = ours if value == "OURS" else value
    if variables.get("LOCK_KEY") is not None:
        environ["LOCK_KEY"] = f"fz{run}-{variables['LOCK_KEY']}"  # a fresh lock every example
    marker = tmp_path / f"ran-{run}"
    argv = [url_variable, *([command, str(marker)] if command else [])]
    before = _rows(db, lock_table)

    status, out, err = _call(dislock.cli.wrapper.command.main, argv, environ, capsys)
    event(f"dislock exit {status}")

    text = out + err
    assert not _leaks(text, password), text
    debug = environ.get("CRONJOB_LOCK_LOG_LEVEL", "").strip().upper() == "DEBUG"
    if not debug:
        assert "Traceback" not in text, text
    # A log level it does not know is documented to warn and go on at WARNING.
    lines = [line for line in err.strip().splitlines() if "LOG_LEVEL=" not in line]
    assert debug or all(_one_line(line) for line in lines), err
    if status == 2:
        assert len(lines) == 1 and lines[0].startswith("dislock: error: "), err
        assert not marker.exists()
        assert _rows(db, lock_table) == before, "a refused run wrote a row"
    elif status == 1:
        # At DEBUG, log lines come first and a traceback after (documented).
        assert any(line.startswith("dislock: error: ") for line in lines), err
        assert debug or len(lines) == 1, err
        assert not marker.exists()
    elif status == 0:
        assert marker.exists(), err  # a fresh key: nobody else holds it
    else:
        assert status == 127 and command == "/nonexistent/command", (status, err)


# ---------------------------------------------------------------------------
# LockContext


def _any_value(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``strategy``'s values, and values of the wrong type a caller could pass."""
    return st.one_of(
        strategy,
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**400), max_value=10**400),
        st.floats(),
        odd_text,
        st.lists(st.integers(), max_size=2),
    )


CONTEXT_VALID: dict[str, st.SearchStrategy[Any]] = {
    "table_parts": st.just("OURS"),
    "lock_key": st.one_of(st.just("job"), st.text(PLAIN, min_size=1, max_size=30)),
    "owner": st.one_of(st.just("host:1"), st.text(PLAIN, min_size=1, max_size=30)),
    "run_ttl_seconds": st.one_of(st.none(), st.floats(min_value=60, max_value=600)),
    "lease_interval_seconds": st.one_of(st.none(), st.floats(min_value=0.001, max_value=60)),
    "schedule": st.sampled_from([None, "* * * * *", "0 3 * * *", "*/5 * * * * */10"]),
    "jitter_max_seconds": st.sampled_from([0, 0.0, 0.25]),
    "lease_loss_policy": st.sampled_from(["terminate", "continue", "Continue"]),
    "connect_timeout_seconds": st.floats(min_value=0.5, max_value=30),
    "fencing": st.booleans(),
    "cron_tz": st.sampled_from([None, "UTC", "Europe/Berlin", timezone.utc]),
    "next_run_time": st.one_of(st.none(), st.datetimes(timezones=st.just(timezone.utc))),
    "wait_seconds": st.sampled_from([0, 0.0, 5]),
    "slots": st.sampled_from([1, 2]),
}
CONTEXT_HOSTILE: dict[str, st.SearchStrategy[Any]] = {
    "table_parts": st.one_of(st.lists(odd_text, max_size=3), _any_value(st.just(["kv"]))),
    "lock_key": _any_value(st.text("k", min_size=2040, max_size=2060)),
    "owner": _any_value(odd_text),
    "run_ttl_seconds": _any_value(st.floats(min_value=1e5, max_value=1e7)),
    "lease_interval_seconds": _any_value(st.floats(max_value=0.01)),
    "schedule": _any_value(schedules),
    "jitter_max_seconds": _any_value(st.floats(min_value=1)),
    "lease_loss_policy": _any_value(st.just("ignore")),
    "connect_timeout_seconds": _any_value(st.floats(min_value=3000)),
    "fencing": _any_value(st.just(1)),
    "cron_tz": _any_value(zones),
    "next_run_time": _any_value(st.datetimes()),
    "wait_seconds": _any_value(st.floats(min_value=86400)),
    "wait_poll_seconds": _any_value(st.floats(max_value=0)),
    "slots": _any_value(st.integers(min_value=1001)),
}


@st.composite
def context_arguments(draw: st.DrawFn) -> dict[str, Any]:
    """Working ``LockContext`` arguments with up to three given hostile values."""
    arguments = {name: draw(strategy) for name, strategy in CONTEXT_VALID.items()}
    for name in draw(st.lists(st.sampled_from(sorted(CONTEXT_HOSTILE)), max_size=3, unique=True)):
        arguments[name] = draw(CONTEXT_HOSTILE[name])
    return arguments


@_settings("context")
@given(arguments=context_arguments(), password=passwords, style=st.sampled_from(["url", "dsn"]))
def test_generated_lock_context_arguments(
    database_url: str,
    lock_table: tuple[str, str],
    arguments: dict[str, Any],
    password: str,
    style: str,
) -> None:
    url = with_password(database_url, password, style, "")
    if arguments["table_parts"] == "OURS":
        arguments["table_parts"] = list(lock_table)
    try:
        context = LockContext(url=url, **arguments)
    except ConfigurationError as exc:
        event("LockContext refused")
        message = str(exc)
        assert message and "\n" not in message, message
        assert not _leaks(message, password)
        return
    event("LockContext accepted")
    for text in (repr(context), str(context)):
        assert not _leaks(text, password)


@pytest.mark.parametrize(
    "arguments",
    [
        {"schedule": "*/5 * * * *", "cron_tz": "Europe/Berlin"},
        {"run_ttl_seconds": 5.0, "lease_interval_seconds": 0.5},
        {
            "schedule": "* * * * *",
            "run_ttl_seconds": 5.0,
            "lease_interval_seconds": 1.0,
            "jitter_max_seconds": 0.01,
        },
    ],
)
def test_valid_contexts_run(
    database_url: str, lock_table: tuple[str, str], arguments: dict[str, Any]
) -> None:
    """The other half of the property for ``LockContext``: what it accepts, runs."""
    context = LockContext(
        url=with_password(database_url, f"p{MARK}", "url", ""),
        table_parts=list(lock_table),
        lock_key=f"ctx-{uuid.uuid4().hex[:8]}",
        owner="o",
        **arguments,
    )
    strategies = [
        name
        for name, needs in (("schedule", "schedule"), ("lease", "run_ttl_seconds"))
        if needs in arguments
    ]
    assert (
        dislock.run_with_locks(
            [sys.executable, "-c", "pass"], context=context, strategies=strategies
        )
        == 0
    )


# ---------------------------------------------------------------------------
# dislockctl


@st.composite
def ctl_arguments(draw: st.DrawFn) -> list[str]:
    key = draw(st.one_of(odd_text, st.just("nasty"), st.just("tab")))
    commands = [
        ["ls"],
        ["ls", key],
        ["ls", "--json"],
        ["status", key],
        ["release", key],
        [
            "release",
            key,
            "--mode",
            draw(st.one_of(st.sampled_from(["schedule", "lease", "all"]), odd_text)),
        ],
        ["release", key, "--owner", draw(odd_text)],
        ["check"],
        ["init", "--print-sql"],
        [draw(odd_text)],
        [],
    ]
    command = draw(st.sampled_from(commands))
    table = draw(st.one_of(st.none(), st.just("OURS"), odd_text))
    extra = draw(st.lists(odd_text, max_size=1))
    return [*(["--table", table] if table is not None else []), *command, *extra]


@_settings("ctl")
@given(
    arguments=ctl_arguments(),
    variables=wrapper_environments(),
    password=passwords,
    style=st.sampled_from(["url", "dsn"]),
    url_variable=st.sampled_from(["DATABASE_URL"] * 6 + ["", "MISSING_URL", "postgresql://x"]),
)
# Found by Hypothesis: argparse quoted a stray argument as it was, and U+0085 (a line
# break to str.splitlines) split its one-line error in two.
@example(
    arguments=["ls", "", "\x850"],
    variables={},
    password=f"p{MARK}",
    style="url",
    url_variable="DATABASE_URL",
)
# Found by Hypothesis: psycopg reads a % in a quoted table name as a placeholder
# (here, a UnicodeDecodeError and a traceback from `ls`).
@example(
    arguments=["--table", "%¡", "ls"],
    variables={},
    password=f"p{MARK}",
    style="url",
    url_variable="DATABASE_URL",
)
# Found by Hypothesis: an argument that is not UTF-8 (a lone surrogate, as Python
# decodes such bytes of argv) reached the database driver and raised.
@example(
    arguments=["release", "nasty", "--owner", "\ud800"],
    variables={},
    password=f"p{MARK}",
    style="url",
    url_variable="DATABASE_URL",
)
def test_generated_dislockctl_arguments(
    database_url: str,
    db: psycopg.Connection[Any],
    lock_table: tuple[str, str],
    nasty_rows: list[str],
    capsys: pytest.CaptureFixture[str],
    arguments: list[str],
    variables: dict[str, str | None],
    password: str,
    style: str,
    url_variable: str,
) -> None:
    ours = ".".join(lock_table)
    environ = {
        name: value for name, value in os.environ.items() if not name.startswith(("LOCK_", "CRON"))
    }
    environ.pop("TZ", None)
    environ["DATABASE_URL"] = with_password(database_url, password, style, "")
    environ.update({name: value for name, value in variables.items() if value is not None})
    if environ.get("LOCK_TABLE") in (None, "OURS"):
        environ["LOCK_TABLE"] = ours
    argv = [url_variable, *(ours if arg == "OURS" else arg for arg in arguments)]
    before = _rows(db, lock_table)

    status, out, err = _call(dislock.cli.ctl.main, argv, environ, capsys)
    event(f"dislockctl exit {status}")

    text = out + err
    assert not _leaks(text, password), text
    assert "Traceback" not in text, text
    after = _rows(db, lock_table)
    assert len(after) == len(before), "dislockctl inserted or deleted a row"
    assert status in (0, 1, 2), (status, err)
    if status != 0:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("dislockctl: error: "), err
        assert after == before
        return
    # One line per lock (or setting), whatever the keys and owners in the table hold.
    assert all(_one_line(line) for line in out.splitlines()), out


# ---------------------------------------------------------------------------
# URLs the server (or libpq) rejects in odd ways: exit 1, one line, no password.


def _odd_url(database_url: str, kind: str, port: int) -> str:
    password = f"p{MARK}"
    if kind == "unknown option":
        return with_password(database_url, password, "url", "&options=-c%20no_such_setting%3D1")
    if kind == "sslmode=require without TLS":
        return f"postgresql://app:{password}@127.0.0.1:{port}/app?sslmode=require"
    if kind == "missing Unix socket":
        params = conninfo_to_dict(database_url)
        params.update(host=f"/nonexistent/{uuid.uuid4().hex[:6]}", password=password)
        params.pop("hostaddr", None)
        return make_conninfo("", **params)
    raise AssertionError(kind)


@pytest.fixture
def no_tls_server() -> Iterator[int]:
    """A TCP port where a server answers PostgreSQL's SSLRequest with "N" (no TLS),
    as a server without ``ssl = on`` does (the embedded one listens on a socket only,
    where libpq never asks for TLS)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    conn.recv(8)  # length and the SSLRequest code
                    conn.sendall(b"N")
                    conn.recv(1024)  # the startup packet, if the client goes on
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    listener.close()


ODD_URLS = ["unknown option", "sslmode=require without TLS", "missing Unix socket"]


@pytest.mark.parametrize("kind", ODD_URLS)
@pytest.mark.parametrize("tool", ["dislock", "dislockctl"])
def test_urls_the_server_rejects_exit_1_in_one_line(
    database_url: str,
    lock_table: tuple[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    no_tls_server: int,
    kind: str,
    tool: str,
) -> None:
    environ = {
        "DATABASE_URL": _odd_url(database_url, kind, no_tls_server),
        "LOCK_KEY": f"odd-{uuid.uuid4().hex[:6]}",
        "LOCK_TABLE": ".".join(lock_table),
        "CRON_SCHEDULE": "* * * * *",
        # A missing socket is also what a restarting server looks like: retried briefly.
        "LOCK_CONNECT_PATIENCE_SECONDS": "0.3",
    }
    marker = tmp_path / "ran"
    if tool == "dislock":
        status, out, err = _call(
            dislock.cli.wrapper.command.main,
            ["DATABASE_URL", "touch", str(marker)],
            environ,
            capsys,
        )
    else:
        status, out, err = _call(dislock.cli.ctl.main, ["DATABASE_URL", "ls"], environ, capsys)
    lines = err.strip().splitlines()
    assert status == 1, err
    assert len(lines) == 1 and lines[0].startswith(f"{tool}: error: "), err
    assert not _leaks(out + err, f"p{MARK}")
    assert not marker.exists()
