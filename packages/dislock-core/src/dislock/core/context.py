"""``LockContext``: everything a lock needs to know, validated once, at construction."""

from __future__ import annotations

import enum
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, Any

from dislock.core import bounds, config, setting
from dislock.core import variables as v
from dislock.core.after import check_after
from dislock.core.dsn import parse_dsn, redact_dsn
from dislock.core.errors import ConfigurationError

if TYPE_CHECKING:
    from dislock.core.cron_zone import CronZone

DEFAULT_CONNECT_TIMEOUT: float = v.CONNECT_TIMEOUT.value
"""Seconds to wait for a connection, unless the URL or the caller says otherwise."""

LEASE_LOST_EXIT_CODE = 75
"""Exit code of a wrapped command terminated because its lease was lost (EX_TEMPFAIL)."""

MAX_RUNTIME_EXIT_CODE = 124
"""Exit code of a wrapped command stopped because it ran past ``max_runtime_seconds``
(as ``timeout(1)`` exits)."""

URL_VARIABLE = "DATABASE_URL"
"""Where a ``LockContext`` given no ``url`` reads it: the variable the CLI's examples name."""

URL_FROM_ENVIRONMENT = f"${URL_VARIABLE}"
"""``url``'s default: read ``$DATABASE_URL`` as the context is built.  Not an empty
string, so that ``url=os.environ.get("OTHER", "")`` still fails as empty rather
than fall back to another database."""

DEFAULT_TABLE = ("key_value",)
"""The lock table when none is named, as the CLI's ``LOCK_TABLE`` default."""


