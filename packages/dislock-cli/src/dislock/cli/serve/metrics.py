"""The Prometheus metric families of a fleet snapshot (``metric_families``): a key's
run families (``dislock.cli.run_metrics``, shared with the wrapper's textfile) and
the fleet-wide ones, as plain ``Family`` data; ``dislock.cli.prometheus`` hands them
to ``prometheus_client``.
"""

from __future__ import annotations

from datetime import datetime

from dislock.cli.run_metrics import Family, RunRecord, key_label, run_families
from dislock.cli.runs.envelope import FACTOR, MIN_RUNS, SLOW, WINDOW
from dislock.cli.serve.fleet_status import MISSED_WINDOW, FleetSnapshot


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
    records: list[tuple[str, RunRecord]] = []
    missed: list[tuple[tuple[str, ...], float]] = []
    covered: list[tuple[tuple[str, ...], float]] = []
    failed: list[tuple[tuple[str, ...], float]] = []
    late: list[tuple[tuple[str, ...], float]] = []
    paused_slots: list[tuple[tuple[str, ...], float]] = []
    past_envelope: list[tuple[tuple[str, ...], float]] = []
    for key in snapshot.keys:
        name = key_label(key.lock_key)
        # One sample per mode: an N-holder lease has a row per slot, and counts its held ones.
        modes: dict[str, float] = {}
        for lock in key.locks:
            modes[lock.mode] = modes.get(lock.mode, 0.0) + (1.0 if lock.state == "held" else 0.0)
        held.extend(((name, mode), count) for mode, count in modes.items())
        paused.append(((name,), 1.0 if key.paused_until is not None else 0.0))
        last = key.last_run
        if last is not None and last.envelope is not None:
            past = last.outcome == "running" and last.mark == SLOW
            past_envelope.append(((name,), 1.0 if past else 0.0))
        start = None if last is None else last.started_at.timestamp()
        duration = None if last is None else last.duration_seconds
        success = _timestamp(key.last_success_at)
        records.append((key.lock_key, RunRecord(start, duration, success, key.runs_total)))
        if key.missed_slots is not None:
            missed.append(((name,), float(key.missed_slots)))
        if key.covered_slots is not None:
            covered.append(((name,), float(key.covered_slots)))
        if key.failed_slots is not None:
            failed.append(((name,), float(key.failed_slots)))
        if key.late_slots is not None:
            late.append(((name,), float(key.late_slots)))
        if key.paused_slots is not None:
            paused_slots.append(((name,), float(key.paused_slots)))
    *starts_successes_durations, runs = run_families(records)
    window = int(MISSED_WINDOW.total_seconds() // 3600)
    delay = Family(
        "dislock_lock_delay_end_timestamp_seconds",
        "gauge",
        "While a lock delay after a database failover runs, when it ends: no lock of any"
        " key is taken before. 0 when none runs.",
        (),
        (((), _timestamp(snapshot.lock_delay_end) or 0.0),) if snapshot.up else (),
    )
    loopholes = Family(
        "dislock_grant_loopholes",
        "gauge",
        "How many roles can get around the lock table's grants (table-wide privileges,"
        " MAINTAIN, membership in the owner, BYPASSRLS): dislockctl grants lists them.",
        (),
        (((), float(snapshot.grant_loopholes)),) if snapshot.up else (),
    )
    return [
        up,
        delay,
        loopholes,
        _group_held(snapshot),
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
        *starts_successes_durations,
        Family(
            "dislock_running_past_envelope",
            "gauge",
            f"1 while the key's latest run is still going and has run longer than {FACTOR:g} x"
            f" the median and the longest of the key's last {WINDOW} successful runs before it"
            f" (keys with at least {MIN_RUNS} of them).",
            ("key",),
            tuple(past_envelope),
        ),
        runs,
        Family(
            "dislock_missed_slots",
            "gauge",
            f"Schedule slots that began in the last {window} h in which no run of the key"
            " started and none was still going (late ones included; paused ones not).",
            ("key",),
            tuple(missed),
        ),
        Family(
            "dislock_failed_slots",
            "gauge",
            f"Schedule slots that began in the last {window} h and are over, in which every"
            " attempt of the key failed (its retries used up, or none asked for).",
            ("key",),
            tuple(failed),
        ),
        Family(
            "dislock_late_slots",
            "gauge",
            f"Schedule slots that began in the last {window} h that nobody started before"
            " their start deadline (LOCK_START_DEADLINE_SECONDS).",
            ("key",),
            tuple(late),
        ),
        Family(
            "dislock_paused_slots",
            "gauge",
            f"Schedule slots that began in the last {window} h without a start while a"
            " dislockctl pause of the key was in force (not missed).",
            ("key",),
            tuple(paused_slots),
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


def _group_held(snapshot: FleetSnapshot) -> Family:
    """``dislock_group_held``: one sample per group of ``snapshot.groups``."""
    window = int(MISSED_WINDOW.total_seconds() // 3600)
    return Family(
        "dislock_group_held",
        "gauge",
        "How many slots of the group (LOCK_GROUP=NAME:N) are held; its N is each member's"
        f" own setting, in no row. Groups with a slot held or ended in the last {window} h.",
        ("group",),
        tuple(((key_label(group.name),), float(group.held)) for group in snapshot.groups),
    )
