"""``dislockctl URL_VARIABLE serve``: the fleet's state as Prometheus metrics and a status page.

A small read-only HTTP server.  Every request that needs the database reads one
snapshot in a READ ONLY transaction on one kept connection; a database that does
not answer is reported (``dislock_up 0``, a banner on the page), never a crash.
What the snapshot means lives in ``dislock.cli.exporter`` and ``status_page``;
this module only does I/O.  The database URL appears in no response and no log
line: errors are described with ``describe_database_error``, which scrubs it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import TYPE_CHECKING, Any, NamedTuple

import psycopg
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from dislock.cli import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from dislock.cli._prometheus import Exposition
from dislock.cli.admin import LockRow, list_params, list_query
from dislock.cli.diagnosis import describe_database_error
from dislock.cli.exporter import (
    MISSED_WINDOW,
    RECENT_SECONDS,
    SCRAPE_CONNECT_TIMEOUT,
    SCRAPE_STATEMENT_TIMEOUT_MS,
    FleetSnapshot,
    LatestRow,
    RunCounts,
    WindowStarts,
    build_snapshot,
    lock_delay_end,
    lock_delay_query,
    metric_families,
    parse_listen,
    scrape_statements,
    span_of_row,
)
from dislock.cli.fleet import (
    Latest,
    from_first_run,
    latest_query,
    missed_slots,
    split_covered,
    table_exists_query,
)
from dislock.cli.http_policy import WRITE_TIMEOUT, HostPolicy, Limits
from dislock.cli.slot_windows import ScheduleWindows
from dislock.cli.status_page import render_page
from dislock.core.dsn import connection_kwargs, scrub
from dislock.core.errors import ConfigurationError

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

logger = logging.getLogger("dislock.serve")

LOCK_WAIT_SECONDS = 10.0
"""A request waits this long for the connection another request is using."""

BUSY_LOG_INTERVAL = 60.0
"""Seconds between two log lines about connections refused for being too many."""


class _Read(NamedTuple):
    """What one scrape read from the database, for the work done after the connection
    is free for the next request."""

    now: datetime
    since: datetime
    lock_rows: list[LockRow]
    latest: list[LatestRow]
    starts: WindowStarts
    """A copy: the next scrape's reading does not change it."""
    runs_total: dict[str, dict[str, int]]
    lock_delay_end: datetime | None


