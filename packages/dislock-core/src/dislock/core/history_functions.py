"""The run history's writes as functions beside the history table
(``sql/history_functions.sql``): a run's start, its end, a slot held back.

They run as the table's owner and check the caller with the lock table's functions
(``dislock.core.protocol``), so that a team writes no row of the history by hand;
each granted role's rows are held to its history budget (``dislockctl grant
--max-history-mib``): past it, runs are still recorded, without their output's tail.
A history table without them (made before them, or by hand) gets the plain
statements of ``dislock.core.history``, as the lock table does.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from psycopg import sql

from dislock.core import bounds
from dislock.core.after import success_notice
from dislock.core.exchange import Exchange
from dislock.core.failover import SCOPE_KEY_PREFIX
from dislock.core.limits import NEVER_EXPIRES, metadata_row
from dislock.core.policy_functions import beside, beside_parts
from dislock.core.protocol import (
    function,
    function_call,
    installed_beside,
    owned_by_the_table,
    via_function,
)
from dislock.core.variables import OUTPUT_TAIL

VERSION = "dislock history functions 1"

BUDGET_PREFIX = "dislock:history-budget:"
"""Metadata rows ``<prefix><role>`` of the lock table: the most bytes the role's
history rows may hold (``dislockctl grant --max-history-mib``)."""

USED_PREFIX = "dislock:history-used:"
"""Metadata rows ``<prefix><role>``: the bytes counted so far (recounted past the budget)."""

DEFAULT_MAX_HISTORY_MIB = 256
"""A granted role's history budget unless ``--max-history-mib`` says otherwise."""

ARGUMENTS = {
    "within_budget": "text, int8",
    "start": "text, text, timestamptz, text, text, int4, text, text",
    "end": "int8, text, int4, int4, timestamptz, text, text",
    "held_back": "text, timestamptz, timestamptz, text, text, int4, text, text, text",
}

PARAMS = {
    "start": ("lock_key", "modes", "slot_end", "owner", "host", "pid", "cron", "cron_tz"),
    "end": ("id", "outcome", "exit_code", "signal", "ended_at", "stdout_tail", "stderr_tail"),
    "held_back": (
        "lock_key",
        "slot_start",
        "slot_end",
        "owner",
        "host",
        "pid",
        "cron",
        "cron_tz",
        "outcome",
    ),
}


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


def name(history: tuple[str, ...], what: str) -> sql.Identifier:
    return beside(history, f"_dislock_{what}")


def signature(history: tuple[str, ...], what: str) -> str:
    return f"{name(history, what).as_string(None)}({ARGUMENTS[what]})"


def history_functions_sql(history: tuple[str, str], lock_table: tuple[str, str]) -> sql.Composed:
    """The statements that (re)install the functions of ``history``, whose runs are of
    the locks of ``lock_table`` (both with their schemas)."""
    from dislock.core.after import HELD_BACK, LATE_FALLBACK, MODES
    from dislock.core.history import OUTCOMES

    template = (resources.files("dislock.core") / "sql" / "history_functions.sql").read_text()
    table = sql.Identifier(*history)
    written = sql.SQL(template).format(
        **{what: name(history, what) for what in ARGUMENTS},
        caller=function(lock_table, "caller"),
        table=sql.Identifier(*lock_table),
        history=table,
        budget_prefix=sql.Literal(BUDGET_PREFIX),
        used_prefix=sql.Literal(USED_PREFIX),
        scope_prefix=sql.Literal(SCOPE_KEY_PREFIX),
        never=sql.Literal(NEVER_EXPIRES),
        max_bytes=sql.Literal(bounds.MAX_STORED_BYTES),
        max_tail=sql.Literal(4 * int(OUTPUT_TAIL.high)),
        outcomes=sql.SQL(", ").join(map(sql.Literal, OUTCOMES)),
        held_outcomes=sql.SQL(", ").join(map(sql.Literal, (HELD_BACK, LATE_FALLBACK))),
        held_modes=sql.Literal(MODES),
        notice=success_notice(),
        version=sql.Literal(VERSION),
    )
    owned = owned_by_the_table(table, [signature(history, what) for what in ARGUMENTS])
    return sql.SQL("{}\n{};").format(written, owned)


def installed(history: tuple[str, ...]) -> Exchange[bool]:
    """Whether the functions of this version are beside ``history``."""
    return installed_beside(VERSION, signature(history, "start"))


def via(history: tuple[str, ...], what: str, plain: Exchange[Any], **extra: Any) -> Exchange[Any]:
    """``plain`` (a statement of ``dislock.core.history`` or ``held_back``) as a call to
    the function ``what``; ``extra``: arguments the plain statement does not take."""
    params = {param: None for param in PARAMS[what]} | plain.params | extra
    params = {param: params[param] for param in PARAMS[what]}
    called = plain._replace(query=_call(history, what), params=params)
    return via_function(history, called, plain)


def _call(history: tuple[str, ...], what: str) -> sql.Composed:
    return function_call(beside_parts(history, f"_dislock_{what}"), PARAMS[what])
