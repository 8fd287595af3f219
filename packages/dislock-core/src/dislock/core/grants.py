"""Who may lock which keys: PostgreSQL roles, grants and row-level security over the lock table.

A fleet gives each team (or class of machine) a login role of its own and says
which lock keys it may take; ``dislockctl grant`` turns that into plain
PostgreSQL, so the server enforces it whatever a machine sends by hand:

* **Row-level security** on the lock table (and its run history), with one set
  of policies per role, the role's key patterns written into them as literals
  (no lookup table: a policy costs a ``LIKE`` match against a short list on the
  rows a statement already touches).  A role sees and writes the rows of its own
  keys only.  The failover bookkeeping rows can be written only as the acquiring
  statement writes them: the timeline row only with the server's real timeline
  and only when the recorded one is stale, a TTL record only the role's own
  (``dislock.core.policy_functions``).
* **Bounds** on what every such role writes: no lease row and no lock delay may
  end more than the table's maximum TTL from now (``dislock.core.limits``); no text
  it writes, in the lock table or the history, is longer than
  ``dislock.core.bounds.MAX_STORED_BYTES``, and a run's outcome is one of
  ``dislock.core.history.OUTCOMES`` (plain comparisons, no function of dislock's).  The
  maximum lives in a function beside the table that the planner folds into a
  constant (a policy that read the table it guards would recurse), so
  ``dislockctl init --max-ttl`` replaces that function and no policy.
* **Column privileges**: a wrapper role may update ``value``, ``expire_at`` and
  ``fence`` but holds no table-wide ``UPDATE``, ``DELETE`` or ``TRUNCATE``, so
  ``LOCK TABLE … IN EXCLUSIVE MODE`` (which needs one of them) is refused, and
  it cannot delete or alter anything.

The table's owner and superusers bypass row-level security: they are the
administrators.  Until the first grant a table has no row-level security, so
fleets without roles (and dislock 0.1.0, which knows none of this) work as before.
The policies' names say what they are for (``dislock:<role>:<what>``); the
patterns are kept in a comment on the role's read policy, for ``dislockctl grants``.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from psycopg import sql

from dislock.core.bounds import MAX_STORED_BYTES
from dislock.core.errors import ConfigurationError
from dislock.core.failover import NEVER_NOTICED, SCOPE_KEY_PREFIX, TIMELINE, TIMELINE_KEY
from dislock.core.history import ENDED, OUTCOMES, STARTED, TAILS, add_tail_columns
from dislock.core.history_functions import history_budget, set_history_budget
from dislock.core.key_quota import DEFAULT_MAX_KEYS, QUOTA_KEY_PREFIX, quota_trigger, set_quota
from dislock.core.kinds import KEY_PREFIX, SLOT_NUMBER
from dislock.core.limits import metadata_row
from dislock.core.policy_functions import (
    MAX_NAME,
    max_ttl_function,
    noting_function,
    policy_functions,
)
from dislock.core.protocol import protocol_sql
from dislock.core.rows import lease_key, pause_key, schedule_key
from dislock.core.variables import OUTPUT_TAIL


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


_WHAT = ("read", "take", "write", "delete")
"""The policies a role may have on a table, by the last part of their names."""


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
    if not role or longest > MAX_NAME:
        raise ConfigurationError(
            f"role name {role!r} is too long for its policy names"
            f" (at most {MAX_NAME - longest + len(role.encode())} bytes)"
        )
    return role


def policy_name(role: str, what: str) -> str:
    return f"{POLICY_PREFIX}{role}:{what}"


def _alternatives(patterns: Sequence[str]) -> str:
    """A regular expression (PostgreSQL's ARE) for the lock keys ``patterns`` match,
    to follow a row key's mode part."""
    parts = []
    for pattern in patterns:
        if pattern.endswith("*"):
            parts.append(_quote(pattern[:-1]))
        else:
            parts.append(_quote(pattern) + "$")
    return "(?:" + "|".join(parts) + ")"


def _quote(text: str) -> str:
    # Every ASCII character that is not a letter or digit is escaped: in an ARE a
    # backslash before one always means the character itself.  Other characters
    # stay as they are: none is special, and a backslash before a non-ASCII letter
    # would be an invalid escape.
    return re.sub(r"([\x20-\x2f\x3a-\x40\x5b-\x60\x7b-\x7e])", r"\\\1", text)


def _likes(row_prefix: str, patterns: Sequence[str]) -> list[str]:
    """``LIKE`` patterns for the rows ``row_prefix + <key>`` of the keys ``patterns``
    match (``\\`` is ``LIKE``'s escape character)."""
    return [
        re.sub(r"([\\%_])", r"\\\1", row_prefix + p.removesuffix("*"))
        + ("%" if p.endswith("*") else "")
        for p in patterns
    ]


def _like_any(likes: Sequence[str], column: str = "key") -> sql.Composed:
    # One call however many patterns: a policy's cost is mostly its calls (see
    # dislock.core.policy_functions).
    return sql.SQL("{} LIKE ANY ({}::text[])").format(
        sql.Identifier(column), sql.Literal(list(likes))
    )


def _fits(*columns: str, nullable: bool = False) -> sql.Composed:
    """``columns`` hold at most ``MAX_STORED_BYTES`` each (a NULL too, if ``nullable``):
    one comparison each, of a length the server knows without reading the text."""
    limit = sql.Literal(MAX_STORED_BYTES)
    form = "(octet_length({}) <= {}) IS NOT FALSE" if nullable else "octet_length({}) <= {}"
    return sql.SQL(" AND ").join(
        sql.SQL(form).format(sql.Identifier(column), limit) for column in columns
    )


def _slots(patterns: Sequence[str]) -> str:
    """The keys of a lease's further slots (``cronjob-lock:lease#<n>:<key>``), which
    ``LIKE`` cannot tell from other keys: only a regular expression is exact."""
    # Slots 2 to the most a lease may have (``bounds.SLOTS``), written as dislock
    # writes them: a quota counts keys, so a key's slots must not be without end.
    return rf"^{KEY_PREFIX}:lease#{SLOT_NUMBER}:" + _alternatives(patterns)


def _rarely(
    table_parts: tuple[str, ...], slot_keys: sql.Literal, *, existing: bool
) -> sql.Composed:
    """What a role writes but rarely (``policy_functions``' ``_noting``): the failover
    bookkeeping of an acquiring statement and its keys' further lease slots
    (``slot_keys``, their regular expression, ``_slots``).

    The timeline row's INSERT condition has to admit a delay: PostgreSQL checks
    an ``INSERT … ON CONFLICT DO UPDATE``'s proposed row against the INSERT
    policy even when it ends up updating.  That is safe only because the row
    always exists once a table has grants (``grant_statements`` records it), so
    an insert of it can only ever become that guarded update."""
    return sql.SQL("{}(key, value, expire_at, {}, {})").format(
        noting_function(table_parts), sql.Literal(existing), slot_keys
    )


def _policy(
    name: str,
    table: sql.Identifier,
    role: str,
    command: str,
    *,
    using: Any = None,
    check: Any = None,
) -> sql.Composed:
    parts = [
        sql.SQL("CREATE POLICY {name} ON {table} FOR {command} TO {role}").format(
            name=sql.Identifier(name),
            table=table,
            command=sql.SQL(command),
            role=sql.Identifier(role),
        )
    ]
    if using is not None:
        parts.append(sql.SQL("USING ({})").format(using))
    if check is not None:
        parts.append(sql.SQL("WITH CHECK ({})").format(check))
    return sql.SQL(" ").join(parts)


def _drop(table: sql.Identifier, role: str) -> list[sql.Composed]:
    return [
        sql.SQL("DROP POLICY IF EXISTS {name} ON {table}").format(
            name=sql.Identifier(policy_name(role, what)), table=table
        )
        for what in _WHAT
    ]


def grant_statements(
    table_parts: tuple[str, ...],
    role: str,
    access: Access,
    patterns: Sequence[str],
    *,
    max_ttl: float,
    fencing: bool,
    history: tuple[str, ...] | None,
    max_keys: int | None = None,
    plain_writes: bool = False,
    max_history_mib: int | None = None,
) -> list[sql.Composed]:
    """Everything ``dislockctl grant`` runs, in one transaction: row-level security
    on, the role's earlier grant replaced, its privileges and policies on the lock
    table (and on the run history, when ``history`` names an existing table)."""
    role = check_role(role)
    patterns = check_patterns(patterns, access)
    budget = 0 if access == READER else history_budget(max_history_mib)
    if len(table_parts) != 2:
        raise ValueError("grant_statements needs the table's schema (see qualified_query)")
    table = sql.Identifier(*table_parts)
    who = sql.Identifier(role)
    statements: list[sql.Composed] = []
    for parts in (table_parts, history):
        if parts is not None and len(parts) == 2:
            statements.append(
                sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(parts[0]), who)
            )
    statements += [
        sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(table),
        # The timeline as the first lock would record it (no delay), so that no
        # granted role ever inserts that row, only updates a stale one.
        sql.SQL(
            "INSERT INTO {table} (key, value, expire_at) SELECT {key}, {timeline}::text, {never}"
            " ON CONFLICT (key) DO NOTHING"
        ).format(
            table=table, key=sql.Literal(TIMELINE_KEY), timeline=TIMELINE, never=NEVER_NOTICED
        ),
        sql.SQL("REVOKE ALL ON {} FROM {}").format(table, who),
        *_drop(table, role),
        *policy_functions(table_parts, max_ttl),
        # What a role without the right to write the table locks through.
        protocol_sql((table_parts[0], table_parts[1])),
    ]
    columns = ["value", "expire_at", *(["fence"] if fencing else [])]
    if access == READER:
        statements += [
            set_quota(table_parts, role, 0),
            sql.SQL("GRANT SELECT ON {} TO {}").format(table, who),
            _policy(policy_name(role, "read"), table, role, "SELECT", using=sql.SQL("true")),
        ]
    else:
        schedules = _likes(schedule_key(""), patterns)
        leases = _likes(lease_key(""), patterns)
        pauses = _likes(pause_key(""), patterns)
        # An operator writes its keys' pause rows too; a wrapper only reads them.
        unbounded = schedules + (pauses if access == OPERATOR else [])
        writable = _like_any(unbounded + leases)
        slot_keys = sql.Literal(_slots(patterns))
        slots = sql.SQL("key ~ {}").format(slot_keys)
        # A row written: a lease row ends within the table's maximum TTL.
        bounded = sql.SQL("({} OR ({} AND expire_at <= NOW() + {}()) OR {})").format(
            _like_any(unbounded),
            _like_any(leases),
            max_ttl_function(table_parts),
            _rarely(table_parts, slot_keys, existing=False),
        )
        # Every row written: its value within the bound, and its key when inserted (an
        # update cannot change the key: no privilege on the column); checked first,
        # as the cheapest condition.
        fits = _fits("value")
        reads = sql.SQL("({} OR {})").format(
            _like_any(["dislock:%", *schedules, *leases, *pauses]), slots
        )
        statements += [
            # The keys this role's record of its longest TTL holds up after a
            # failover (dislock.core.failover): its own, not every team's.
            metadata_row(table_parts, SCOPE_KEY_PREFIX + role, "^" + _alternatives(patterns)),
            set_quota(table_parts, role, quota_of(access, max_keys)),
            set_history_budget(table_parts, role, budget),
            *quota_trigger(table_parts),
            _policy(
                policy_name(role, "read"),
                table,
                role,
                "SELECT",
                using=reads,
            ),
        ]
        if access == WRAPPER and not plain_writes:
            # It writes through the lock functions alone (dislock.core.protocol), which
            # check its scope: no right to write the table itself.
            statements.append(sql.SQL("GRANT SELECT ON {} TO {}").format(table, who))
        else:
            statements += [
                sql.SQL("GRANT SELECT, INSERT ON {} TO {}").format(table, who),
                sql.SQL("GRANT UPDATE ({}) ON {} TO {}").format(_columns(columns), table, who),
                *_write_policies(table_parts, role, fits, bounded, writable, slot_keys),
            ]
        if access == OPERATOR:
            statements += [
                sql.SQL("GRANT DELETE ON {} TO {}").format(table, who),
                _policy(
                    policy_name(role, "delete"),
                    table,
                    role,
                    "DELETE",
                    using=sql.SQL("({} OR {})").format(writable, slots),
                ),
            ]
    statements.append(
        sql.SQL("COMMENT ON POLICY {name} ON {table} IS {text}").format(
            name=sql.Identifier(policy_name(role, "read")),
            table=table,
            text=sql.Literal(
                json.dumps(
                    {
                        "access": access,
                        "keys": list(patterns),
                        "max_keys": quota_of(access, max_keys) or None,
                        **({"plain_writes": True} if plain_writes else {}),
                        "max_history_mib": budget,
                        "protocol": 1,
                    }
                )
            ),
        )
    )
    if history is not None:
        from dislock.core.history_functions import history_functions_sql

        statements.append(
            history_functions_sql((history[0], history[1]), (table_parts[0], table_parts[1]))
        )
        writes = access == OPERATOR or plain_writes
        statements += _history_grant(history, role, access, patterns, writes=writes)
    return statements


