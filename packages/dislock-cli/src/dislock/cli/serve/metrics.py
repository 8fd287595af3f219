"""The Prometheus metric families of a fleet snapshot (``metric_families``): a key's run
families (``dislock.cli.run_metrics``, shared with the wrapper's textfile, which also hands
them to ``prometheus_client``) and the fleet-wide ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from dislock.cli.run_metrics import Family, RunRecord, Sample, key_label, run_families
from dislock.cli.runs.envelope import FACTOR, MIN_RUNS, SLOW, WINDOW
from dislock.cli.serve.fleet_status import MISSED_WINDOW, FleetSnapshot, KeyStatus

_HOURS = int(MISSED_WINDOW.total_seconds() // 3600)

_SLOT_FAMILIES = {
    "missed_slots": " in which no run of the key started and none was still going"
    " (late ones included; paused ones not).",
    "failed_slots": " and are over, in which every attempt of the key failed (its retries"
    " used up, or none asked for).",
    "late_slots": " that nobody started before their start deadline (LOCK_START_DEADLINE_SECONDS).",
    "paused_slots": " without a start while a dislockctl pause of the key was in force"
    " (not missed).",
    "covered_slots": " without a start of the key because a run of it still held the lease"
    " (a run longer than its interval).",
}
"""Each slot count of ``KeyStatus`` (``dislock_<name>``), and the end of its help."""


_HELP = {
    "dislock_up": "1 if the database answered this scrape, else 0.",
    "dislock_lock_delay_end_timestamp_seconds": "While a lock delay after a database failover"
    " runs, when it ends: no lock of any key is taken before. 0 when none runs.",
    "dislock_grant_loopholes": "How many roles can get around the lock table's grants"
    " (table-wide privileges, MAINTAIN, membership in the owner, BYPASSRLS): dislockctl"
    " grants lists them.",
    "dislock_group_held": "How many slots of the group (LOCK_GROUP=NAME:N) are held; its N is"
    " each member's own setting, in no row. Groups with a slot held or ended in the last"
    f" {_HOURS} h.",
    "dislock_lock_held": "1 while the key's lock of this mode is held, 0 once released or"
    " expired (an N-holder lease: how many of its slots are held).",
    "dislock_paused": "1 while the key is paused fleet-wide.",
    "dislock_running_past_envelope": "1 while the key's latest run is still going and has run"
    f" longer than {FACTOR:g} x the median and the longest of the key's last {WINDOW}"
    f" successful runs before it (keys with at least {MIN_RUNS} of them).",
    **{
        f"dislock_{count}": f"Schedule slots that began in the last {_HOURS} h{text}"
        for count, text in _SLOT_FAMILIES.items()
    },
}
"""The help of each gauge of ``metric_families``."""


def _timestamp(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _gauge(name: str, labels: tuple[str, ...], samples: Sequence[Sample]) -> Family:
    return Family(name, "gauge", _HELP[name], labels, tuple(samples))


def metric_families(snapshot: FleetSnapshot) -> list[Family]:
    """The exposition of a snapshot.  A key without any run has no run metrics
    (a zero timestamp would read as "last succeeded in 1970")."""
    up = snapshot.up
    keys = [(key_label(key.lock_key), key) for key in snapshot.keys]
    *starts_successes_durations, runs = run_families(map(_run_record, snapshot.keys))
    return [
        _gauge("dislock_up", (), [((), 1.0 if up else 0.0)]),
        _gauge(
            "dislock_lock_delay_end_timestamp_seconds",
            (),
            [((), _timestamp(snapshot.lock_delay_end) or 0.0)] if up else [],
        ),
        _gauge(
            "dislock_grant_loopholes",
            (),
            [((), float(snapshot.grant_loopholes))] if up else [],
        ),
        _gauge(
            "dislock_group_held",
            ("group",),
            [((key_label(group.name),), float(group.held)) for group in snapshot.groups],
        ),
        _gauge("dislock_lock_held", ("key", "mode"), _held(keys)),
        _gauge(
            "dislock_paused",
            ("key",),
            [((name,), 1.0 if key.paused_until is not None else 0.0) for name, key in keys],
        ),
        *starts_successes_durations,
        _gauge("dislock_running_past_envelope", ("key",), _past_envelope(keys)),
        runs,
        *(
            _gauge(
                f"dislock_{count}",
                ("key",),
                [
                    ((name,), float(n))
                    for name, key in keys
                    if (n := getattr(key, count)) is not None
                ],
            )
            for count in _SLOT_FAMILIES
        ),
    ]


def _run_record(key: KeyStatus) -> tuple[str, RunRecord]:
    last = key.last_run
    start = None if last is None else last.started_at.timestamp()
    duration = None if last is None else last.duration_seconds
    return key.lock_key, RunRecord(start, duration, _timestamp(key.last_success_at), key.runs_total)


def _held(keys: list[tuple[str, KeyStatus]]) -> list[Sample]:
    held: list[Sample] = []
    for name, key in keys:
        # One sample per mode: an N-holder lease has a row per slot, and counts its held ones.
        modes: dict[str, float] = {}
        for lock in key.locks:
            modes[lock.mode] = modes.get(lock.mode, 0.0) + (1.0 if lock.state == "held" else 0.0)
        held.extend(((name, mode), count) for mode, count in modes.items())
    return held


def _past_envelope(keys: list[tuple[str, KeyStatus]]) -> list[Sample]:
    return [
        ((name,), 1.0 if last.outcome == "running" and last.mark == SLOW else 0.0)
        for name, key in keys
        if (last := key.last_run) is not None and last.envelope is not None
    ]
