"""The SQL of a grant: privileges and row-level security over the lock table and its
run history, so that the server enforces a role's keys whatever a machine sends by
hand (docs/security.md says what each bounds, and why).  One set of policies per
role, its key patterns written in as literals (no lookup table: a policy costs a
``LIKE`` match on rows a statement touches anyway), which are also kept in a comment
on the role's read policy.  Until the first grant a table has none, so fleets
without roles (and dislock 0.1.0) work as before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from psycopg import sql

from dislock.core.bounds import MAX_STORED_BYTES
from dislock.core.failover import NEVER_NOTICED, SCOPE_KEY_PREFIX, TIMELINE, TIMELINE_KEY
from dislock.core.grants import (
    OPERATOR,
    READER,
    WRAPPER,
    Access,
    check_patterns,
    check_role,
    policy_name,
    quota_of,
)
from dislock.core.history import ENDED, OUTCOMES, STARTED, TAILS, add_tail_columns
from dislock.core.history_functions import history_budget, history_functions_sql, set_history_budget
from dislock.core.key_quota import QUOTA_KEY_PREFIX, quota_trigger, set_quota
from dislock.core.kinds import KEY_PREFIX, SLOT_NUMBER
from dislock.core.limits import metadata_row
from dislock.core.policy_functions import max_ttl_function, noting_function, policy_functions
from dislock.core.protocol import protocol_sql
from dislock.core.rows import lease_key, pause_key, schedule_key
from dislock.core.variables import OUTPUT_TAIL


def _alternatives(patterns: Sequence[str]) -> str:
    """A regular expression (PostgreSQL's ARE) for the lock keys ``patterns`` match,
    to follow a row key's mode part."""
    parts = (_quote(p[:-1]) if p.endswith("*") else _quote(p) + "$" for p in patterns)
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


def _fits(*columns: str, nullable: bool = False, limit: int = MAX_STORED_BYTES) -> sql.Composed:
    """``columns`` hold at most ``limit`` bytes each (a NULL too, if ``nullable``): one
    comparison each, of a length the server knows without reading the text."""
    form = "(octet_length({}) <= {}) IS NOT FALSE" if nullable else "octet_length({}) <= {}"
    return sql.SQL(" AND ").join(
        sql.SQL(form).format(sql.Identifier(column), sql.Literal(limit)) for column in columns
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
    """What a role writes but rarely (``<table>_dislock_noting``): the failover
    bookkeeping of an acquiring statement and its keys' further lease slots.

    The timeline row's INSERT condition has to admit a delay (PostgreSQL checks an
    upsert's proposed row against the INSERT policy even when it updates): safe
    because ``grant_statements`` records the row, so an insert of it can only
    become that guarded update."""
    return sql.SQL("{}(key, value, expire_at, {}, {})").format(
        noting_function(table_parts), sql.Literal(existing), slot_keys
    )


_COMMANDS = {"read": "SELECT", "take": "INSERT", "write": "UPDATE", "delete": "DELETE"}
"""The policies a role may have on a table: the last part of their names, and the
command each is for."""


def _policy(
    table: sql.Identifier, role: str, what: str, *, using: Any = None, check: Any = None
) -> sql.Composed:
    text = "CREATE POLICY {name} ON {table} FOR " + _COMMANDS[what] + " TO {role}"
    text += "" if using is None else " USING ({using})"
    text += "" if check is None else " WITH CHECK ({check})"
    return sql.SQL(text).format(
        name=sql.Identifier(policy_name(role, what)),
        table=table,
        role=sql.Identifier(role),
        using=using,
        check=check,
    )


def _grant(privileges: str | sql.Composable, table: sql.Identifier, role: str) -> sql.Composed:
    what = sql.SQL(privileges) if isinstance(privileges, str) else privileges
    return sql.SQL("GRANT {} ON {} TO {}").format(what, table, sql.Identifier(role))


def _column_grant(
    command: str, columns: Sequence[str], table: sql.Identifier, role: str
) -> sql.Composed:
    names = sql.SQL(", ").join(map(sql.Identifier, columns))
    return _grant(sql.SQL(command + " ({})").format(names), table, role)


def _replace(table: sql.Identifier, role: str) -> list[sql.Composed]:
    """The role's earlier privileges and policies on ``table`` gone."""
    return [
        sql.SQL("REVOKE ALL ON {} FROM {}").format(table, sql.Identifier(role)),
        *(
            sql.SQL("DROP POLICY IF EXISTS {name} ON {table}").format(
                name=sql.Identifier(policy_name(role, what)), table=table
            )
            for what in _COMMANDS
        ),
    ]


def _reader(table: sql.Identifier, role: str) -> list[sql.Composed]:
    return [_grant("SELECT", table, role), _policy(table, role, "read", using=sql.SQL("true"))]


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
    trail: tuple[str, ...] | None = None,
) -> list[sql.Composed]:
    """Everything ``dislockctl grant`` runs, in one transaction: row-level security
    on, the role's earlier grant replaced, its privileges and policies on the lock
    table (and on the run history, when ``history`` names an existing table; on the
    audit trail ``trail``, which only a reader reads)."""
    role = check_role(role)
    patterns = check_patterns(patterns, access)
    budget = 0 if access == READER else history_budget(max_history_mib)
    quota = quota_of(access, max_keys)
    if len(table_parts) != 2:
        raise ValueError("grant_statements needs the table's schema (see qualified_query)")
    table = sql.Identifier(*table_parts)
    statements = [
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(parts[0]), sql.Identifier(role)
        )
        for parts in (table_parts, history)
        if parts is not None and len(parts) == 2
    ]
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
        *_replace(table, role),
        *policy_functions(table_parts, max_ttl),
        # What a role without the right to write the table locks through.
        protocol_sql((table_parts[0], table_parts[1])),
    ]
    if access == READER:
        statements += [set_quota(table_parts, role, 0), *_reader(table, role)]
    else:
        statements += [
            # The keys this role's record of its longest TTL holds up after a
            # failover (dislock.core.failover): its own, not every team's.
            metadata_row(table_parts, SCOPE_KEY_PREFIX + role, "^" + _alternatives(patterns)),
            set_quota(table_parts, role, quota),
            set_history_budget(table_parts, role, budget),
            *quota_trigger(table_parts),
            *_key_policies(table_parts, role, access, patterns, fencing, plain_writes),
        ]
    described = {
        "access": access,
        "keys": list(patterns),
        "max_keys": quota or None,
        **({"plain_writes": True} if plain_writes else {}),
        "max_history_mib": budget,
        "protocol": 1,
    }
    statements.append(
        sql.SQL("COMMENT ON POLICY {name} ON {table} IS {text}").format(
            name=sql.Identifier(policy_name(role, "read")),
            table=table,
            text=sql.Literal(json.dumps(described)),
        )
    )
    if trail is not None:
        statements += trail_statements(trail, role, access)
    if history is not None:
        statements += _history_grant(table_parts, history, role, access, patterns, plain_writes)
    return statements