def default_owner() -> str:
    """``hostname:pid:nonce`` — readable, and unique per run even where containers
    share hostnames and pid 1."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"


class LeaseLossPolicy(str, enum.Enum):
    """What happens when a lease stops being held while work is running."""

    TERMINATE = "terminate"
    """Stop a wrapped command (exit 75); raise ``LeaseLostError`` after a guarded block."""

    CONTINUE = "continue"
    """Only log the loss: the work runs to completion and is reported as usual."""

    @classmethod
    def parse(cls, value: object, *, name: str = "lease_loss_policy") -> LeaseLossPolicy:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls(value.strip().lower())
            except ValueError:
                pass
        raise ConfigurationError(f"{name} must be 'terminate' or 'continue', got {value!r}")


@dataclass(frozen=True, kw_only=True)
class LockContext:
    """Where the lock lives, who owns it and for how long.

    Validated on construction: a bad value raises ``ConfigurationError`` (a
    ``ValueError``) before any connection is opened.  ``url`` never appears in
    ``repr``; a redacted description does.
    """

    lock_key: str
    """Logical lock name, shared by every process that must not run together."""
    url: str = field(default=URL_FROM_ENVIRONMENT, repr=False)
    """PostgreSQL URL or DSN. Left out (or ``"$DATABASE_URL"``): read from that
    environment variable as the context is built."""
    table_parts: Sequence[str] = DEFAULT_TABLE
    """``["key_value"]`` (the default) or ``["schema", "key_value"]``; stored as a tuple."""
    owner: str = field(default_factory=default_owner)
    """This holder's token, written to the row's ``value`` column.  Default:
    ``hostname:pid:nonce``, made as the context is built (not before a fork)."""
    next_run_time: datetime | None = None
    """When the schedule slot ends (timezone-aware). Computed from ``schedule`` and the
    database clock when left out."""
    run_ttl_seconds: float | None = None
    """Lease time-to-live: the row expires this long after the last renewal."""
    lease_interval_seconds: float | None = None
    """Heartbeat cadence of the lease renewer; at most the TTL.  Left out with a
    TTL given: 30 % of the TTL, kept within 1 to 10 s (the CLI's ``LOCK_LEASE_INTERVAL``
    default)."""
    schedule: str | None = None
    """Cron expression of the job; used for ``next_run_time`` when that is not given."""
    jitter_max_seconds: float = v.JITTER.value
    """Sleep a random time in ``[0, jitter_max_seconds]`` before acquiring."""
    lease_loss_policy: LeaseLossPolicy = LeaseLossPolicy.TERMINATE
    """``TERMINATE`` (default) or ``CONTINUE``."""
    connect_timeout_seconds: float = DEFAULT_CONNECT_TIMEOUT
    """Give up connecting after this long (unless the URL sets ``connect_timeout``)."""
    connect_patience_seconds: float = v.CONNECT_PATIENCE.value
    """Keep retrying a refused connection (too many connections, a server starting up or
    restarting) this long, never past the end of a schedule slot. 0: report the first
    refusal."""
    max_runtime_seconds: float | None = None
    """Bound a run: a command run with ``run_with_locks`` is stopped this long after it
    started (exit ``MAX_RUNTIME_EXIT_CODE``, 124); a guarded block ends with
    ``MaxRuntimeExceeded``.  Recorded as ``timed_out``.  None: no bound."""
    output_tail_bytes: int = v.OUTPUT_TAIL.value
    """With ``run_with_locks`` and ``history``: keep the last this many bytes of the
    command's stdout and stderr in the history row of a run that did not succeed
    (``dislock.core.output_tail``).  0: the command inherits the streams."""
    retries: int = v.RETRIES.value
    """With a schedule: how many more attempts a slot gets after a run in it failed,
    each taken by the first acquisition, on any machine, at least
    ``retry_delay_seconds`` after the failed one ended (twice that after the second,
    and so on), within the same slot (``dislock.core.retries``).  0: none."""
    retry_delay_seconds: float = v.RETRY_DELAY.value
    """The pause before a slot's first retry; it doubles for each retry after it."""
    start_deadline_seconds: float | None = None
    """With ``schedule``: an acquisition more than this many seconds after its slot
    began (the cron fire, on the database clock) does not start it, and marks an
    unstarted slot late (``SlotLateError``, recorded as ``late``).  None: a slot
    may start until it ends."""
    after: Sequence[str] = ()
    """With ``schedule`` and ``history``: keys that each need a run that succeeded in
    this slot before it starts; until then ``LockNotAcquiredError`` names the key (or
    ``wait_seconds`` waits), the slot left open (``dislock.core.after``)."""
    fencing: bool = False
    """Hand out fencing tokens: each acquisition bumps and returns the row's ``fence``
    column (``dislockctl init --fencing`` adds it)."""
    history: bool = False
    """Record each run that gets its locks in the history table (``dislockctl init
    --history``), one row per run.  A failing history write is logged at WARNING
    and never fails the run."""
    history_table: Sequence[str] | None = None
    """The history table, like ``table_parts``; default: ``<table>_history`` beside it."""
    wait_seconds: float = v.WAIT.value
    """Wait up to this long for a lease held elsewhere before giving up (0: give up at
    once). Woken by the holder's release (``LISTEN``/``NOTIFY``), or by polling."""
    wait_poll_seconds: float = v.WAIT_POLL.value
    """While waiting without ``LISTEN``: try again about this often (jittered)."""
    wait_listen: bool | None = None
    """While waiting: ``LISTEN`` for releases (True), poll only (False), or find out
    (None: ``LISTEN`` unless the connection goes through a pooler such as PgBouncer)."""
    slots: int = v.SLOTS.value
    """How many holders a lease admits at once (a semaphore); 1 is a plain lease."""
    group: str | None = None
    """``"NAME:N"``: at most N runs at once among every key naming group NAME, each
    holding one of the group's N slots while it runs (``dislock.core.groups``)."""
    lease_mode: str = field(default="lease", repr=False)
    """The mode of the lease's row keys: ``"group"`` for a group's own slots."""
    replace: bool = False
    """With a lease held by a live holder: ask it to stop and hand the lease over,
    rather than be refused (``dislock.core.replace_marks``)."""
    cron_tz: str | tzinfo | None = None
    """Time zone ``schedule`` is read in: an IANA name (``"Europe/Berlin"``) or a
    ``tzinfo``. Default: the local zone (``TZ``, else ``/etc/localtime``), as cron.
    Slots are still taken on the database clock."""
    cron_zone: CronZone | None = field(default=None, init=False, repr=False, compare=False)
    """The resolved zone, with the name to show and record (``None`` without a schedule)."""

    def __post_init__(self) -> None:
        self._check_where()
        for number in v.NUMBERS:  # each by its bound, the wrapper's as its own
            name = number.field
            if name is not None and (getattr(self, name) is not None or name not in _UNSET_BY_NONE):
                _set(self, name, number.check(getattr(self, name), setting.name(number)))
        self._check_lease()
        self._check_schedule()
        self._check_run()
        self._check_waiting()
        self._check_slot()

    def _check_where(self) -> None:
        """The database, the table, the key, and who holds it."""
        if self.url == URL_FROM_ENVIRONMENT:
            url = os.environ.get(URL_VARIABLE, "")
            if not url.strip():
                raise ConfigurationError(f"no url given and ${URL_VARIABLE} is not set")
            _set(self, "url", url)
        parse_dsn(self.url)
        _set(self, "table_parts", config.check_table_parts(self.table_parts))
        bounds.check_key(setting.name(v.KEY), self.lock_key)
        bounds.check_key("owner", self.owner)
        for flag in ("fencing", "history", "replace"):
            if not isinstance(value := getattr(self, flag), bool):
                raise ConfigurationError(f"{flag} must be True or False, got {value!r}")

    def _check_lease(self) -> None:
        """The heartbeat within the TTL (a slower one would let the lease lapse between
        renewals); left out, 30 % of the TTL kept within 1 to 10 s."""
        ttl, interval = self.run_ttl_seconds, self.lease_interval_seconds
        heartbeat = setting.name(v.HEARTBEAT)
        if ttl is not None and interval is None:
            interval = min(max(ttl * 0.3, 1.0), 10.0)
            if interval > ttl:
                raise ConfigurationError(
                    f"{setting.name(v.TTL)}={ttl:g} is shorter than the 1 s minimum heartbeat:"
                    f" {setting.either('give', 'set')} {heartbeat} too"
                )
            _set(self, "lease_interval_seconds", interval)
        elif ttl is not None and interval is not None and interval > ttl:
            raise ConfigurationError(
                f"{heartbeat} ({interval:g} s) must not exceed the lease TTL ({ttl:g} s)"
            )
        policy = LeaseLossPolicy.parse(self.lease_loss_policy, name=setting.name(v.LEASE_LOSS))
        _set(self, "lease_loss_policy", policy)

    def _check_schedule(self) -> None:
        """The slot: its end, or the cron expression and zone it is computed from."""
        if (end := self.next_run_time) is not None and not isinstance(end, datetime):
            raise ConfigurationError(f"next_run_time must be a datetime, got {end!r}")
        if end is not None and (end.tzinfo is None or end.utcoffset() is None):
            raise ConfigurationError(
                "next_run_time must be timezone-aware (e.g. datetime.now(timezone.utc)); "
                f"got naive {end.isoformat()}"
            )
        if self.schedule is not None or self.cron_tz is not None:
            # Only schedule users pay for croniter and for reading the zone database.
            from dislock.core.cron import check_cron, check_jitter
            from dislock.core.cron_zone import load_zone, local_zone

            zone = local_zone() if self.cron_tz is None else load_zone(self.cron_tz)
            _set(self, "cron_zone", zone)
            _set(self, "cron_tz", zone.tz)
            if self.schedule is not None:
                _set(self, "schedule", check_cron(self.schedule, name=setting.name(v.SCHEDULE)))
                names = setting.name(v.JITTER), setting.name(v.SCHEDULE)
                check_jitter(self.schedule, self.jitter_max_seconds, *names)

    def _check_run(self) -> None:
        """What a run records."""
        if self.history_table is not None:
            _set(self, "history_table", config.check_table_parts(self.history_table))
        if self.output_tail_bytes and not self.history:
            raise ConfigurationError(
                f"{setting.name(v.OUTPUT_TAIL)} keeps a failed run's output in its history row:"
                f" it needs {_history_on()}"
            )

    def _check_waiting(self) -> None:
        """Waiting for a held lease, its slots, and replacing its holder."""
        if (listen := self.wait_listen) is not None and not isinstance(listen, bool):
            raise ConfigurationError(f"wait_listen must be True, False or None, got {listen!r}")
        if self.group is not None:
            from dislock.core.groups import parse_group

            _set(self, "group", str(parse_group(self.group, name=setting.name(v.GROUP))))
        if self.lease_mode not in ("lease", "group"):
            raise ConfigurationError(f"lease_mode must be 'lease' or 'group': {self.lease_mode!r}")
        if self.replace and len(self.owner.encode()) > bounds.MAX_OWNER_BYTES:
            raise ConfigurationError(
                f"replace writes its owner token beside the holder's: it must be at most"
                f" {bounds.MAX_OWNER_BYTES} bytes (UTF-8)"
            )
        if self.replace and self.slots > 1:
            slots = setting.either(f"{self.slots} slots", f"{v.SLOTS.name}={self.slots}")
            raise ConfigurationError(
                f"{setting.on(v.REPLACE)} takes over a lease's one holder: it cannot be"
                f" combined with {slots}"
            )

    def _check_slot(self) -> None:
        """A slot's retries, the keys it comes after, and its start deadline."""
        names = _after_names()
        after = check_after(self.after, history=self.history, schedule=self.schedule, names=names)
        _set(self, "after", after)
        if self.retries or self.start_deadline_seconds is not None:
            from dislock.core.retries import check_owner

            check_owner(self.owner)
        if self.start_deadline_seconds is not None and self.schedule is None:
            needs = setting.either("schedule", "the schedule strategy")
            raise ConfigurationError(
                f"{setting.name(v.START_DEADLINE)} needs {needs}: a slot's start is the cron fire"
                " that opened it"
            )

    def __repr__(self) -> str:
        # Every field but those that ask not to be shown (``url``, whose password
        # must never be, comes first, redacted): a field added later shows itself.
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        return f"LockContext(url={redact_dsn(self.url)!r}, {shown})"