class FleetReader:
    """Reads snapshots over one connection, reconnecting after a failure.

    It keeps what is costly to recompute on every scrape: the run counts
    (``RunCounts``) and each key's slots in the missed-slot window
    (``ScheduleWindows``, which bounds that work).  The connection's lock is held
    only while the database is read; the slots are computed under a lock of their
    own, so that their cost never makes another request wait for the connection.
    """

    def __init__(self, url: str, table: tuple[str, ...], history: tuple[str, ...]) -> None:
        self._url = url
        self._table = table
        self._history = history
        self._statements = scrape_statements(history, table)
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._was_up: bool | None = None
        self._counts = RunCounts()
        self._starts = WindowStarts()
        self._missed: dict[str, tuple[tuple[Any, ...], tuple[int, int]]] = {}
        self._windows = ScheduleWindows()
        # Reads are numbered, and their slots computed in that order, so that the
        # windows never step back in time when two requests overlap.
        self._windows_turn = threading.Condition()
        self._reads = self._computed = 0

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            kwargs = connection_kwargs(self._url, SCRAPE_CONNECT_TIMEOUT)
            kwargs["application_name"] = "dislockctl-serve"
            self._conn = psycopg.connect(self._url, **kwargs)
        return self._conn

    def snapshot(self) -> FleetSnapshot:
        if not self._lock.acquire(timeout=LOCK_WAIT_SECONDS):
            self._report(False, "another request has been reading for too long")
            return FleetSnapshot(datetime.now(timezone.utc), up=False)
        try:
            read = self._read(self._connect())
            self._reads += 1
            turn = self._reads
        except psycopg.Error as exc:
            self.close()
            self._report(
                False, describe_database_error(exc, table_parts=self._table, url=self._url)
            )
            return FleetSnapshot(datetime.now(timezone.utc), up=False)
        finally:
            self._lock.release()
        self._report(True, "")
        with self._windows_turn:
            self._windows_turn.wait_for(lambda: self._computed == turn - 1)
            try:
                missed, covered, next_slots = self._schedules(
                    read.latest, read.starts, read.since, read.now
                )
            finally:
                self._computed = turn
                self._windows_turn.notify_all()
        return build_snapshot(
            read.now,
            read.lock_rows,
            read.latest,
            runs_total=read.runs_total,
            missed=missed,
            next_slots=next_slots,
            covered=covered,
        )._replace(lock_delay_end=read.lock_delay_end)

    def _read(self, conn: psycopg.Connection[Any]) -> _Read:
        with conn.transaction():
            # One consistent, read-only view; a write here would be refused by
            # the server itself, whatever the SQL said.
            conn.execute(
                "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY;"
                f" SET LOCAL statement_timeout = {int(SCRAPE_STATEMENT_TIMEOUT_MS)}"
            )
            found = conn.execute("SELECT NOW()").fetchone()
            assert found is not None
            now: datetime = found[0]
            since = now - MISSED_WINDOW
            lock_rows = [
                LockRow.from_row(row)
                for row in conn.execute(list_query(self._table), list_params(""))
            ]
            latest = self._latest(conn, since)
            self._follow_runs(conn, since, [row.lock_key for row in latest])
            query, params = lock_delay_query(self._table)
            found = conn.execute(query, params).fetchone()
        return _Read(
            now,
            since,
            lock_rows,
            latest,
            self._starts.copy(),
            self._counts.by_key(),
            lock_delay_end(found[0] if found else None, now),
        )

    def _latest(self, conn: psycopg.Connection[Any], since: datetime) -> list[LatestRow]:
        """Each key's latest run (``latest_query``, as ``dislockctl`` reads it), with
        the details the page and the missed-slot count need."""
        found = [Latest(*row) for row in conn.execute(latest_query(self._history, self._table))]
        ids = [run.run_id for run in found if run.run_id is not None]
        details = {
            run_id: rest
            for run_id, *rest in conn.execute(
                self._statements.run_details, {"ids": ids, "since": since}
            )
        }
        latest = []
        for run in found:
            if run.run_id is None or run.run_id not in details:
                continue  # never ran (or pruned in between): the lock rows tell its state
            assert run.started_at is not None and run.outcome is not None
            owner, exit_code, cron, cron_tz, ran_before = details[run.run_id]
            latest.append(
                LatestRow(
                    run.key,
                    owner,
                    run.host or "",
                    run.started_at,
                    run.ended_at,
                    run.outcome,
                    exit_code,
                    cron,
                    cron_tz,
                    run.duration_seconds,
                    run.last_success_ended_at,
                    ran_before,
                )
            )
        return latest

    def _follow_runs(self, conn: psycopg.Connection[Any], since: datetime, keys: list[str]) -> None:
        """Bring the run counts and the window's starts and spans up to date, reading
        (after the first scrape) only the runs that are new or were unfinished."""
        found = conn.execute(self._statements.floor, {"recent": RECENT_SECONDS}).fetchone()
        assert found is not None
        floor = int(found[0])
        if self._counts.floor is None:  # the first scrape counts the history once
            census = conn.execute(self._statements.census, {"floor": floor}).fetchall()
            self._counts.absorb_initial(floor, census)
        if not self._starts.loaded:
            for run_id, lock_key, started_at, slot_end, *span in conn.execute(
                self._statements.window_starts, {"since": since}
            ):
                self._starts.add(run_id, lock_key, started_at, slot_end)
                self._starts.set_span(run_id, lock_key, span_of_row(started_at, *span))
            # Runs begun before the window may cover its first slots; later scrapes
            # see them again only while they are unfinished (pending).
            for run_id, lock_key, started_at, *span in conn.execute(
                self._statements.spans_before, {"since": since, "keys": keys}
            ):
                self._starts.set_span(run_id, lock_key, span_of_row(started_at, *span))
            self._starts.loaded = True
        params = {"floor": self._counts.floor, "pending": sorted(self._counts.pending)}
        rows = conn.execute(self._statements.new_runs, params).fetchall()
        self._counts.absorb(floor, rows)
        for run_id, lock_key, _, started_at, slot_end, scheduled, *span in rows:
            if scheduled and started_at >= since:
                self._starts.add(run_id, lock_key, started_at, slot_end)
            if scheduled:
                self._starts.set_span(run_id, lock_key, span_of_row(started_at, *span))
        self._starts.trim(since)

    def _schedules(
        self, latest: list[LatestRow], starts: WindowStarts, since: datetime, now: datetime
    ) -> tuple[dict[str, int], dict[str, int], dict[str, datetime]]:
        """Missed and covered slots and the next slot of every key whose latest run
        had a schedule."""
        missed: dict[str, int] = {}
        covered: dict[str, int] = {}
        next_slots: dict[str, datetime] = {}
        # The zone the wrapper read it in (none recorded: UTC, as before zones were).
        found = self._windows.scrape(
            ((row.lock_key, row.cron, row.cron_tz) for row in latest if row.cron is not None),
            since,
            now,
        )
        for note in found.notes:
            logger.warning("%s", note)
        for row in latest:
            window = found.windows.get(row.lock_key)
            if row.cron is None or window is None:
                continue
            if window.next_slot is not None:
                next_slots[row.lock_key] = window.next_slot
            if window.slots is None:
                continue  # unreadable, too dense, or not computed yet: no count, not a wrong one
            slots = window.slots
            schedule = (row.cron, row.cron_tz or "UTC")
            # Recounted only when the key's starts or its schedule's slots changed.
            inputs = (
                schedule,
                window.version,
                starts.version(row.lock_key),
                row.ran_before_window,
            )
            cached = self._missed.get(row.lock_key)
            if cached is not None and cached[0] == inputs:
                missed[row.lock_key], covered[row.lock_key] = cached[1]
                continue
            runs = starts.of(row.lock_key)
            if not row.ran_before_window:
                # A job new within the window: the slots before its first run are not missed.
                slots = from_first_run(slots, runs or [(row.started_at, None)])
            nobody, going = split_covered(missed_slots(slots, runs), starts.spans_of(row.lock_key))
            counts = (len(nobody), len(going))
            self._missed[row.lock_key] = (inputs, counts)
            missed[row.lock_key], covered[row.lock_key] = counts
        return missed, covered, next_slots

    def check_tables(self) -> str | None:
        """At start-up: what is missing, or None.  A database that does not answer
        is not an error here: the server starts and reports it as down."""
        try:
            conn = self._connect()
            for table, what, create in (
                (self._table, "lock table", "init"),
                (self._history, "history table", "init --history"),
            ):
                query, params = table_exists_query(table)
                found = conn.execute(query, params).fetchone()
                if not found or not found[0]:
                    return (
                        f"{what} {'.'.join(table)} does not exist; create it with"
                        f" `dislockctl URL_VARIABLE {create}`"
                    )
        except psycopg.Error as exc:
            self.close()
            self._report(
                False, describe_database_error(exc, table_parts=self._table, url=self._url)
            )
        return None

    def _report(self, up: bool, why: str) -> None:
        if up != self._was_up:
            if up:
                logger.info("the database answers")
            else:
                logger.warning("the database did not answer: %s", scrub(why, self._url))
        self._was_up = up

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()


