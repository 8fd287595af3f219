"""What ``dislockctl serve`` knows about a fleet, and the metrics it exposes.

One read-only snapshot of the lock table (and the run history) becomes a
``FleetSnapshot``: one ``KeyStatus`` per lock key.  From it come the Prometheus
metric families (as plain data: ``dislock.cli.serve`` hands them to
``prometheus_client``, which only the CLI depends on) and the status page's
order of rows (``dislock.cli.status_page`` renders it).  Also here: the scrape's
statements, the state a server keeps between scrapes so that it does not reread
the whole history each time (``RunCounts``, ``WindowStarts``), and the records of
the per-host textfile the wrapper writes (``DISLOCK_METRICS_TEXTFILE``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from psycopg import sql

from dislock.cli.admin import MODES, LockRow
from dislock.cli.fleet import SPANS_BEFORE, Span, span_of, still_held
from dislock.core.errors import ConfigurationError
from dislock.core.failover import TIMELINE_KEY
from dislock.core.history import OUTCOMES

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9655
"""Where ``serve`` listens unless told: loopback only; exposing it is a decision."""

SCRAPE_CONNECT_TIMEOUT = 3.0
"""Seconds a scrape waits for a connection: Prometheus gives up after 10 s by default."""

SCRAPE_STATEMENT_TIMEOUT_MS = 5000
"""A scrape's statements give up after this long: a slow database reads as down,
not as a scrape that hangs until Prometheus gives up on it."""

MISSED_WINDOW = timedelta(hours=24)
"""``dislock_missed_slots`` counts the slots of the key's schedule that began in the
last 24 hours (and at least a minute ago, ``dislock.cli.fleet.DEFAULT_GRACE``) in
which no run of the key started and none was still going: what ``dislockctl missed
KEY --since 24h`` lists.  ``dislock_covered_slots`` counts the ones without a start
during which a run still held the key's lease.  A key that first ran within the
window is judged from its first run's slot on."""

