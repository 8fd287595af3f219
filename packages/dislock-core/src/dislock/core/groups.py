"""Groups (``LOCK_GROUP=NAME:N``, ``LockContext.group``): at most N runs at once,
fleet-wide, among every lock key that names the group, whatever its strategy.

A group is the N-slot lease (``LockContext.slots``) of a lock of its own, held
while the run runs: taken after the run's own locks (schedule slot, lease),
renewed in the same batch as the run's lease, released with it.  Its rows have
a mode of their own (``dislock.core.kinds.GROUP``), so no lock key of this release
or of dislock 0.1.0 can name them, and no key that works today is refused.

A run the group refuses hands back what it took (``handing_back``): its schedule
slot stays open for a later tick, and it is refused like any held lock.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, NamedTuple

from dislock.core import bounds
from dislock.core.errors import ConfigurationError
from dislock.core.variables import SLOTS, TTL

if TYPE_CHECKING:
    from dislock.core.context import LockContext

MAX_NAME_BYTES = 200
"""The longest group name, in UTF-8 bytes: it is shown in every refusal and in ``ls``."""


class Group(NamedTuple):
    """A group as ``NAME:N`` names it."""

    name: str
    slots: int

    def __str__(self) -> str:
        return f"{self.name}:{self.slots}"


def parse_group(text: object, *, name: str = "group") -> Group:
    """``NAME:N``, checked: a name of printable text (at most ``MAX_NAME_BYTES``) and
    a number of slots within ``LOCK_SLOTS``' range.  The last colon splits them."""
    if not isinstance(text, str) or ":" not in text:
        raise ConfigurationError(f"{name} must be NAME:N (e.g. heavy:2), got {text!r}")
    group, _, count = text.strip().rpartition(":")
    bounds.check_key(f"{name}'s NAME", group)
    bounds.check_size(f"{name}'s NAME", group, MAX_NAME_BYTES)
    slots = int(SLOTS.check(count, f"{name}'s N"))
    return Group(group, slots)


def group_context(context: LockContext) -> LockContext:
    """The context of ``context``'s group slot: an N-slot lease of the group's rows,
    by the same owner, renewed as the run's lease is (its TTL, or the default), with
    the run's wait.  Nothing of the run's own (schedule, history, fencing, retries,
    bound) applies to it."""
    assert context.group is not None
    group = parse_group(context.group)
    ttl = context.run_ttl_seconds
    return dataclasses.replace(
        context,
        lock_key=group.name,
        slots=group.slots,
        lease_mode="group",
        group=None,
        run_ttl_seconds=TTL.value if ttl is None else ttl,
        lease_interval_seconds=None if ttl is None else context.lease_interval_seconds,
        next_run_time=None,
        schedule=None,
        cron_tz=None,
        jitter_max_seconds=0.0,
        max_runtime_seconds=None,
        retries=0,
        start_deadline_seconds=None,
        fencing=False,
        history=False,
        output_tail_bytes=0,
        replace=False,
    )
