"""``dislockctl serve`` under attack, each attack done for real against a running server.

Half-sent requests held open, more connections than it serves, page views crowding
out the scrapes, a Host name nobody allowed (DNS rebinding), clients that vanish
mid-request, a FIFO or a path as a recorded zone, and invented schedules in the
history.  After each, later requests
are still answered and stderr holds no traceback.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from dislock.core.failover import TIMELINE_KEY, TTL_KEY_PREFIX
from tests.cli.serving import Metrics, Served, ctl, run_job, sample, serving
from tests.support.eventually import eventually

PATIENCE = 120.0
"""Seconds any wait here may take on a loaded machine before the test fails."""


def _address(served: Served) -> tuple[str, int]:
    parts = urlsplit(served.base)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


OTHER_CLIENT = "127.0.0.2"
"""A second client on this machine: the whole of 127.0.0.0/8 is loopback on Linux,
and serve tells clients apart by their address."""


def _connect(served: Served, source: str | None = None) -> socket.socket:
    """A connection to serve, from ``source`` (an address of this machine) if given."""
    bind = None if source is None else (source, 0)
    sock = socket.create_connection(_address(served), timeout=PATIENCE, source_address=bind)
    sock.settimeout(PATIENCE)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _request(
    served: Served,
    path: str,
    *hosts: str,
    source: str | None = None,
    sent: threading.Event | None = None,
) -> tuple[int, bytes]:
    """Status and body of GET ``path`` sent with these Host headers (default: the
    address it listens on), from ``source`` if given; ``sent`` is set once it is sent."""
    host, port = _address(served)
    lines = [f"GET {path} HTTP/1.1", *(f"Host: {name}" for name in hosts or (f"{host}:{port}",))]
    with _connect(served, source) as sock:
        sock.sendall(("\r\n".join([*lines, "Connection: close", "", ""])).encode())
        if sent is not None:
            sent.set()
        answer = _read_all(sock)
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


SO_TIMESTAMPNS = 35  # Linux (asm-generic/socket.h); Python's socket module lacks the name


def _answered_at(
    served: Served, path: str, source: str | None, sent: threading.Event
) -> tuple[int, float]:
    """Status of GET ``path`` and when its first bytes reached the socket: the kernel's
    receive time, which a thread scheduled late to read them does not move."""
    host, port = _address(served)
    with _connect(served, source) as sock:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()
        )
        sent.set()
        first, ancillary, _, _ = sock.recvmsg(65536, socket.CMSG_SPACE(16))
        rest = _read_all(sock)
    (seconds, nanoseconds) = next(
        struct.unpack("qq", data[:16])
        for level, kind, data in ancillary
        if (level, kind) == (socket.SOL_SOCKET, SO_TIMESTAMPNS)
    )
    head = (first + rest).split(b"\r\n", 1)[0]
    return int(head.split(b" ", 2)[1]), seconds + nanoseconds / 1e9


def _metrics(served: Served) -> Metrics:
    status, body = _request(served, "/metrics")
    assert status == 200, (status, body[:200])
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }


def _half_sent(served: Served) -> socket.socket:
    """A connection whose request never ends (no blank line after the headers)."""
    host, port = _address(served)
    sock = _connect(served)
    sock.sendall(f"GET /metrics HTTP/1.1\r\nHost: {host}:{port}\r\n".encode())
    return sock


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def _parked(pid: int) -> bool:
    """No thread of ``pid`` runs or waits to run, three looks 50 ms apart: each request it
    has read is blocked where it waits (a thread that is still reading a request, or
    waiting for the interpreter lock behind one that is, would be runnable)."""
    for _ in range(3):
        try:
            tasks = [
                task.joinpath("stat").read_text() for task in Path(f"/proc/{pid}/task").iterdir()
            ]
        except FileNotFoundError:  # a thread ended as it was looked at
            return False
        if any(stat.rsplit(")", 1)[1].split()[0] == "R" for stat in tasks):
            return False
        time.sleep(0.05)
    return True


def _wait(condition: Any, what: str) -> None:
    eventually(condition, timeout=PATIENCE, interval=0.05, message=what)


def _reset(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), as a client that crashed or gave up does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def _assert_quiet(served: Served) -> None:
    log = "".join(served.log)
    assert "Traceback" not in log and "Error" not in log, log


@contextmanager
def _history(env: dict[str, str]) -> Iterator[tuple[psycopg.Connection[Any], sql.Identifier]]:
    schema, table = env["LOCK_TABLE"].split(".")
    with psycopg.connect(env["DATABASE_URL"], autocommit=True) as conn:
        yield conn, sql.Identifier(schema, f"{table}_history")


def test_half_sent_requests_are_dropped_and_later_ones_answered(
    history_env: dict[str, str],
) -> None:
    with serving(history_env, "--request-timeout", "2") as served:
        threads_before = _threads(served.process.pid)
        # Eight, as many as one address is served at once.
        held = [_half_sent(served) for _ in range(7)]
        # Slowloris: a header line every 0.3 s would renew a per-read timeout forever.
        drip = _half_sent(served)
        # While they are held, other clients' requests are answered.
        assert _request(served, "/healthz", source=OTHER_CLIENT) == (200, b"ok\n")
        deadline = time.monotonic() + PATIENCE
        dripped = b""
        while True:
            assert time.monotonic() < deadline, "the dripping client was never dropped"
            if select.select([drip], [], [], 0.3)[0]:
                dripped = drip.recv(65536)
                break  # the server spoke or, as it should, closed the connection
            try:
                drip.sendall(b"X-Slow: 1\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
        assert dripped == b""
        for sock in held:
            assert _read_all(sock) == b"", "a half-sent request got an answer"
            sock.close()
        drip.close()
        _wait(lambda: _threads(served.process.pid) <= threads_before, "threads left behind")
        assert sample(_metrics(served), "dislock_up") == 1.0
    _assert_quiet(served)


def test_connections_beyond_the_cap_are_refused_at_once(history_env: dict[str, str]) -> None:
    # Held connections that do not time out during the test: the cap is what refuses.
    # Idle ones all kept (--max-idle-connections above the cap), so that they fill it.
    args = ("--max-connections", "4", "--max-idle-connections", "5", "--request-timeout", "600")
    with serving(history_env, *args) as served:
        pid = served.process.pid
        threads_before = _threads(pid)
        held = [_half_sent(served) for _ in range(4)]
        _wait(lambda: _threads(pid) >= threads_before + 4, "the held connections were not taken")
        for _ in range(30):
            with _connect(served) as extra:
                extra.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
                answer = _read_all(extra)  # at once: a queued one would wait 600 s
            assert answer.startswith(b"HTTP/1.0 503 "), answer[:100]
            assert b"dislock_" not in answer
        assert _threads(pid) == threads_before + 4  # one thread per connection served, no more
        for sock in held:
            _reset(sock)
        _wait(lambda: _threads(pid) <= threads_before, "the held connections did not end")
        assert sample(_metrics(served), "dislock_up") == 1.0
    log = "".join(served.log)
    assert 1 <= log.count("4 connections at once: refusing more with 503") < 30, log
    _assert_quiet(served)


def _readable(sock: socket.socket) -> bool:
    """Whether the server has sent something or closed the connection."""
    return bool(select.select([sock], [], [], 0)[0])


def test_one_clients_idle_connections_cannot_starve_the_others(
    history_env: dict[str, str],
) -> None:
    """A security review held 32 idle connections from one address (the default
    --max-connections): every other client got 503.  Now one address is served at
    most 8 connections at once; the rest of its connections are refused at once,
    without a thread, and the other clients are answered."""
    # Held connections that do not time out during the test: the cap is what refuses.
    with serving(history_env, "--request-timeout", "600") as served, ExitStack() as opened:
        pid = served.process.pid
        threads_before = _threads(pid)
        # From 127.0.0.1, sending nothing.
        idle = [opened.enter_context(_connect(served)) for _ in range(32)]

        def all_dealt_with() -> bool:
            # Each idle connection either holds a thread or was answered and closed.
            refused = sum(_readable(sock) for sock in idle)
            return refused + _threads(pid) - threads_before >= len(idle)

        _wait(all_dealt_with, "the idle connections were neither served nor refused")
        for _ in range(23):
            status, body = _request(served, "/metrics", source=OTHER_CLIENT)
            assert status == 200, (status, body[:200])
        assert _request(served, "/healthz", source=OTHER_CLIENT) == (200, b"ok\n")
        held = [sock for sock in idle if not _readable(sock)]
        assert len(held) == 8, len(held)  # still open, still holding their threads
        # The other client's threads end after their answers: wait for them to go.
        _wait(lambda: _threads(pid) == threads_before + 8, "the served threads did not end")
        for sock in idle:
            if sock not in held:
                answer = _read_all(sock)
                assert answer.startswith(b"HTTP/1.0 503 "), answer[:100]
                assert b"from your address" in answer and b"dislock_" not in answer
        # The address with 8 held is refused; another one is not.
        with _connect(served) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert _read_all(extra).startswith(b"HTTP/1.0 503 ")
        for sock in held:
            _reset(sock)
        _wait(lambda: _threads(pid) <= threads_before, "the held connections did not end")
        assert _request(served, "/healthz") == (200, b"ok\n")  # 127.0.0.1 again
    log = "".join(served.log)
    told = "8 connections at once from 127.0.0.1: refusing more from that address with 503"
    assert log.count(told) == 1, log
    _assert_quiet(served)


def test_idle_connections_from_many_addresses_cannot_starve_the_scrapes(
    history_env: dict[str, str],
) -> None:
    """Security review #48 held 8 idle connections from each of six addresses (all of
    127.0.0.0/8 is loopback): 45 of 46 scrapes got 503.  Now at most 16 idle ones
    are kept from all addresses together, a new connection closing the oldest."""
    with serving(history_env, "--request-timeout", "600") as served, ExitStack() as opened:
        pid = served.process.pid
        threads_before = _threads(pid)
        idle = [
            opened.enter_context(_connect(served, f"127.0.0.{source}"))
            for source in range(2, 8)
            for _ in range(8)
        ]

        def all_dealt_with() -> bool:
            closed = sum(_readable(sock) for sock in idle)
            return closed + _threads(pid) - threads_before == len(idle)

        _wait(all_dealt_with, "the idle connections were neither kept nor closed")
        held = [sock for sock in idle if not _readable(sock)]
        assert len(held) == 16, len(held)
        for _ in range(46):
            status, body = _request(served, "/metrics")
            assert status == 200, (status, body[:200])
        for sock in idle:
            if sock not in held or _readable(sock):
                assert _read_all(sock) == b"", "a closed idle connection got an answer"
        # The first scrape closed one more to make room; the rest found room.
        assert sum(not _readable(sock) for sock in held) == 15
        for sock in idle:
            _reset(sock)
        _wait(lambda: _threads(pid) <= threads_before, "the idle connections did not end")
    log = "".join(served.log)
    assert log.count("16 idle connections at once: closing the oldest") == 1, log
    _assert_quiet(served)


def _churn(served: Served, count: int, failures: list[BaseException]) -> None:
    """``count`` half-sent requests from 127.0.0.2 to 127.0.0.7 in turn, as fast as they
    go, at most 48 open at once, the oldest closed (every other one with a reset) for
    each new one: a client's end is what the server used to read as the end of the
    request."""
    host, port = _address(served)
    head = f"GET /metrics HTTP/1.1\r\nHost: {host}:{port}\r\n".encode()
    opened: list[socket.socket] = []
    try:
        for n in range(count):
            try:
                sock = socket.create_connection(
                    (host, port), timeout=5, source_address=(f"127.0.0.{2 + n % 6}", 0)
                )
                sock.sendall(head)
                opened.append(sock)
            except OSError:
                pass  # refused, reset or not accepted in time: that is the server's right
            if len(opened) > 48:
                oldest = opened.pop(0)
                if n % 2:
                    _reset(oldest)
                else:
                    oldest.close()
    except BaseException as exc:  # pragma: no cover - reported by the test
        failures.append(exc)
    finally:
        for sock in opened:
            sock.close()


def test_churning_half_sent_requests_keep_the_threads_bounded(
    history_env: dict[str, str],
) -> None:
    """Security review #61: half-sent requests from six addresses, about 300 a second,
    and serve was gone (a glibc malloc assertion, a segfault) or held 2,660 threads and
    answered nothing.  Each connection closed read as a whole request, so each became a
    scrape waiting for the one database connection, and a waiter that gave up let two
    threads use that connection at once, one closing it under the other.  Now threads
    never outnumber --max-connections, and the scrape after the flood is answered."""
    with serving(history_env) as served:
        pid = served.process.pid
        threads_before = _threads(pid)
        failures: list[BaseException] = []
        flood = threading.Thread(target=_churn, args=(served, 2000, failures))
        flood.start()
        peak = threads_before
        while flood.is_alive():
            assert served.process.poll() is None, "".join(served.log)
            peak = max(peak, _threads(pid))
            flood.join(0.01)
        assert not failures, failures
        assert served.process.poll() is None, "".join(served.log)
        # --max-connections (default 32); one more, joined but not yet gone from /proc.
        assert peak <= threads_before + 32 + 1, peak

        def scraped() -> bool:
            with suppress(OSError):
                status, body = _request(served, "/metrics")
                return status == 200 and b"dislock_up 1.0" in body
            return False

        eventually(scraped, timeout=30, interval=0.1, message="no scrape answered after it")
        _wait(lambda: _threads(pid) <= threads_before, "the flood's threads did not end")
    log = "".join(served.log)
    assert "16 idle connections at once: closing the oldest" in log, log
    _assert_quiet(served)


def test_scrapes_are_read_before_page_views_waiting(
    history_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    """Page views wait for the kept connection while another request reads; a scrape
    that arrives after them is read first, so that a page reloaded in many tabs does
    not make Prometheus time out."""
    arrivals: list[tuple[float, str]] = []

    def ask(path: str, source: str | None, sent: threading.Event) -> None:
        status, arrived = _answered_at(served, path, source, sent)
        arrivals.append((arrived, f"{path} {status}"))

    with serving(history_env) as served:
        pid = served.process.pid
        threads_before = _threads(pid)
        asking: list[threading.Thread] = []

        def start(path: str, source: str | None = None) -> None:
            sent = threading.Event()
            asking.append(threading.Thread(target=ask, args=(path, source, sent)))
            asking[-1].start()
            # Its request sent, read and waiting for the connection before the next one.
            _wait(sent.is_set, "not sent")
            _wait(lambda: _threads(pid) >= threads_before + len(asking), "not taken")
            _wait(lambda: _parked(pid), "still reading a request")

        with psycopg.connect(history_env["DATABASE_URL"]) as locker:
            # The first page view's reading waits behind this lock, holding the connection.
            table = sql.Identifier(*history_env["LOCK_TABLE"].split("."))
            locker.execute(sql.SQL("LOCK TABLE {}").format(table))
            start("/")
            _wait(lambda: _waiting_on_a_lock(db), "the first page view never read")
            for _ in range(5):
                start("/")
            start("/metrics", OTHER_CLIENT)
            locker.commit()
        for thread in asking:
            thread.join(PATIENCE)
    # In the order the answers reached this machine's sockets, not the order their
    # threads were scheduled to read them.
    answered = [answer for _, answer in sorted(arrivals)]
    assert sorted(answered) == ["/ 200"] * 6 + ["/metrics 200"], answered
    # The page view that held the connection, then the scrape, then the other five.
    assert answered.index("/metrics 200") <= 1, answered
    _assert_quiet(served)


def _waiting_on_a_lock(db: psycopg.Connection[Any]) -> bool:
    found = db.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE application_name = 'dislockctl-serve' AND wait_event_type = 'Lock'"
    ).fetchone()
    return found is not None and found[0] == 1


def test_idle_connections_are_closed_after_the_request_timeout(
    history_env: dict[str, str],
) -> None:
    with serving(history_env, "--request-timeout", "2") as served:
        pid = served.process.pid
        threads_before = _threads(pid)
        with ExitStack() as opened:
            since = time.monotonic()
            idle = [opened.enter_context(_connect(served)) for _ in range(8)]  # nothing sent
            for sock in idle:
                assert _read_all(sock) == b"", "an idle connection got an answer"
        # Closed by serve, once the 2 s that began after they were opened were over.
        assert time.monotonic() - since >= 2.0
        _wait(lambda: _threads(pid) <= threads_before, "threads left behind")
        assert _request(served, "/healthz") == (200, b"ok\n")
    _assert_quiet(served)


def test_a_client_that_does_not_read_the_answer_is_dropped_after_the_timeout(
    history_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    """The answer is written against one deadline, --request-timeout: a client that
    asks for metrics larger than the sockets' buffers and reads none of them holds its
    worker no longer."""
    schema, name = history_env["LOCK_TABLE"].split(".")
    key = history_env["LOCK_KEY"].ljust(80, "x")
    # 4,000 keys of 80 characters, a failed run each: more than loopback's buffers hold.
    db.execute(
        sql.SQL(
            "INSERT INTO {} (lock_key, modes, owner, host, pid, started_at, ended_at, outcome,"
            " exit_code) SELECT %(key)s || n, 'lease', 'o', 'h', 1, NOW(), NOW(), 'failed', 1"
            " FROM generate_series(1, 4000) AS n"
        ).format(sql.Identifier(schema, f"{name}_history")),
        {"key": key},
    )
    db.execute(
        sql.SQL(
            "INSERT INTO {} SELECT 'cronjob-lock:lease:' || %(key)s || n, 'o (released)',"
            " NOW() FROM generate_series(1, 4000) AS n"
        ).format(sql.Identifier(schema, name)),
        {"key": key},
    )
    with serving(history_env, "--request-timeout", "2") as served:
        pid = served.process.pid
        threads_before = _threads(pid)
        with socket.socket() as slow:
            slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting
            slow.settimeout(PATIENCE)
            slow.connect(_address(served))
            slow.sendall(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            # Its worker ends while it still has read nothing.
            assert slow.recv(1, socket.MSG_PEEK)  # the answer began (nothing read)
            _wait(lambda: _threads(pid) <= threads_before, "the slow reader kept its worker")
            try:
                answer = _read_all(slow)
            except ConnectionResetError:
                answer = b""
        head, _, body = answer.partition(b"\r\n\r\n")
        length = [line for line in head.split(b"\r\n") if line.startswith(b"Content-Length:")]
        assert not length or len(body) < int(length[0].split()[1]), "the whole answer was sent"
        assert _request(served, "/healthz") == (200, b"ok\n")
    _assert_quiet(served)


def test_only_allowed_host_names_are_answered(history_env: dict[str, str]) -> None:
    key = history_env["LOCK_KEY"]
    assert run_job(history_env, "true").returncode == 0
    with serving(history_env, "--allow-host", "ops-1.example.internal") as served:
        _, port = _address(served)
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "[::1]", "OPS-1.example.internal"):
            status, body = _request(served, "/metrics", host)
            assert status == 200 and key.encode() in body, host
        # DNS rebinding: a page on the attacker's name, which resolves to 127.0.0.1.
        for hosts in (
            (f"rebind.attacker.example:{port}",),
            ("127.0.0.1.attacker.example",),
            ("[::2]",),
            ("localhost", "rebind.attacker.example"),
        ):
            for path in ("/", "/metrics", "/healthz"):
                status, body = _request(served, path, *hosts)
                assert status == 421, (hosts, path, status)
                assert key.encode() not in body and b"dislock_" not in body
    log = "".join(served.log)
    assert f"refused a request for Host 'rebind.attacker.example:{port}'" in log, log
    assert log.count("rebind.attacker.example:") == 1, log  # told once
    _assert_quiet(served)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--allow-host", "evil.example:80"), "--allow-host 'evil.example:80'"),
        (("--allow-host", ""), "--allow-host ''"),
        (("--request-timeout", "0"), "--request-timeout must be"),
        (("--max-connections-per-client", "0"), "--max-connections-per-client"),
    ],
)
def test_bad_serve_options_are_one_line_and_exit_2(
    history_env: dict[str, str], args: tuple[str, ...], expected: str
) -> None:
    result = ctl(history_env, "serve", "--listen", "127.0.0.1:0", *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("dislockctl: error: ") and expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_client_that_goes_away_leaves_no_traceback(
    history_env: dict[str, str], db: psycopg.Connection[Any]
) -> None:
    with serving(history_env) as served:
        pid = served.process.pid
        threads_before = _threads(pid)
        # Gone while sending its request.
        _reset(_half_sent(served))
        # Gone while the server reads the database for it: the answer meets a reset.
        with psycopg.connect(history_env["DATABASE_URL"]) as blocker:
            schema, table = history_env["LOCK_TABLE"].split(".")
            blocker.execute(
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                    sql.Identifier(schema, table)
                )
            )
            for _ in range(5):  # a scrape gives up on the table after 5 s: then again
                waiting = _connect(served)
                waiting.sendall(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
                deadline = time.monotonic() + PATIENCE
                while time.monotonic() < deadline and not select.select([waiting], [], [], 0)[0]:
                    # This table's waiters only: another xdist worker's scrapes
                    # on the same server are not this one.
                    found = db.execute(
                        "SELECT count(DISTINCT a.pid) FROM pg_stat_activity a"
                        " JOIN pg_locks l ON l.pid = a.pid WHERE a.application_name ="
                        " 'dislockctl-serve' AND a.wait_event_type = 'Lock'"
                        " AND NOT l.granted AND l.relation = to_regclass(%s)",
                        (sql.Identifier(schema, table).as_string(None),),
                    ).fetchone()
                    if found == (1,):
                        break
                    time.sleep(0.05)
                else:
                    waiting.close()
                    continue
                _reset(waiting)  # while the scrape waits for the table
                break
            else:
                raise AssertionError("the scrape never waited for the table")
            blocker.rollback()
        _wait(lambda: _threads(pid) <= threads_before, "the abandoned requests did not end")
        assert sample(_metrics(served), "dislock_up") == 1.0
    _assert_quiet(served)


def test_a_fifo_or_a_path_as_recorded_zone_cannot_block_the_scrape(
    history_env: dict[str, str], tmp_path: Path
) -> None:
    fifo = tmp_path / "zone"
    os.mkfifo(fifo)
    base = history_env["LOCK_KEY"]
    zones = {
        f"{base}-fifo": str(fifo),
        f"{base}-up": "../../../../../../.." + str(fifo),
        f"{base}-inside": "Europe/../../../../../../.." + str(fifo),
        f"{base}-honest": "Europe/Berlin",
    }
    for key in zones:
        every_minute = {"CRON_SCHEDULE": "* * * * *", "CRON_TZ": "Europe/Berlin"}
        assert run_job(history_env, "true", LOCK_KEY=key, **every_minute).returncode == 0
    with _history(history_env) as (conn, history):
        for key, zone in zones.items():
            conn.execute(
                sql.SQL("UPDATE {} SET cron_tz = %s WHERE lock_key = %s").format(history),
                (zone, key),
            )

    def nobody_reads_the_fifo() -> bool:
        # A writer can open a FIFO without blocking only while a reader has it open.
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError as exc:
            return exc.errno == errno.ENXIO
        return False

    with serving(history_env) as served:
        for _ in range(2):
            metrics = _metrics(served)
            assert sample(metrics, "dislock_up") == 1.0
            for key in zones:
                if key.endswith("-honest"):
                    continue
                assert sample(metrics, "dislock_missed_slots", key=key) is None
                assert sample(metrics, "dislock_lock_held", key=key, mode="schedule") is not None
            assert nobody_reads_the_fifo()
        assert _request(served, "/")[0] == 200
        _wait(
            lambda: (
                sample(_metrics(served), "dislock_missed_slots", key=f"{base}-honest") is not None
            ),
            "the honest key was never counted",
        )
    log = "".join(served.log)
    for key in zones:
        if not key.endswith("-honest"):
            (line,) = [line for line in log.splitlines() if f"lock key '{key}':" in line]
            assert "is not an IANA time zone name; its missed slots are not counted" in line
    _assert_quiet(served)


def _scrape_into(served: Served, answers: list[Metrics]) -> None:
    answers.append(_metrics(served))


def test_invented_schedules_cannot_starve_the_scrape(history_env: dict[str, str]) -> None:
    """Per-second schedules (86,400 slots a day) in several zones, and an expression
    too long to read: before, each such reading cost the scrape ~30 s of CPU."""
    base = history_env["LOCK_KEY"]
    invented = {
        f"{base}-a": ("* * * * * *", "Europe/Berlin"),
        f"{base}-b": ("* * * * * */1", "Asia/Kolkata"),
        f"{base}-c": ("* * * * * */2", "Pacific/Chatham"),
        f"{base}-d": ("* * * * * *", "UTC"),
        f"{base}-e": (",".join(map(str, range(60))) + " * * * *", "UTC"),
    }
    honest = f"{base}-honest"
    for key in (*invented, honest):
        assert run_job(history_env, "true", LOCK_KEY=key, CRON_SCHEDULE="0 * * * *").returncode == 0
    with _history(history_env) as (conn, history):
        for key, (cron, zone) in invented.items():
            conn.execute(
                sql.SQL("UPDATE {} SET cron = %s, cron_tz = %s WHERE lock_key = %s").format(
                    history
                ),
                (cron, zone, key),
            )
    with serving(history_env) as served:
        counted = False
        # Enough scrapes for every invented reading to be found out (3,001 boundaries
        # each, 3,000 a scrape), three at a time.
        for _ in range(6):
            answers: list[Metrics] = []
            scrapers = [
                threading.Thread(target=_scrape_into, args=(served, answers)) for _ in range(3)
            ]
            for scraper in scrapers:
                scraper.start()
            for scraper in scrapers:
                scraper.join()
            assert len(answers) == 3
            for metrics in answers:
                # The database is never reported down for the time slots take.
                assert sample(metrics, "dislock_up") == 1.0
                for key in invented:
                    assert sample(metrics, "dislock_missed_slots", key=key) is None
            # Taking turns, the invented readings do not hold back the honest one.
            counted = counted or sample(answers[-1], "dislock_missed_slots", key=honest) is not None
        assert counted, "the honest key was never counted"
    log = "".join(served.log)
    for key in (f"{base}-a", f"{base}-b", f"{base}-c", f"{base}-d"):
        assert f"lock key '{key}': its schedule" in log and "more than 3,000 slots" in log, log
    assert f"lock key '{base}-e': its cron expression is longer than 128 characters" in log
    _assert_quiet(served)


def test_a_key_whose_schedule_keeps_changing_is_not_recomputed_forever(
    history_env: dict[str, str],
) -> None:
    key = history_env["LOCK_KEY"]
    assert run_job(history_env, "true", CRON_SCHEDULE="0 * * * *").returncode == 0
    zones = ["Europe/Berlin", "Asia/Kolkata", "America/New_York", "Asia/Tokyo", "Europe/Paris"]
    with serving(history_env) as served, _history(history_env) as (conn, history):
        for n, zone in enumerate(zones):
            conn.execute(
                sql.SQL("UPDATE {} SET cron_tz = %s WHERE lock_key = %s").format(history),
                (zone, key),
            )
            missed = sample(_metrics(served), "dislock_missed_slots", key=key)
            assert (missed is None) == (n >= 4), (zone, missed)
    assert "its runs recorded more than 4 schedules" in "".join(served.log)
    _assert_quiet(served)


def test_the_end_of_a_lock_delay_is_exported(history_env: dict[str, str]) -> None:
    assert run_job(history_env, "true").returncode == 0  # records the timeline
    schema, table = history_env["LOCK_TABLE"].split(".")
    locks = sql.Identifier(schema, table)
    with (
        psycopg.connect(history_env["DATABASE_URL"], autocommit=True) as conn,
        serving(history_env) as served,
    ):
        assert sample(_metrics(served), "dislock_lock_delay_end_timestamp_seconds") == 0.0
        # As a new timeline's first acquisition would record it, noticed now, with a
        # role whose leases lasted up to an hour: no key waits longer than that.
        conn.execute(
            sql.SQL("INSERT INTO {} VALUES (%s, '3600', '9999-12-31')").format(locks),
            (TTL_KEY_PREFIX + "someone",),
        )
        found = conn.execute(
            sql.SQL("UPDATE {} SET expire_at = NOW() WHERE key = %s RETURNING expire_at").format(
                locks
            ),
            (TIMELINE_KEY,),
        ).fetchone()
        assert found is not None
        value = sample(_metrics(served), "dislock_lock_delay_end_timestamp_seconds")
        assert value == pytest.approx(found[0].timestamp() + 3600, abs=0.001)
        status, page = _request(served, "/")
        assert status == 200 and b'id="lock-delay"' in page
        conn.execute(
            sql.SQL(
                "UPDATE {} SET expire_at = NOW() - interval '3601 seconds' WHERE key = %s"
            ).format(locks),
            (TIMELINE_KEY,),
        )
        assert sample(_metrics(served), "dislock_lock_delay_end_timestamp_seconds") == 0.0
        assert b'id="lock-delay"' not in _request(served, "/")[1]
    _assert_quiet(served)