def _write_policies(
    table_parts: tuple[str, ...],
    role: str,
    fits: sql.Composable,
    bounded: sql.Composable,
    writable: sql.Composable,
    slot_keys: sql.Literal,
) -> list[sql.Composed]:
    """An operator's policies for the rows it writes by hand (pauses, releases)."""
    table = sql.Identifier(*table_parts)
    return [
        _policy(
            policy_name(role, "take"),
            table,
            role,
            "INSERT",
            check=sql.SQL("{} AND {} AND {}").format(_fits("key"), fits, bounded),
        ),
        _policy(
            policy_name(role, "write"),
            table,
            role,
            "UPDATE",
            using=sql.SQL("({} OR {})").format(
                writable, _rarely(table_parts, slot_keys, existing=True)
            ),
            check=sql.SQL("{} AND {}").format(fits, bounded),
        ),
    ]


def _history_grant(
    history: tuple[str, ...],
    role: str,
    access: Access,
    patterns: Sequence[str],
    *,
    writes: bool,
) -> list[sql.Composed]:
    table = sql.Identifier(*history)
    who = sql.Identifier(role)
    statements = [
        # A table made before the output's tail has no column for it yet.
        add_tail_columns(history),
        sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(table),
        sql.SQL("REVOKE ALL ON {} FROM {}").format(table, who),
        *_drop(table, role),
    ]
    if access == READER:
        statements.append(sql.SQL("GRANT SELECT ON {} TO {}").format(table, who))
        statements.append(
            _policy(policy_name(role, "read"), table, role, "SELECT", using=sql.SQL("true"))
        )
        return statements
    mine = _like_any(_likes("", patterns), "lock_key")
    if not writes:
        # It records its runs through the history functions alone
        # (dislock.core.history_functions): no right to write the table itself.
        return [
            *statements,
            sql.SQL("GRANT SELECT ON {} TO {}").format(table, who),
            _policy(policy_name(role, "read"), table, role, "SELECT", using=mine),
        ]
    # A run's start writes its texts (the end, under its column privileges, none of
    # them: a run recorded before the bounds still ends), its end an outcome of
    # dislock's, which becomes a label value of dislock_runs_total.
    # Its start is the server's clock, as dislock writes it (a run "from the future"
    # would be listed first, as abandoned, and outlive every prune).
    started = sql.SQL("{} AND {} AND {} AND started_at = NOW()").format(
        mine,
        _fits("lock_key", "modes", "owner", "host"),
        _fits("cron", "cron_tz", nullable=True),
    )
    # An output's tail: the wrapper keeps at most OUTPUT_TAIL's characters of each.
    tails = sql.SQL(" AND ").join(
        sql.SQL("(octet_length({}) <= {}) IS NOT FALSE").format(
            sql.Identifier(column), sql.Literal(4 * int(OUTPUT_TAIL.high))
        )
        for column in TAILS
    )
    ended = sql.SQL("{} AND (outcome IN ({})) IS NOT FALSE AND {}").format(
        mine, sql.SQL(", ").join(map(sql.Literal, OUTCOMES)), tails
    )
    statements += [
        # A run's start inserts its row (the table numbers it: a role choosing ids
        # could take the next ones and so keep other teams' runs from being
        # recorded), and its end fills in how it ended, once.
        sql.SQL("GRANT SELECT ON {} TO {}").format(table, who),
        sql.SQL("GRANT INSERT ({}) ON {} TO {}").format(_columns(STARTED), table, who),
        sql.SQL("GRANT UPDATE ({}) ON {} TO {}").format(_columns((*ENDED, *TAILS)), table, who),
        _policy(policy_name(role, "read"), table, role, "SELECT", using=mine),
        _policy(policy_name(role, "take"), table, role, "INSERT", check=started),
        _policy(
            policy_name(role, "write"),
            table,
            role,
            "UPDATE",
            using=sql.SQL("({}) AND ended_at IS NULL").format(mine),
            check=ended,
        ),
    ]
    if access == OPERATOR:  # pruning
        statements += [
            sql.SQL("GRANT DELETE ON {} TO {}").format(table, who),
            _policy(policy_name(role, "delete"), table, role, "DELETE", using=mine),
        ]
    return statements


def _columns(names: Sequence[str]) -> sql.Composed:
    return sql.SQL(", ").join(map(sql.Identifier, names))


def revoke_statements(
    table_parts: tuple[str, ...], role: str, *, history: tuple[str, ...] | None
) -> list[sql.Composed]:
    """What ``dislockctl revoke`` runs: the role's policies and privileges on the lock
    table (and history) go; row-level security stays on, so the role sees nothing."""
    statements: list[sql.Composed] = []
    for parts in (table_parts, history):
        if parts is None:
            continue
        table = sql.Identifier(*parts)
        statements += [
            sql.SQL("REVOKE ALL ON {} FROM {}").format(table, sql.Identifier(role)),
            *_drop(table, role),
        ]
    # Its scope is what the lock functions let it lock (dislock.core.protocol); its
    # longest-TTL record stays, counting for every key, as a lock delay must.
    statements.append(
        sql.SQL("DELETE FROM {} WHERE key IN ({}, {})").format(
            sql.Identifier(*table_parts),
            sql.Literal(SCOPE_KEY_PREFIX + role),
            sql.Literal(QUOTA_KEY_PREFIX + role),
        )
    )
    return statements
