"""The kinds of lock dislock knows, in one table: name, row key, class, operator text.

The row keys are shared with dislock 0.1.0 and never change:
``cronjob-lock:schedule:<key>`` and ``cronjob-lock:lease:<key>``.  Slots 2..N of a
lease live in ``cronjob-lock:lease#<n>:<key>``, and a group's in
``cronjob-lock:group[#<n>]:<name>``: the number and the group sit in the mode part,
so no lock key, whatever it contains, can name another key's slot or a group.
"""

from __future__ import annotations

from typing import NamedTuple

KEY_PREFIX = "cronjob-lock"

SLOT_NUMBER = "(?:[2-9]|[1-9][0-9]|[1-9][0-9][0-9]|1000)"
"""The numbers of a lease's further slots, 2 to 1000, in a regular expression."""

SCHEDULE = "schedule"
LEASE = "lease"


class LockKind(NamedTuple):
    """One kind of lock."""

    name: str
    """The strategy name (``LOCK_STRATEGY``, ``acquire_locks(strategies=...)``, ``--mode``)."""
    lock_class: str
    """The name of its lock class in ``dislock`` and ``dislock.aio``."""
    renewed: bool
    """Held while the work runs (renewed, released on exit), or taken once and left."""
    can_wait: bool
    """Whether waiting for it while someone else holds it makes sense."""
    released_text: str
    """What ``dislockctl release`` tells the operator a forced release means."""

    @property
    def mode(self) -> str:
        """The mode part of its row keys: the name."""
        return self.name

    def row_key(self, lock_key: str, slot: int = 1) -> str:
        mode = self.mode if slot == 1 else f"{self.mode}#{slot}"
        return f"{KEY_PREFIX}:{mode}:{lock_key}"


KINDS: tuple[LockKind, ...] = (
    # name, lock_class, renewed, can_wait, released_text
    LockKind(SCHEDULE, "ScheduleLock", False, False, "the slot can be started again"),
    LockKind(LEASE, "LeaseLock", True, True, "its holder notices at its next renewal"),
)
"""In acquisition order: a schedule slot is taken first and so released last."""

GROUP = LockKind("group", "LeaseLock", True, True, "its holder notices at its next renewal")
"""A group's N-slot lease (``dislock.core.groups``): not a strategy, so not in ``KINDS``."""

NAMES: tuple[str, ...] = tuple(kind.name for kind in KINDS)
BY_NAME: dict[str, LockKind] = {kind.name: kind for kind in KINDS}
BY_MODE: dict[str, LockKind] = {**BY_NAME, GROUP.name: GROUP}


def kind(name: str) -> LockKind:
    return BY_NAME[name]


def parse_row_key(key: str) -> tuple[LockKind | None, str, int]:
    """A row key as its kind (None if not dislock's), lock key and slot number."""
    prefix, _, rest = key.partition(":")
    mode, _, lock_key = rest.partition(":")
    base, hash_, number = mode.partition("#")
    found = BY_MODE.get(base) if prefix == KEY_PREFIX else None
    if found is None:
        return None, key, 1
    if not hash_:
        return found, lock_key, 1
    if not number.isdigit() or not found.renewed or int(number) < 2:
        return None, key, 1
    return found, lock_key, int(number)