class _DeadlineReader(io.RawIOBase):
    """A client's socket read against one deadline for its whole request: a client
    that sends a byte every few seconds is cut off as one that sends nothing."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the client did not send its request in time")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


_BUSY_BODY = b"too many connections at once; try again\n"
_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: %d\r\nRetry-After: 5\r\nConnection: close\r\n\r\n%s"
) % (len(_BUSY_BODY), _BUSY_BODY)

_MISDIRECTED = (
    b"this server does not answer for that host name; dislockctl serve --allow-host adds one\n"
)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "dislockctl"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        # The whole request within the timeout, not each read of it.
        self.rfile.close()
        deadline = time.monotonic() + self.server.limits.request_timeout
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, deadline))

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        hosts = self.headers.get_all("Host") or []
        try:
            if not self.server.hosts.allows(hosts):
                # Nothing of the fleet for a name nobody allowed (DNS rebinding).
                self.server.refused_host(hosts)
                status, kind, payload = 421, "text/plain; charset=utf-8", _MISDIRECTED
            elif path == "/metrics":
                families = metric_families(self.server.reader.snapshot())
                status, kind, payload = 200, CONTENT_TYPE_LATEST, self.server.exposition(families)
            elif path == "/":
                page = render_page(self.server.reader.snapshot())
                status, kind, payload = 200, "text/html; charset=utf-8", page.encode()
            elif path == "/healthz":
                status, kind, payload = 200, "text/plain; charset=utf-8", b"ok\n"
            else:
                status, kind, payload = 404, "text/plain; charset=utf-8", b"not found\n"
        except Exception as exc:  # a bug must not take the server down or leak details
            logger.error("%s on %s: %s", type(exc).__name__, path, scrub(str(exc), self.server.url))
            status, kind, payload = 500, "text/plain; charset=utf-8", b"internal error\n"
        self.connection.settimeout(WRITE_TIMEOUT)
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        # No script, no external anything: the page is its own HTML and CSS.
        self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
        self.end_headers()
        if body:
            self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log: a scrape every 15 s is not news


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64  # connections the kernel holds until they are accepted (or refused)

    def __init__(
        self,
        address: tuple[str, int],
        family: int,
        url: str,
        reader: FleetReader,
        hosts: HostPolicy,
        limits: Limits,
    ) -> None:
        self.address_family = family
        self.url = url
        self.reader = reader
        self.hosts = hosts
        self.limits = limits
        self.exposition = Exposition()
        self._active = 0
        self._active_lock = threading.Lock()
        self._busy_told = -math.inf
        self._hosts_told: set[str] = set()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._active_lock:
            busy = self._active >= self.limits.max_connections
            if not busy:
                self._active += 1
        if busy:
            self._refuse(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._done()  # no thread started to end it
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done()

    def _done(self) -> None:
        with self._active_lock:
            self._active -= 1

    def _refuse(self, request: socket.socket) -> None:
        """503 and close, never waiting: this is the thread that accepts connections."""
        try:
            request.setblocking(False)
            # What the client already sent, read so that closing does not reset the
            # connection before it has read the answer.
            with contextlib.suppress(BlockingIOError, InterruptedError):
                request.recv(65536)
            request.send(_BUSY)
        except OSError:
            pass
        self.shutdown_request(request)
        if time.monotonic() - self._busy_told >= BUSY_LOG_INTERVAL:
            self._busy_told = time.monotonic()
            logger.warning(
                "%d connections at once: refusing more with 503 until one ends",
                self.limits.max_connections,
            )

    def refused_host(self, headers: list[str]) -> None:
        """Log the first few names refused (the log is not the attacker's to fill)."""
        name = headers[0] if len(headers) == 1 else f"{len(headers)} Host headers"
        with self._active_lock:
            if name in self._hosts_told or len(self._hosts_told) >= 16:
                return
            self._hosts_told.add(name)
        shown = name if len(name) <= 64 else name[:64] + "..."
        logger.warning(
            "refused a request for Host %r: not an allowed name (add it with --allow-host)",
            shown,
        )

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):
            # A client that went away, or never sent its request: not the server's fault.
            logger.debug("a client went away: %s", type(exc).__name__)
            return
        name = type(exc).__name__
        logger.error("%s while answering a client: %s", name, scrub(str(exc), self.url))


