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
import logging
import signal
import socket
import sys
import threading
from datetime import datetime, timezone, tzinfo
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any

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
    metric_families,
    parse_listen,
    scrape_statements,
    span_of_row,
)
from dislock.cli.fleet import (
    DEFAULT_GRACE,
    Latest,
    Slot,
    from_first_run,
    latest_query,
    missed_slots,
    schedule_slots,
    split_covered,
    table_exists_query,
)
from dislock.cli.status_page import render_page
from dislock.core.cron import UTC, load_zone, next_boundary
from dislock.core.dsn import connection_kwargs, scrub
from dislock.core.errors import ConfigurationError

logger = logging.getLogger("dislock.serve")

LOCK_WAIT_SECONDS = 10.0
"""A request waits this long for the connection another request is using."""


class FleetReader:
    """Reads snapshots over one connection, reconnecting after a failure.

    It keeps what is costly to recompute on every scrape: the run counts
    (``RunCounts``) and each cron expression's slots in the missed-slot window.
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
        # Per schedule: (cron expression, the zone it is read in).
        self._slots: dict[tuple[str, str], list[Slot]] = {}
        self._slots_version: dict[tuple[str, str], int] = {}
        self._next: dict[tuple[str, str], datetime] = {}
        self._zones: dict[str, tzinfo] = {}

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
            snapshot = self._read(self._connect())
        except psycopg.Error as exc:
            self.close()
            self._report(
                False, describe_database_error(exc, table_parts=self._table, url=self._url)
            )
            return FleetSnapshot(datetime.now(timezone.utc), up=False)
        finally:
            self._lock.release()
        self._report(True, "")
        return snapshot

    def _read(self, conn: psycopg.Connection[Any]) -> FleetSnapshot:
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
        missed, covered, next_slots = self._schedules(latest, since, now)
        return build_snapshot(
            now,
            lock_rows,
            latest,
            runs_total=self._counts.by_key(),
            missed=missed,
            next_slots=next_slots,
            covered=covered,
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
        self, latest: list[LatestRow], since: datetime, now: datetime
    ) -> tuple[dict[str, int], dict[str, int], dict[str, datetime]]:
        """Missed and covered slots and the next slot of every key whose latest run
        had a schedule."""
        missed: dict[str, int] = {}
        covered: dict[str, int] = {}
        next_slots: dict[str, datetime] = {}
        for row in latest:
            if row.cron is None:
                continue
            # The zone the wrapper read it in (none recorded: UTC, as before zones were).
            schedule = (row.cron, row.cron_tz or "UTC")
            try:
                tz = self._zone(row.cron_tz)
                slots = self._window_slots(schedule, tz, since, now)
                next_slots[row.lock_key] = self._next_slot(schedule, tz, now)
            except (ConfigurationError, ValueError):
                continue  # a schedule this version cannot read: no count rather than a wrong one
            # Recounted only when the key's starts or its schedule's slots changed.
            inputs = (
                schedule,
                self._slots_version[schedule],
                self._starts.version(row.lock_key),
                row.ran_before_window,
            )
            cached = self._missed.get(row.lock_key)
            if cached is not None and cached[0] == inputs:
                missed[row.lock_key], covered[row.lock_key] = cached[1]
                continue
            runs = self._starts.of(row.lock_key)
            if not row.ran_before_window:
                # A job new within the window: the slots before its first run are not missed.
                slots = from_first_run(slots, runs or [(row.started_at, None)])
            nobody, going = split_covered(
                missed_slots(slots, runs), self._starts.spans_of(row.lock_key)
            )
            counts = (len(nobody), len(going))
            self._missed[row.lock_key] = (inputs, counts)
            missed[row.lock_key], covered[row.lock_key] = counts
        return missed, covered, next_slots

    def _zone(self, name: str | None) -> tzinfo:
        if name is None:
            return UTC
        found = self._zones.get(name)
        if found is None:
            found = self._zones[name] = load_zone(name, name="the recorded cron_tz").tz
        return found

    def _window_slots(
        self, schedule: tuple[str, str], tz: tzinfo, since: datetime, now: datetime
    ) -> list[Slot]:
        """``schedule_slots(expression, since, now, tz=tz)``, extended from the last
        scrape's: a slot begins where the one before it ends, so none is new until
        the last one known has ended (and its grace passed)."""
        expression = schedule[0]
        known = self._slots.get(schedule)
        if known and known[-1].end + DEFAULT_GRACE > now and known[0].start >= since:
            return known
        if known:
            kept = [slot for slot in known if slot.start >= since]
            start = max(known[-1].end, since)
            kept += schedule_slots(expression, start, now, DEFAULT_GRACE, tz)
        else:
            kept = list(schedule_slots(expression, since, now, DEFAULT_GRACE, tz))
        self._slots[schedule] = kept
        self._slots_version[schedule] = self._slots_version.get(schedule, 0) + 1
        return kept

    def _next_slot(self, schedule: tuple[str, str], tz: tzinfo, now: datetime) -> datetime:
        boundary = self._next.get(schedule)
        if boundary is None or boundary <= now:
            boundary = self._next[schedule] = next_boundary(schedule[0], now, tz)
        return boundary

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


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "dislockctl"
    sys_version = ""

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, *, body: bool) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path == "/metrics":
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

    def __init__(
        self, address: tuple[str, int], family: int, url: str, reader: FleetReader
    ) -> None:
        self.address_family = family
        self.url = url
        self.reader = reader
        self.exposition = Exposition()
        super().__init__(address, _Handler)


def _configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("dislockctl serve: %(message)s"))
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False


def serve(url: str, table: tuple[str, ...], history: tuple[str, ...], listen: str) -> int:
    """Serve until SIGTERM or SIGINT; the exit status."""
    _configure_logging()
    try:
        host, port = parse_listen(listen)
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
        server = _Server((host, port), family, url, reader)
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