def trail_statements(trail: tuple[str, ...], role: str, access: Access) -> list[sql.Composed]:
    """A role's privileges on the audit trail (``dislock.core.audit_trail``): a reader
    reads it; no granted role writes it."""
    table = sql.Identifier(*trail)
    return [*_replace(table, role), *(_reader(table, role) if access == READER else [])]


def _key_policies(
    table_parts: tuple[str, ...],
    role: str,
    access: Access,
    patterns: Sequence[str],
    fencing: bool,
    plain_writes: bool,
) -> list[sql.Composed]:
    """A wrapper's or an operator's privileges and policies on the lock table."""
    table = sql.Identifier(*table_parts)
    schedules = _likes(schedule_key(""), patterns)
    leases = _likes(lease_key(""), patterns)
    pauses = _likes(pause_key(""), patterns)
    slot_keys = sql.Literal(_slots(patterns))
    slots = sql.SQL("key ~ {}").format(slot_keys)
    reads = sql.SQL("({} OR {})").format(
        _like_any(["dislock:%", *schedules, *leases, *pauses]), slots
    )
    statements = [_policy(table, role, "read", using=reads)]
    # An operator writes its keys' pause rows too; a wrapper only reads them.
    unbounded = schedules + (pauses if access == OPERATOR else [])
    writable = _like_any(unbounded + leases)
    if access == WRAPPER and not plain_writes:
        # It writes through the lock functions alone (dislock.core.protocol), which
        # check its scope: no right to write the table itself.
        statements.append(_grant("SELECT", table, role))
    else:
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
        columns = ["value", "expire_at", *(["fence"] if fencing else [])]
        written = sql.SQL("({} OR {})").format(
            writable, _rarely(table_parts, slot_keys, existing=True)
        )
        inserted = sql.SQL("{} AND {} AND {}").format(_fits("key"), fits, bounded)
        updated = sql.SQL("{} AND {}").format(fits, bounded)
        statements += [
            _grant("SELECT, INSERT", table, role),
            _column_grant("UPDATE", columns, table, role),
            _policy(table, role, "take", check=inserted),
            _policy(table, role, "write", using=written, check=updated),
        ]
    if access == OPERATOR:
        delete = sql.SQL("({} OR {})").format(writable, slots)
        statements += [_grant("DELETE", table, role), _policy(table, role, "delete", using=delete)]
    return statements


