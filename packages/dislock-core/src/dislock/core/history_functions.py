"""The run history's writes as functions beside the history table
(``sql/history_functions.sql``): a run's start, its end, a slot held back.

They run as the table's owner and check the caller with the lock table's functions
(``dislock.core.protocol``), so that a team writes no row of the history by hand;
each granted role's rows are held to its history budget (``dislockctl grant
--max-history-mib``): past it, runs are still recorded, without their output's tail,
and each makes room from its key's oldest runs.
A history table without them (made before them, or by hand) gets the plain
statements of ``dislock.core.history``, as the lock table does.
"""

from __future__ import annotations

from typing import Any

from psycopg import sql

from dislock.core import bounds
from dislock.core.after import success_notice
from dislock.core.exchange import Exchange
from dislock.core.failover import SCOPE_KEY_PREFIX
from dislock.core.limits import NEVER_EXPIRES, metadata_row
from dislock.core.policy_functions import template
from dislock.core.protocol import call, function, installed_beside, owned_by_the_table, via_function
from dislock.core.variables import OUTPUT_TAIL

VERSION = "dislock history functions 3"

BUDGET_PREFIX = "dislock:history-budget:"
"""Metadata rows ``<prefix><role>`` of the lock table: the most bytes the role's
history rows may hold (``dislockctl grant --max-history-mib``)."""

USED_PREFIX = "dislock:history-used:"
"""Metadata rows ``<prefix><role>``: the bytes counted so far, as they are written."""

ROW_BYTES = (
    "64 + octet_length({h}.lock_key) + octet_length({h}.modes) + octet_length({h}.owner)"
    " + octet_length({h}.host) + coalesce(octet_length({h}.cron), 0)"
    " + coalesce(octet_length({h}.cron_tz), 0) + coalesce(octet_length({h}.stdout_tail), 0)"
    " + coalesce(octet_length({h}.stderr_tail), 0)"
)
"""A run row's bytes as its role's budget counts them (``{h}``: the row's alias)."""


def refund(lock_table: tuple[str, ...], gone: str) -> sql.Composed:
    """The statement (of a ``WITH``) that takes the bytes of the runs ``gone`` (a
    ``DELETE … RETURNING lock_key, bytes``) off the counts of the roles whose scope
    holds their keys: a prune by hand makes room as the functions' own prune does."""
    table = sql.Identifier(*lock_table)
    return sql.SQL(
        "UPDATE {table} AS used SET value = greatest(0, used.value::int8 - (SELECT"
        " coalesce(sum(g.bytes), 0) FROM {gone} AS g WHERE g.lock_key ~ scope.value))::text"
        " FROM {table} AS scope WHERE starts_with(used.key, {used})"
        " AND scope.key = {scope} || substr(used.key, {after})"
    ).format(
        table=table,
        gone=sql.Identifier(gone),
        used=sql.Literal(USED_PREFIX),
        scope=sql.Literal(SCOPE_KEY_PREFIX),
        after=sql.Literal(len(USED_PREFIX) + 1),
    )


DEFAULT_MAX_HISTORY_MIB = 256
"""A granted role's history budget unless ``--max-history-mib`` says otherwise."""

ARGUMENTS = {
    "within_budget": "role text, bytes int8, always boolean",
    "start": "lock_key text, modes text, slot_end timestamptz, owner text, host text,"
    " pid int4, cron text, cron_tz text",
    "end": "id int8, outcome text, exit_code int4, signal int4, ended_at timestamptz,"
    " stdout_tail text, stderr_tail text",
    "held_back": "lock_key text, slot_start timestamptz, slot_end timestamptz, owner text,"
    " host text, pid int4, cron text, cron_tz text, outcome text",
}
"""Each function's arguments (``p_<name>`` in the SQL file), named as its call's
parameters, and their types."""


def history_budget(max_history_mib: int | None) -> int:
    """A grant's budget in MiB (None: the default; 0: no limit)."""
    return DEFAULT_MAX_HISTORY_MIB if max_history_mib is None else max_history_mib


def set_history_budget(table_parts: tuple[str, ...], role: str, mib: int) -> sql.Composed:
    """Record ``role``'s history budget in the lock table; ``0`` removes it (no limit)."""
    table = sql.Identifier(*table_parts)
    if mib <= 0:
        return sql.SQL("DELETE FROM {} WHERE key = {}").format(
            table, sql.Literal(BUDGET_PREFIX + role)
        )
    return metadata_row(table_parts, BUDGET_PREFIX + role, str(mib * 1024 * 1024))


def _arguments(what: str) -> list[list[str]]:
    return [argument.split() for argument in ARGUMENTS[what].split(", ")]


def signature(history: tuple[str, ...], what: str) -> str:
    types = ", ".join(kind for _, kind in _arguments(what))
    return f"{function(history, what).as_string(None)}({types})"


def history_functions_sql(history: tuple[str, str], lock_table: tuple[str, str]) -> sql.Composed:
    """The statements that (re)install the functions of ``history``, whose runs are of
    the locks of ``lock_table`` (both with their schemas)."""
    from dislock.core.after import HELD_BACK, LATE_FALLBACK, MODES
    from dislock.core.history import OUTCOMES, last_success_query

    table = sql.Identifier(*history)
    written = sql.SQL(template("history_functions.sql")).format(
        **{what: function(history, what) for what in ARGUMENTS},
        caller=function(lock_table, "caller"),
        table=sql.Identifier(*lock_table),
        history=table,
        budget_prefix=sql.Literal(BUDGET_PREFIX),
        used_prefix=sql.Literal(USED_PREFIX),
        never=sql.Literal(NEVER_EXPIRES),
        max_bytes=sql.Literal(bounds.MAX_STORED_BYTES),
        max_tail=sql.Literal(4 * int(OUTPUT_TAIL.high)),
        outcomes=sql.SQL(", ").join(map(sql.Literal, OUTCOMES)),
        held_outcomes=sql.SQL(", ").join(map(sql.Literal, (HELD_BACK, LATE_FALLBACK))),
        held_modes=sql.Literal(MODES),
        notice=success_notice(),
        row_bytes=sql.SQL(ROW_BYTES.format(h="h")),
        version=sql.Literal(VERSION),
        start_signature=sql.Literal(signature(history, "start")),
        last_success=last_success_query(history, sql.SQL("p_lock_key")),
    )
    owned = owned_by_the_table(table, [signature(history, what) for what in ARGUMENTS])
    return sql.SQL("{}\n{};").format(written, owned)


def installed(history: tuple[str, ...]) -> Exchange[bool]:
    """Whether the functions of this version are beside ``history``."""
    return installed_beside(VERSION, signature(history, "start"))


def via(history: tuple[str, ...], what: str, plain: Exchange[Any], **extra: Any) -> Exchange[Any]:
    """``plain`` (a statement of ``dislock.core.history`` or ``held_back``) as a call to
    the function ``what``; ``extra``: arguments the plain statement does not take."""
    names = tuple(name for name, _ in _arguments(what))
    given = plain.params | extra
    params = {name: given.get(name) for name in names}
    called = plain._replace(query=call(history, what, names), params=params)
    return via_function(history, called, plain)
