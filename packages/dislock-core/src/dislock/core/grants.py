"""What a grant is: a role's access to a lock table's keys (``dislockctl grant``), and
the checks of its role name and key patterns.

The SQL that gives it is ``dislock.core.grant_policies``; the catalogue read back,
``dislock.core.grant_catalog``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NamedTuple

from dislock.core.config import MAX_IDENTIFIER_BYTES
from dislock.core.errors import ConfigurationError
from dislock.core.key_quota import DEFAULT_MAX_KEYS


class Access(enum.StrEnum):
    """What a grant lets its role do (its value is the word the policies' comment
    and ``grants --json`` hold)."""

    WRAPPER = "wrapper"
    """Takes, renews, releases and hands back its keys' locks, reads their pauses,
    records their runs."""

    OPERATOR = "operator"
    """A wrapper that may also pause, resume, force-release and prune its keys."""

    READER = "reader"
    """Reads every row (``ls``, ``history``, ``missed``, ``serve``); writes nothing."""


WRAPPER, OPERATOR, READER = Access.WRAPPER, Access.OPERATOR, Access.READER

ACCESS = tuple(Access)


POLICY_PREFIX = "dislock:"


class Grant(NamedTuple):
    """One role's access to a lock table, as ``dislockctl grants`` lists it."""

    role: str
    access: Access
    keys: tuple[str, ...]
    """Key patterns (``billing-*``, ``reports-nightly``); empty for a reader (every key)."""
    max_keys: int | None = None
    """The most keys the role may hold (``dislock.core.key_quota``); None: no limit (a
    reader, ``--max-keys 0``, or a grant written before quotas)."""
    max_history_mib: int | None = None
    """The most its runs' history may hold (``dislock.core.history_functions``); None:
    no limit."""
    plain_writes: bool = False
    """Whether it may write the lock table by hand too (``grant --plain-writes``)."""
    current: bool = True
    """Whether it was written for the lock functions (``init`` writes an older one again)."""


def quota_of(access: Access, max_keys: int | None) -> int:
    """The most keys a grant lets its role hold (``dislock.core.key_quota``), 0 for no
    limit: ``max_keys`` if given; else a wrapper's default, since a machine looping
    over fresh keys is what it guards against, and no limit for an operator (a
    person's role, which pauses keys across the fleet) or a reader (writes nothing)."""
    if access == READER:
        return 0
    if max_keys is not None:
        return max_keys
    return DEFAULT_MAX_KEYS if access == WRAPPER else 0


def check_patterns(patterns: Sequence[str], access: Access) -> tuple[str, ...]:
    """The key patterns of a grant, validated: an exact key, or a prefix ending in
    ``*`` (``*`` alone: every key).  A reader reads every key and takes none."""
    if access not in ACCESS:
        raise ConfigurationError(f"unknown access {access!r} (one of {', '.join(ACCESS)})")
    if access == READER:
        if patterns:
            raise ConfigurationError("--reader reads every key: drop --keys")
        return ()
    if not patterns:
        raise ConfigurationError(
            "say which keys the role may lock: --keys PATTERN (e.g. 'billing-*')"
        )
    for pattern in patterns:
        if not pattern or "*" in pattern[:-1]:
            raise ConfigurationError(
                f"--keys {pattern!r}: a pattern is an exact key or a prefix ending in '*'"
            )
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in pattern):
            raise ConfigurationError(f"--keys {pattern!r}: control characters are not keys")
    return tuple(dict.fromkeys(patterns))


def check_role(role: str) -> str:
    """A role name that every policy name made from it fits in an identifier."""
    longest = len(policy_name(role, "delete").encode())
    if not role or longest > MAX_IDENTIFIER_BYTES:
        raise ConfigurationError(
            f"role name {role!r} is too long for its policy names"
            f" (at most {MAX_IDENTIFIER_BYTES - longest + len(role.encode())} bytes)"
        )
    return role


def policy_name(role: str, what: str) -> str:
    return f"{POLICY_PREFIX}{role}:{what}"
