"""The audit trail of a lock table: who did which operator action, when and why
(``sql/audit.sql``; ``dislockctl audit`` lists it).

``init`` creates ``<table>_audit`` and its one writer, ``<table>_dislock_audit``,
which runs as the table's owner: each ``dislockctl`` action calls it in the
transaction that does the action, so that an action is never without its row.  No
granted role may write the table itself; readers may read it.  A table without it
(made by hand, by dislock 0.1.0, or before this version's ``init``) is not audited.
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from psycopg import sql

from dislock.core import bounds
from dislock.core.exchange import Exchange, read_value, select_list
from dislock.core.history_functions import BUDGET_PREFIX, USED_PREFIX
from dislock.core.limits import NEVER_EXPIRES
from dislock.core.policy_functions import beside_parts, template
from dislock.core.protocol import function, installed_beside, owned_by_the_table

VERSION = "dislock audit 1"

TABLE_WIDE = ("init", "grant", "revoke")
"""Actions on the whole table (no key): the owner's alone."""

OPERATORS = ("pause", "resume", "release", "rerun", "retire")
"""Actions of an operator's grant (``grant --operator``) on its keys."""

ACTIONS = (*TABLE_WIDE, *OPERATORS, "fence", "unfence")

SIGNATURE_TYPES = "text, text, text, text, text"


def audit_table(table_parts: tuple[str, ...]) -> tuple[str, ...]:
    """The audit trail of ``table_parts``: ``<table>_audit`` beside it."""
    return beside_parts(table_parts, "_audit")


def signature(table_parts: tuple[str, ...]) -> str:
    return f"{function(table_parts, 'audit').as_string(None)}({SIGNATURE_TYPES})"


def create_audit(table_parts: tuple[str, str]) -> sql.Composed:
    """The trail and its writer (again), for ``init``: both name the lock table with
    its schema."""
    trail = audit_table(table_parts)
    table = sql.Identifier(*table_parts)
    written = sql.SQL(template("audit.sql")).format(
        trail=sql.Identifier(*trail),
        key_index=sql.Identifier(f"{trail[-1][:50]}_key_at"),
        audit=function(table_parts, "audit"),
        caller=function(table_parts, "caller"),
        table=table,
        table_oid=sql.SQL("{}::regclass").format(sql.Literal(table.as_string(None))),
        shown=sql.Literal(".".join(table_parts)),
        actions=sql.SQL(", ").join(map(sql.Literal, ACTIONS)),
        table_wide=sql.SQL(", ").join(map(sql.Literal, TABLE_WIDE)),
        operators=sql.SQL(", ").join(map(sql.Literal, OPERATORS)),
        max_bytes=sql.Literal(bounds.MAX_STORED_BYTES),
        max_reason=sql.Literal(bounds.MAX_REASON_BYTES),
        budget_prefix=sql.Literal(BUDGET_PREFIX),
        used_prefix=sql.Literal(USED_PREFIX),
        never=sql.Literal(NEVER_EXPIRES),
        version=sql.Literal(VERSION),
    )
    owned = owned_by_the_table(table, [signature(table_parts)])
    return sql.SQL("{}\n{};").format(written, owned)


def installed(table_parts: tuple[str, ...]) -> Exchange[bool]:
    """Whether the trail's writer of this version is beside ``table_parts``."""
    return installed_beside(VERSION, signature(table_parts))


def record(
    table_parts: tuple[str, ...], action: str, lock_key: str | None, detail: str, reason: str
) -> Exchange[None]:
    """The call that records ``action`` (the role it acted as is the server's)."""
    query = sql.SQL(
        "SELECT FROM {}(p_action => %(action)s, p_lock_key => %(key)s,"
        " p_detail => %(detail)s, p_reason => %(reason)s)"
    ).format(function(table_parts, "audit"))
    # (A detail is dislockctl's own words, cut to fit the writer's bound.)
    params = {"action": action, "key": lock_key, "detail": detail[:1000] or None, "reason": reason}
    return Exchange(query, params, lambda rows: None)


class Entry(NamedTuple):
    """A row of the trail, as ``entries`` answers it."""

    at: datetime
    login_role: str
    acted_as: str
    action: str
    lock_key: str | None
    detail: str | None
    reason: str | None


def entries(
    trail: tuple[str, ...], lock_key: str | None, since: datetime | None, newest: int = 0
) -> Exchange[list[Entry]]:
    """The trail's rows (of ``lock_key``, since ``since``, if given), oldest first; or,
    with ``newest``, that many of the newest, newest first."""
    order = "ORDER BY at, id" if not newest else f"ORDER BY at DESC, id DESC LIMIT {int(newest)}"
    query = sql.SQL(
        "SELECT {} FROM {} WHERE (%(key)s::text IS NULL OR lock_key = %(key)s::text)"
        " AND (%(since)s::timestamptz IS NULL OR at >= %(since)s::timestamptz) {}"
    ).format(
        select_list(Entry._fields, **{field: sql.Identifier(field) for field in Entry._fields}),
        sql.Identifier(*trail),
        sql.SQL(order),
    )
    params = {"key": lock_key, "since": since}
    return Exchange(query, params, lambda rows: [Entry._make(row) for row in rows])


def trail_readable(trail: tuple[str, ...]) -> Exchange[bool | None]:
    """Whether this role may read the trail ``trail``; None: there is none."""
    query = sql.SQL("SELECT has_table_privilege(t, 'SELECT') FROM to_regclass({}) AS t").format(
        sql.Literal(sql.Identifier(*trail).as_string(None))
    )
    return Exchange(query, {}, read_value)