FAILED_OUTCOMES = ("failed", "lease_lost", "killed", "abandoned")
"""Outcomes a person must look at; the status page lists these first."""


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPV6]:PORT`` or a bare ``PORT`` (on loopback) into host and port.

    An empty host is refused rather than read as "every interface": exposing the
    fleet's state beyond this machine must be spelled out (``0.0.0.0:9655``).
    """
    raw = text.strip()
    if not raw:
        raise ConfigurationError("--listen is empty; give HOST:PORT, e.g. 127.0.0.1:9655")
    if raw.isdigit():
        host, port_text = DEFAULT_HOST, raw
    elif raw.startswith("["):
        inside, sep, rest = raw[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ConfigurationError(f"--listen {raw!r}: expected [IPV6]:PORT, e.g. [::1]:9655")
        host, port_text = inside, rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ConfigurationError(f"--listen {raw!r}: {host!r} is not an IPv6 address") from None
    else:
        host, sep, port_text = raw.rpartition(":")
        if not sep:
            raise ConfigurationError(f"--listen {raw!r}: expected HOST:PORT, e.g. 127.0.0.1:9655")
        if not host:
            raise ConfigurationError(
                f"--listen {raw!r} has no host; say 0.0.0.0:{port_text} to listen on every"
                " interface, or 127.0.0.1:PORT for this machine only"
            )
        if ":" in host:
            raise ConfigurationError(
                f"--listen {raw!r}: write an IPv6 host in brackets, [::1]:9655"
            )
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigurationError(f"--listen {raw!r}: the port must be a number from 0 to 65535")
    return host, int(port_text)


class HeldLock(NamedTuple):
    """One row of the lock table, as the page and ``dislock_lock_held`` see it."""

    mode: str
    """``schedule`` or ``lease``."""
    owner: str
    state: str
    """As ``dislockctl ls`` says it (``dislock.cli.admin.LockRow.state``): ``held``,
    ``released``, ``expired`` (abandoned) or ``ended`` (a slot that is over)."""
    seconds_left: float
    """Until it expires (negative: since it did)."""
    forced: bool = False
    """Released by ``dislockctl release`` rather than by its holder."""


class LastRun(NamedTuple):
    owner: str
    host: str
    started_at: datetime
    ended_at: datetime | None
    outcome: str
    """``ok``, ``failed``, ``lease_lost``, ``killed`` (``dislock.core.history.OUTCOMES``),
    or, with no end recorded, ``running`` or ``abandoned``."""
    exit_code: int | None
    duration_seconds: float | None


class KeyStatus(NamedTuple):
    """Everything known about one lock key at one moment."""

    lock_key: str
    locks: tuple[HeldLock, ...] = ()
    paused_until: datetime | None = None
    pause_reason: str | None = None
    last_run: LastRun | None = None
    last_success_at: datetime | None = None
    runs_total: Mapping[str, int] = {}
    schedule: str | None = None
    next_slot: datetime | None = None
    missed_slots: int | None = None
    """Slots in the window nobody ran in (None: no schedule known)."""
    covered_slots: int | None = None
    """Slots in the window without a start while a run still held the lease."""

    @property
    def state(self) -> str:
        """One word for the page: paused wins, then held, then how it was let go."""
        if self.paused_until is not None:
            return "paused"
        states = {lock.state for lock in self.locks}
        for state in ("held", "expired", "released", "ended"):
            if state in states:
                return state
        return "free"

    @property
    def failing(self) -> bool:
        return self.last_run is not None and self.last_run.outcome in FAILED_OUTCOMES


class FleetSnapshot(NamedTuple):
    """The fleet at ``now`` (database clock); ``up`` is False when the database did
    not answer, and then ``keys`` is empty."""

    now: datetime
    up: bool
    keys: tuple[KeyStatus, ...] = ()
    lock_delay_end: datetime | None = None
    """While a lock delay after a database failover runs, when it ends (no lock is
    taken before); None when none runs."""


class Family(NamedTuple):
    """One metric family, independent of any Prometheus library."""

    name: str
    kind: str
    """``gauge`` or ``counter`` (named without its ``_total`` suffix)."""
    documentation: str
    labels: tuple[str, ...]
    samples: tuple[tuple[tuple[str, ...], float], ...]


RUN_OUTCOMES = OUTCOMES
"""Finished outcomes ``dislock_runs_total`` always reports (zero if none), so that
``increase()`` sees a key's first failure."""