def _history_grant(
    table_parts: tuple[str, ...],
    history: tuple[str, ...],
    role: str,
    access: Access,
    patterns: Sequence[str],
    plain_writes: bool,
) -> list[sql.Composed]:
    """The functions runs are recorded through, and the role's privileges and policies
    on the run history."""
    table = sql.Identifier(*history)
    statements = [
        history_functions_sql((history[0], history[1]), (table_parts[0], table_parts[1])),
        # A table made before the output's tail has no column for it yet.
        add_tail_columns(history),
        sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(table),
        *_replace(table, role),
    ]
    if access == READER:
        return statements + _reader(table, role)
    mine = _like_any(_likes("", patterns), "lock_key")
    statements += [_grant("SELECT", table, role)]
    if access != OPERATOR and not plain_writes:
        # It records its runs through the history functions alone
        # (dislock.core.history_functions): no right to write the table itself.
        return [*statements, _policy(table, role, "read", using=mine)]
    # A run's start writes its texts (the end, under its column privileges, none of
    # them: a run recorded before the bounds still ends), its end an outcome of
    # dislock's, which becomes a label value of dislock_runs_total.
    # Its start is the server's clock, as dislock writes it (a run "from the future"
    # would be listed first, as abandoned, and outlive every prune).
    started = sql.SQL("{} AND {} AND {} AND started_at = NOW()").format(
        mine, _fits("lock_key", "modes", "owner", "host"), _fits("cron", "cron_tz", nullable=True)
    )
    # An output's tail: the wrapper keeps at most OUTPUT_TAIL's characters of each.
    tails = _fits(*TAILS, nullable=True, limit=4 * int(OUTPUT_TAIL.high))
    ended = sql.SQL("{} AND (outcome IN ({})) IS NOT FALSE AND {}").format(
        mine, sql.SQL(", ").join(map(sql.Literal, OUTCOMES)), tails
    )
    unended = sql.SQL("({}) AND ended_at IS NULL").format(mine)
    statements += [
        # A run's start inserts its row (the table numbers it: a role choosing ids
        # could take the next ones and so keep other teams' runs from being
        # recorded), and its end fills in how it ended, once.
        _column_grant("INSERT", STARTED, table, role),
        _column_grant("UPDATE", (*ENDED, *TAILS), table, role),
        _policy(table, role, "read", using=mine),
        _policy(table, role, "take", check=started),
        _policy(table, role, "write", using=unended, check=ended),
    ]
    if access == OPERATOR:  # pruning
        statements += [_grant("DELETE", table, role), _policy(table, role, "delete", using=mine)]
    return statements


def revoke_statements(
    table_parts: tuple[str, ...],
    role: str,
    *,
    history: tuple[str, ...] | None,
    trail: tuple[str, ...] | None = None,
) -> list[sql.Composed]:
    """What ``dislockctl revoke`` runs: the role's policies and privileges on the lock
    table (and history, and audit trail) go; row-level security stays on, so the role
    sees nothing."""
    statements = [
        statement
        for parts in (table_parts, history, trail)
        if parts is not None
        for statement in _replace(sql.Identifier(*parts), role)
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
