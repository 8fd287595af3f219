"""Environment variables named like dislock's that are none of its settings, judged by
name alone: a likely typo of a setting (``LOCK_RETRYS`` would run without retries) is a
configuration error, any other such name a warning.  The wrapper and ``dislockctl check``
say what this finds (docs/cli.md, "Misspelled settings").
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from dislock.core.errors import ConfigurationError
from dislock.core.variables import VARIABLES

PREFIXES = ("DISLOCK_", "CRONJOB_", "RUN_LOCK_", "LOCK_", "CRON_")
"""The beginnings of dislock's variable names: a name with one of them is looked at."""

NOT_SETTINGS = frozenset(
    {
        # What dislock sets for the command it runs (dislock.core.supervision), for its
        # guard (dislock.core.guard), and what other jobs' code reads: in a nested run's
        # environment they are dislock's own, and no setting.
        "DISLOCK_LOCK_KEY",
        "DISLOCK_RUN_TOKEN",
        "DISLOCK_ATTEMPT",
        "DISLOCK_FENCING_TOKEN",
        "DISLOCK_GUARD_FOR",
        "DISLOCK_SLOT_START",
        "DISLOCK_SLOT_END",
        "DISLOCK_LAST_SUCCESS",
    }
)
"""Names with dislock's prefixes that it uses but does not read as settings (a new one
is one more entry; names without the prefixes, such as ``TRACEPARENT``, need none)."""

_UNITS = ("_SECONDS", "_BYTES")


class Unknown(NamedTuple):
    """A variable named like dislock's that is no setting."""

    name: str
    resembles: str | None
    """The setting it is likely a typo of; None: no setting is close."""

    def describe(self) -> str:
        """One line, naming the variable (never its value)."""
        if self.resembles is None:
            return f"{self.name} is not a dislock setting: ignored"
        return f"{self.name} is not a dislock setting: did you mean {self.resembles}?"


def unknown_variables(names: Iterable[str], url_variable: str = "") -> tuple[Unknown, ...]:
    """The names among ``names`` (an environment's) with one of dislock's prefixes that
    are no setting, sorted, the likely typos first.  ``url_variable``, what dislock uses
    but does not read as settings, and other ``…_URL`` names (the URL variables of other
    commands, such as ``DISLOCK_ADMIN_URL``) are left out unless close to a setting."""
    known = {setting.name for setting in VARIABLES}
    found = []
    for name in names:
        if name in known or name in NOT_SETTINGS or name == url_variable:
            continue
        if not name.upper().startswith(PREFIXES):
            continue
        resembles = _resembled(name)
        if resembles is not None or not name.upper().endswith("_URL"):
            found.append(Unknown(name, resembles))
    return tuple(sorted(found, key=lambda unknown: (unknown.resembles is None, unknown.name)))


def typo_error(unknown: Iterable[Unknown]) -> ConfigurationError | None:
    """The error of the likely typos among ``unknown``, in one line; None if none is."""
    typos = [found.describe() for found in unknown if found.resembles is not None]
    return ConfigurationError("; ".join(typos)) if typos else None


def _core(name: str) -> str:
    """A name without dislock's prefixes and a unit: ``RUN_LOCK_TTL_SECONDS`` -> ``TTL``."""
    core = name.upper()
    while core.startswith(PREFIXES):
        core = core[len(next(p for p in PREFIXES if core.startswith(p))) :]
    for unit in _UNITS:
        core = core.removesuffix(unit)
    return core


def _resembled(name: str) -> str | None:
    """The setting ``name`` is likely a typo of (docs/cli.md says when that is), the
    closest first."""
    upper, core = name.upper(), _core(name)
    best: tuple[int, str] | None = None
    for setting in VARIABLES:
        allowed = min(3, len(_core(setting.name)) // 3)
        distance = min(distance_of(upper, setting.name), distance_of(core, _core(setting.name)))
        if distance <= allowed and (best is None or distance < best[0]):
            best = (distance, setting.name)
    return None if best is None else best[1]


def distance_of(a: str, b: str) -> int:
    """How many letters to insert, delete or change, or neighbours to swap, to turn
    ``a`` into ``b`` (the optimal string alignment distance)."""
    before: list[int] = []
    row = list(range(len(b) + 1))
    for i, letter in enumerate(a, 1):
        earlier, before, row = before, row, [i] + [0] * len(b)
        for j, other in enumerate(b, 1):
            row[j] = min(before[j] + 1, row[j - 1] + 1, before[j - 1] + (letter != other))
            if i > 1 and j > 1 and letter == b[j - 2] and a[i - 2] == other:
                row[j] = min(row[j], earlier[j - 2] + 1)
    return row[-1]