def _configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("dislockctl serve: %(message)s"))
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False


def serve(
    url: str,
    table: tuple[str, ...],
    history: tuple[str, ...],
    listen: str,
    allow_hosts: Sequence[str] = (),
    limits: Limits | None = None,
) -> int:
    """Serve until SIGTERM or SIGINT; the exit status.  ``allow_hosts``: the
    ``--allow-host`` names, answered besides the loopback ones and ``listen``'s host."""
    _configure_logging()
    try:
        host, port = parse_listen(listen)
        hosts = HostPolicy(host, allow_hosts)
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[
            0
        ][0]
    except ConfigurationError as exc:
        print(f"dislockctl: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except socket.gaierror as exc:
        print(f"dislockctl: error: --listen {listen!r}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE

    reader = FleetReader(url, table, history)
    missing = reader.check_tables()
    if missing is not None:
        reader.close()
        print(f"dislockctl: error: {missing}", file=sys.stderr)
        return EXIT_FAILURE
    try:
        server = _Server((host, port), family, url, reader, hosts, limits or Limits())
    except OSError as exc:
        reader.close()
        print(
            f"dislockctl: error: cannot listen on {listen}: {exc.strerror or exc}", file=sys.stderr
        )
        return EXIT_FAILURE

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    worker = threading.Thread(target=server.serve_forever, name="dislockctl-serve", daemon=True)
    worker.start()
    bound_host, bound_port = str(server.server_address[0]), int(server.server_address[1])
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    logger.info("listening on http://%s:%d/ (metrics at /metrics)", shown, bound_port)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.shutdown()
        server.server_close()
        reader.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    logger.info("stopped")
    return EXIT_OK