_UNSET_BY_NONE = frozenset(f.name for f in fields(LockContext) if f.default is None)
"""The fields that None leaves unset (their default); any other number refuses None."""


def _set(context: LockContext, name: str, value: object) -> None:
    # Normalising a field of a frozen dataclass during __post_init__.
    object.__setattr__(context, name, value)


def context_from_environment(strategies: Sequence[str], **fields: Any) -> LockContext:
    """A ``LockContext`` of the wrapper's variables (read through ``dislock.core.variables``)
    for ``strategies``: checked as any, each refusal naming the variable, not the field."""
    with setting.by_variables():
        context = LockContext(**fields)
        check_strategies(context, strategies)
        return context


def _history_on() -> str:
    return setting.on(v.HISTORY) + setting.either("", " (and dislockctl init --history)")


def _after_names() -> tuple[str, str, str]:
    """``after``'s name, and what it needs: the history, and a slot."""
    slot = setting.either(
        "schedule and the schedule strategy", "LOCK_STRATEGY=schedule (or schedule,lease)"
    )
    return setting.name(v.AFTER), _history_on(), slot


def check_strategies(context: LockContext, strategies: Sequence[str]) -> None:
    """What the strategies allow: retries, a start deadline and ``after`` need a schedule
    slot (a lease-only job may have a schedule, for its history); waiting, slots and
    replacing need a lease, unless a group or ``after`` is waited for."""
    from dislock.core.retries import check_retries
    from dislock.core.waiting import check_waiting

    names = (setting.name(v.RETRIES), setting.name(v.START_DEADLINE))
    check_retries(strategies, context.retries, context.start_deadline_seconds, names=names)
    if context.after and config.SCHEDULE not in strategies:
        check_after(context.after, history=context.history, schedule=None, names=_after_names())
    try:
        check_waiting(
            strategies,
            context.wait_seconds,
            context.slots,
            context.replace,
            group=context.group is not None,
            after=bool(context.after),
        )
    except ConfigurationError as exc:
        # The wrapper's strategies are a variable too: its refusal quotes it.
        quoted = setting.either("", f"{v.STRATEGY.name}={','.join(strategies)!r}: ")
        raise ConfigurationError(f"{quoted}{exc}") from None


def strategies_for(context: LockContext) -> tuple[str, ...]:
    """The locks a context's settings ask for, when no strategy is named
    (``with_locks``): a schedule slot with ``schedule`` or ``next_run_time``, a
    lease with ``run_ttl_seconds``, both with both."""
    chosen = []
    if context.schedule is not None or context.next_run_time is not None:
        chosen.append("schedule")
    if context.run_ttl_seconds is not None:
        chosen.append("lease")
    if not chosen:
        raise ConfigurationError(
            f"no lock for {context.lock_key!r}: give schedule= (one start per slot), "
            "run_ttl_seconds= (one holder at a time), both, or strategies"
        )
    return tuple(chosen)