def _timestamp(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def metric_families(snapshot: FleetSnapshot) -> list[Family]:
    """The exposition of a snapshot.  A key without any run has no run metrics
    (a zero timestamp would read as "last succeeded in 1970")."""
    up = Family(
        "dislock_up",
        "gauge",
        "1 if the database answered this scrape, else 0.",
        (),
        (((), 1.0 if snapshot.up else 0.0),),
    )
    held: list[tuple[tuple[str, ...], float]] = []
    paused: list[tuple[tuple[str, ...], float]] = []
    starts: list[tuple[tuple[str, ...], float]] = []
    successes: list[tuple[tuple[str, ...], float]] = []
    durations: list[tuple[tuple[str, ...], float]] = []
    runs: list[tuple[tuple[str, ...], float]] = []
    missed: list[tuple[tuple[str, ...], float]] = []
    covered: list[tuple[tuple[str, ...], float]] = []
    for key in snapshot.keys:
        name = key.lock_key
        # One sample per mode: an N-holder lease has a row per slot, and counts its held ones.
        modes: dict[str, float] = {}
        for lock in key.locks:
            modes[lock.mode] = modes.get(lock.mode, 0.0) + (1.0 if lock.state == "held" else 0.0)
        held.extend(((name, mode), count) for mode, count in modes.items())
        paused.append(((name,), 1.0 if key.paused_until is not None else 0.0))
        if key.last_run is not None:
            starts.append(((name,), key.last_run.started_at.timestamp()))
            if key.last_run.duration_seconds is not None:
                durations.append(((name,), key.last_run.duration_seconds))
        success = _timestamp(key.last_success_at)
        if success is not None:
            successes.append(((name,), success))
        if key.last_run is not None or key.runs_total:
            outcomes = dict.fromkeys(RUN_OUTCOMES, 0) | dict(key.runs_total)
            runs.extend(
                ((name, outcome), float(count)) for outcome, count in sorted(outcomes.items())
            )
        if key.missed_slots is not None:
            missed.append(((name,), float(key.missed_slots)))
        if key.covered_slots is not None:
            covered.append(((name,), float(key.covered_slots)))
    window = int(MISSED_WINDOW.total_seconds() // 3600)
    delay = Family(
        "dislock_lock_delay_end_timestamp_seconds",
        "gauge",
        "While a lock delay after a database failover runs, when it ends: no lock of any"
        " key is taken before. 0 when none runs.",
        (),
        (((), _timestamp(snapshot.lock_delay_end) or 0.0),) if snapshot.up else (),
    )
    return [
        up,
        delay,
        Family(
            "dislock_lock_held",
            "gauge",
            "1 while the key's lock of this mode is held, 0 once released or expired"
            " (an N-holder lease: how many of its slots are held).",
            ("key", "mode"),
            tuple(held),
        ),
        Family(
            "dislock_paused",
            "gauge",
            "1 while the key is paused fleet-wide.",
            ("key",),
            tuple(paused),
        ),
        Family(
            "dislock_last_start_timestamp_seconds",
            "gauge",
            "When the key's latest recorded run started (database clock).",
            ("key",),
            tuple(starts),
        ),
        Family(
            "dislock_last_success_timestamp_seconds",
            "gauge",
            "When the key's latest successful run (exit 0) ended (database clock).",
            ("key",),
            tuple(successes),
        ),
        Family(
            "dislock_last_run_duration_seconds",
            "gauge",
            "How long the key's latest run took (so far, while it runs).",
            ("key",),
            tuple(durations),
        ),
        Family(
            "dislock_runs",
            "counter",
            "Recorded runs of the key by outcome, over the history the table keeps.",
            ("key", "outcome"),
            tuple(runs),
        ),
        Family(
            "dislock_missed_slots",
            "gauge",
            f"Schedule slots that began in the last {window} h in which no run of the key"
            " started and none was still going.",
            ("key",),
            tuple(missed),
        ),
        Family(
            "dislock_covered_slots",
            "gauge",
            f"Schedule slots that began in the last {window} h without a start of the key"
            " because a run of it still held the lease (a run longer than its interval).",
            ("key",),
            tuple(covered),
        ),
    ]


def page_order(keys: Iterable[KeyStatus]) -> list[KeyStatus]:
    """Rows as a person wants them: the newest failures first, then keys that missed
    slots, then the rest by name."""
    keys = list(keys)
    failing = sorted(
        (key for key in keys if key.failing),
        key=lambda key: key.last_run.started_at if key.last_run else datetime.min,
        reverse=True,
    )
    rest = [key for key in keys if not key.failing]
    missing = sorted((key for key in rest if key.missed_slots), key=lambda key: key.lock_key)
    others = sorted((key for key in rest if not key.missed_slots), key=lambda key: key.lock_key)
    return failing + missing + others


class LatestRow(NamedTuple):
    """A key's latest run: ``dislock.cli.fleet.latest_query``'s row (outcome derived
    there: ``running`` or ``abandoned`` when no end was recorded) completed by
    ``ScrapeStatements.run_details``."""

    lock_key: str
    owner: str
    host: str
    started_at: datetime
    ended_at: datetime | None
    outcome: str
    exit_code: int | None
    cron: str | None
    cron_tz: str | None
    """The zone its cron expression was read in (None: UTC, from before zones)."""
    duration_seconds: float | None
    """None while it runs (then it is counted up to ``now``) or once abandoned."""
    last_success_at: datetime | None
    ran_before_window: bool


def _schedule_text(row: LatestRow) -> str | None:
    if row.cron is None or row.cron_tz in (None, "UTC"):
        return row.cron
    return f"{row.cron} ({row.cron_tz})"


def build_snapshot(
    now: datetime,
    lock_rows: Iterable[LockRow],
    latest: Iterable[LatestRow],
    *,
    runs_total: Mapping[str, Mapping[str, int]],
    missed: Mapping[str, int],
    next_slots: Mapping[str, datetime],
    covered: Mapping[str, int] | None = None,
) -> FleetSnapshot:
    """One ``KeyStatus`` per key found in the lock table or the history."""
    locks: dict[str, list[HeldLock]] = {}
    pauses: dict[str, tuple[str, datetime]] = {}
    for lock in lock_rows:
        if lock.mode == "pause":
            if lock.expires_in_seconds > 0:
                pauses[lock.lock_key] = (lock.owner, lock.expire_at)
            continue
        if lock.mode not in MODES:
            continue  # a kind of row this version does not know: not ours to judge
        locks.setdefault(lock.lock_key, []).append(
            HeldLock(lock.mode, lock.owner, lock.state, lock.expires_in_seconds, lock.forced)
        )
    runs = {row.lock_key: row for row in latest}
    statuses = []
    for lock_key in sorted(set(locks) | set(runs) | set(pauses)):
        row = runs.get(lock_key)
        last_run = None
        if row is not None:
            duration = row.duration_seconds
            if row.outcome == "running":
                duration = max(0.0, (now - row.started_at).total_seconds())
            last_run = LastRun(
                row.owner,
                row.host,
                row.started_at,
                row.ended_at,
                row.outcome,
                row.exit_code,
                duration,
            )
        reason, until = pauses.get(lock_key, (None, None))
        statuses.append(
            KeyStatus(
                lock_key,
                locks=tuple(
                    sorted(locks.get(lock_key, ()), key=lambda lock: lock.mode != "schedule")
                ),
                paused_until=until,
                pause_reason=reason or None,
                last_run=last_run,
                last_success_at=row.last_success_at if row else None,
                runs_total=dict(runs_total.get(lock_key, {})),
                schedule=_schedule_text(row) if row else None,
                next_slot=next_slots.get(lock_key),
                missed_slots=missed.get(lock_key),
                covered_slots=(covered or {}).get(lock_key),
            )
        )
    return FleetSnapshot(now, up=True, keys=tuple(statuses))


def lock_delay_query(table: tuple[str, ...]) -> tuple[sql.Composed, tuple[str]]:
    """The end of the latest lock delay (``expire_at`` of the timeline's metadata row,
    ``dislock.core.failover.TIMELINE_KEY``); no row before the first acquisition.
    Unlike ``check``'s query it does not read the server's timeline, which a standby
    (where a read-only scrape may well go) cannot tell."""
    query = sql.SQL("SELECT expire_at FROM {} WHERE key = %s").format(sql.Identifier(*table))
    return query, (TIMELINE_KEY,)


def lock_delay_end(expire_at: datetime | None, now: datetime) -> datetime | None:
    """``FleetSnapshot.lock_delay_end`` from the timeline row's ``expire_at`` (in the
    past once the delay is over) and the database clock."""
    return expire_at if expire_at is not None and expire_at > now else None


RECENT_SECONDS = 60
"""A history row is read again while its run started less than this long ago: a
start statement that took its id earlier may commit a little later (history
statements are cancelled after ``HISTORY_TIMEOUT``, well within this)."""


class RunCounts:
    """``dislock_runs_total``, kept by reading only what is new since the last scrape.

    Counting a million history rows on every scrape would take most of the time a
    scrape may take; instead the first scrape counts every finished run once, and
    each later one reads the rows past ``floor`` (the newest run that started more
    than ``RECENT_SECONDS`` ago: every row below it is committed) plus the runs it
    saw unfinished.  A run is counted once, when it is first seen finished.  So the
    totals only grow: pruning the history does not lower them, and they restart
    from the table when ``serve`` restarts, which Prometheus reads as a reset.
    """

    def __init__(self) -> None:
        self.totals: dict[tuple[str, str], int] = {}
        self.floor: int | None = None
        """Every run with an id up to this was seen (counted, or in ``pending``)."""
        self.pending: set[int] = set()
        """Runs at or below ``floor`` not finished when last seen."""
        self._counted: set[int] = set()
        """Finished runs above ``floor`` already counted."""

    def absorb_initial(
        self, floor: int, grouped: Sequence[tuple[str, str | None, int, Sequence[int] | None]]
    ) -> None:
        """The first scrape's census of the runs up to ``floor``: ``(lock_key, outcome,
        count, ids of the unfinished)`` per key and outcome (outcome None: unfinished)."""
        for lock_key, outcome, count, unfinished in grouped:
            if outcome is None:
                self.pending.update(unfinished or ())
            else:
                self.totals[lock_key, outcome] = self.totals.get((lock_key, outcome), 0) + count
        self.floor = floor

    def absorb(self, new_floor: int, rows: Iterable[Sequence[Any]]) -> None:
        """Rows ``(id, lock_key, outcome, ...)`` above the old floor or pending, read in
        the same snapshot as ``new_floor``."""
        old_floor = self.floor or 0
        for run_id, lock_key, outcome, *_ in rows:
            # Below the old floor only a pending run is news; the rest was counted.
            fresh = run_id > old_floor or run_id in self.pending
            if outcome is not None and fresh and run_id not in self._counted:
                self.totals[lock_key, outcome] = self.totals.get((lock_key, outcome), 0) + 1
                self.pending.discard(run_id)
                self._counted.add(run_id)
            elif outcome is None and run_id <= new_floor:
                self.pending.add(run_id)
        # Below the floor a finished run is never read again, so it need not be remembered.
        self._counted = {run_id for run_id in self._counted if run_id > new_floor}
        self.floor = max(new_floor, self.floor or 0)

    def by_key(self) -> dict[str, dict[str, int]]:
        found: dict[str, dict[str, int]] = {}
        for (lock_key, outcome), count in self.totals.items():
            found.setdefault(lock_key, {})[outcome] = count
        return found


class ScrapeStatements(NamedTuple):
    """The statements of a scrape, on one history table.  Each runs in the scrape's
    READ ONLY, REPEATABLE READ transaction, so they all see one moment."""

    run_details: sql.Composed
    """What the page and the missed-slot count need of the runs %(ids)s beyond
    ``latest_query``: id, owner, exit code, cron expression and zone, whether the key ran
    before %(since)s (the start of the missed-slot window): primary-key lookups and
    one ``(lock_key, started_at)`` index probe per run."""
    floor: sql.Composed
    """``RunCounts.floor``: the id of the newest run that started more than
    %(recent)s seconds ago (0 if none)."""
    census: sql.Composed
    """The first scrape's count of the runs up to %(floor)s, for ``RunCounts.absorb_initial``."""
    window_starts: sql.Composed
    """The first scrape's starts since %(since)s of runs with a schedule, for
    ``WindowStarts``, through the ``(started_at)`` index: id, lock_key, started_at,
    slot_end, then the run's span columns (``span_columns``)."""
    new_runs: sql.Composed
    """Runs past %(floor)s or among %(pending)s, for ``RunCounts.absorb`` and
    ``WindowStarts``: id, lock_key, outcome, started_at, slot_end, has a schedule,
    then the span columns."""
    spans_before: sql.Composed
    """The first scrape's runs of the keys %(keys)s that began before %(since)s and
    may still have been going then (``dislock.cli.fleet.spans_query``'s rule): id,
    lock_key, started_at, then the span columns."""


SPAN_COLUMNS = (
    " position('lease' IN {run}.modes) > 0, {run}.ended_at, {run}.ended_at IS NULL AND {held}"
)
"""Whether the run took a lease, its end, and whether it still holds its lease
(``dislock.cli.fleet.span_of``'s arguments, after the first)."""


def span_of_row(
    started_at: datetime, leased: bool, ended_at: datetime | None, running: bool
) -> Span | None:
    """A history row's span (None: not a lease run, or abandoned)."""
    return span_of(started_at, ended_at, running) if leased else None


def scrape_statements(history: tuple[str, ...], locks: tuple[str, ...]) -> ScrapeStatements:
    """The statements of a scrape of ``history`` (each ``{table}`` below) next to
    the lock table ``locks``."""
    table = sql.Identifier(*history)

    def spans(run: str) -> sql.Composed:
        return sql.SQL(SPAN_COLUMNS).format(run=sql.Identifier(run), held=still_held(run, locks))

    def on_history(text: str) -> sql.Composed:
        return sql.SQL(text).format(table=table, spans=spans("h"), spans_b=spans("b"))

    return ScrapeStatements(
        run_details=on_history(
            "SELECT h.id, h.owner, h.exit_code, h.cron, h.cron_tz,"
            " EXISTS (SELECT FROM {table} AS p WHERE p.lock_key = h.lock_key"
            " AND p.started_at < %(since)s)"
            " FROM {table} AS h WHERE h.id = ANY(%(ids)s)"
        ),
        floor=on_history(
            "SELECT COALESCE((SELECT id FROM {table}"
            " WHERE started_at < NOW() - make_interval(secs => %(recent)s)"
            " ORDER BY started_at DESC LIMIT 1), 0)"
        ),
        census=on_history(
            "SELECT lock_key, outcome, count(*)::bigint,"
            " array_agg(id) FILTER (WHERE outcome IS NULL)"
            " FROM {table} WHERE id <= %(floor)s GROUP BY lock_key, outcome"
        ),
        window_starts=on_history(
            "SELECT h.id, h.lock_key, h.started_at, h.slot_end,{spans} FROM {table} AS h"
            " WHERE h.started_at >= %(since)s AND h.cron IS NOT NULL"
        ),
        new_runs=on_history(
            "SELECT h.id, h.lock_key, h.outcome, h.started_at, h.slot_end, h.cron IS NOT NULL,"
            "{spans} FROM {table} AS h WHERE h.id > %(floor)s OR h.id = ANY(%(pending)s)"
        ),
        spans_before=on_history(
            "SELECT b.id, b.lock_key, b.started_at,{spans_b}"
            " FROM unnest(%(keys)s::text[]) AS k(lock_key),"
            " LATERAL (SELECT * FROM {table} AS p WHERE p.lock_key = k.lock_key"
            " AND p.started_at < %(since)s ORDER BY p.started_at DESC"
            f" LIMIT {int(SPANS_BEFORE)}) AS b"
            " WHERE b.cron IS NOT NULL AND position('lease' IN b.modes) > 0"
            " AND (b.ended_at IS NULL OR b.ended_at > %(since)s)"
        ),
    )


class WindowStarts:
    """Each key's scheduled run starts in the missed-slot window, kept across scrapes.

    The first scrape reads the window (``ScrapeStatements.window_starts``); later ones
    only add the runs ``ScrapeStatements.new_runs`` returns anyway, and drop those the
    window left.
    It keeps the spans of the key's lease runs as well (``set_span``): those that
    were still going at some point of the window, which cover the slots they
    overlap (``dislock.cli.fleet.split_covered``).
    ``version`` changes with a key's starts or spans, so that its missed-slot count
    is only recomputed when they (or its schedule's slots) changed.
    """

    def __init__(self) -> None:
        self.loaded = False
        self._by_key: dict[str, dict[int, tuple[datetime, datetime | None]]] = {}
        self._spans: dict[str, dict[int, Span]] = {}
        self._versions: dict[str, int] = {}

    def set_span(self, run_id: int, lock_key: str, span: Span | None) -> None:
        """The run's span as last read (None: none, or no longer: it was abandoned)."""
        spans = self._spans.setdefault(lock_key, {})
        if spans.get(run_id) == span:
            return
        if span is None:
            del spans[run_id]
        else:
            spans[run_id] = span
        self._versions[lock_key] = self._versions.get(lock_key, 0) + 1

    def spans_of(self, lock_key: str) -> list[Span]:
        return list(self._spans.get(lock_key, {}).values())

    def add(
        self, run_id: int, lock_key: str, started_at: datetime, slot_end: datetime | None
    ) -> None:
        runs = self._by_key.setdefault(lock_key, {})
        if run_id not in runs:
            runs[run_id] = (started_at, slot_end)
            self._versions[lock_key] = self._versions.get(lock_key, 0) + 1

    def trim(self, since: datetime) -> None:
        for lock_key, runs in self._by_key.items():
            stale = [run_id for run_id, (started, _) in runs.items() if started < since]
            for run_id in stale:
                del runs[run_id]
            if stale:
                self._versions[lock_key] = self._versions.get(lock_key, 0) + 1
        for lock_key, spans in self._spans.items():
            # A span still matters while it reaches into the window.
            over = [run for run, span in spans.items() if span.end and span.end <= since]
            for run in over:
                del spans[run]
            if over:
                self._versions[lock_key] = self._versions.get(lock_key, 0) + 1

    def of(self, lock_key: str) -> list[tuple[datetime, datetime | None]]:
        return list(self._by_key.get(lock_key, {}).values())

    def copy(self) -> WindowStarts:
        """A copy that the original's later changes leave alone: every per-key map is
        copied (their values are immutable)."""
        clone = WindowStarts.__new__(WindowStarts)
        for name, value in vars(self).items():
            if isinstance(value, dict):
                value = {k: dict(v) if isinstance(v, dict) else v for k, v in value.items()}
            setattr(clone, name, value)
        return clone

    def version(self, lock_key: str) -> int:
        return self._versions.get(lock_key, 0)


# The per-host alternative: the wrapper keeps its own runs' metrics in a file that
# node_exporter's textfile collector reads (DISLOCK_METRICS_TEXTFILE).

TEXTFILE_VARIABLE = "DISLOCK_METRICS_TEXTFILE"

HOST_FAMILIES = (
    "dislock_last_start_timestamp_seconds",
    "dislock_last_success_timestamp_seconds",
    "dislock_last_run_duration_seconds",
    "dislock_runs",
)
"""The families a host's file holds: its own runs only (held locks, pauses and
missed slots are fleet-wide facts, for ``serve``)."""


class HostRecord(NamedTuple):
    """One lock key's runs on this host, as its textfile keeps them."""

    last_start: float
    last_duration: float
    last_success: float | None
    runs: Mapping[str, int]


def read_host_records(
    samples: Iterable[tuple[str, Mapping[str, str], float]],
) -> dict[str, HostRecord]:
    """The records in a textfile, from its samples ``(name, labels, value)``; samples
    this version did not write are left out (and so dropped on the next write)."""
    values: dict[str, dict[str, float]] = {}
    runs: dict[str, dict[str, int]] = {}
    for name, labels, value in samples:
        key = labels.get("key")
        if key is None:
            continue
        if name == "dislock_runs_total" and "outcome" in labels:
            runs.setdefault(key, {})[labels["outcome"]] = int(value)
        elif name in HOST_FAMILIES:
            values.setdefault(key, {})[name] = value
    records = {}
    for key, found in values.items():
        if "dislock_last_start_timestamp_seconds" not in found:
            continue
        records[key] = HostRecord(
            found["dislock_last_start_timestamp_seconds"],
            found.get("dislock_last_run_duration_seconds", 0.0),
            found.get("dislock_last_success_timestamp_seconds"),
            runs.get(key, {}),
        )
    return records


def record_run(
    records: Mapping[str, HostRecord], lock_key: str, started: float, ended: float, outcome: str
) -> dict[str, HostRecord]:
    """``records`` with one more run of ``lock_key`` (times in seconds since the epoch)."""
    previous = records.get(lock_key)
    runs = dict(previous.runs) if previous else {}
    runs[outcome] = runs.get(outcome, 0) + 1
    success = ended if outcome == "ok" else (previous.last_success if previous else None)
    return {**records, lock_key: HostRecord(started, max(0.0, ended - started), success, runs)}


def host_families(records: Mapping[str, HostRecord]) -> list[Family]:
    """The textfile's families: those of ``metric_families`` a host can know alone."""
    epoch = datetime.fromtimestamp(0, tz=timezone.utc)
    keys = tuple(
        KeyStatus(
            key,
            last_run=LastRun(
                "",
                "",
                epoch + timedelta(seconds=record.last_start),
                None,
                "",
                None,
                record.last_duration,
            ),
            last_success_at=(
                None
                if record.last_success is None
                else epoch + timedelta(seconds=record.last_success)
            ),
            runs_total=record.runs,
        )
        for key, record in sorted(records.items())
    )
    return [
        family
        for family in metric_families(FleetSnapshot(epoch, up=True, keys=keys))
        if family.name in HOST_FAMILIES
    ]
