"""The lock protocol as functions beside the lock table: what ``dislockctl init``
installs (``sql/protocol.sql``), and the calls that replace the statements of
``dislock.core.lock_queries``, answering exactly their rows (docs/design.md, "The
protocol lives in the database").

A table without them (made by hand, by dislock 0.1.0, or before this version's
``init``) keeps working: a call the server does not know (SQLSTATE 42883) is sent
again as the plain statement, and the process remembers the table (``MISSING``),
so that it asks once.  A changed signature is a new function, which an older table
lacks in the same way: the version in the comment says when ``init`` must rewrite
them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from psycopg import sql

from dislock.core.bounds import MAX_STORED_BYTES
from dislock.core.exchange import Answer, Exchange, read_flag
from dislock.core.failover import (
    NEVER_NOTICED,
    SCOPE_KEY_PREFIX,
    TIMELINE,
    TIMELINE_KEY,
    TTL_KEY_PREFIX,
)
from dislock.core.key_quota import OVER_QUOTA, QUOTA_KEY_PREFIX
from dislock.core.kinds import GROUP, KEY_PREFIX, SLOT_NUMBER
from dislock.core.limits import DEFAULT_MAX_TTL, MAX_TTL_KEY, NEVER_EXPIRES, max_ttl_of
from dislock.core.policy_functions import beside, template
from dislock.core.refusal import NO_GRANT
from dislock.core.rows import PAUSE_PREFIX, RELEASED_MARK
from dislock.core.waiting import wake_payload
from dislock.core.wrapped import CALLED, argument_types, wrapped_sql

VERSION = "dislock protocol 6"
"""The comment on the acquiring function: ``init`` rewrites functions of another one."""

ARGUMENTS = {
    "lock_of": "text[], text",
    "caller": "text, text",
    **{name: argument_types(arguments) for name, arguments in CALLED.items()},
}
"""Each function's argument types, as ``regprocedure`` names them."""

LOCK_ROW = rf"^{KEY_PREFIX}:(?:schedule|lease|group)(?:#{SLOT_NUMBER})?:(.*)$"
"""The row keys a team may write through the functions, its lock key captured: a
schedule, lease or group row, or a further slot of one (2 to 1000)."""

MISSING: set[tuple[str, ...]] = set()
"""Tables this process found without the functions: sent plain statements."""


def function(table_parts: tuple[str, ...], name: str) -> sql.Identifier:
    """The function ``name`` (a key of ``ARGUMENTS``) of the table ``table_parts``."""
    return beside(table_parts, f"_dislock_{name}")


def signature(table_parts: tuple[str, ...], name: str) -> str:
    """The function ``name`` of ``table_parts`` with its argument types."""
    return f"{function(table_parts, name).as_string(None)}({ARGUMENTS[name]})"


def owned_by_the_table(table: sql.Identifier, signatures: list[str]) -> sql.Composed:
    """The block that gives the functions ``signatures`` to ``table``'s owner
    (``sql/owned_by_the_table.sql``)."""
    return sql.SQL(template("owned_by_the_table.sql")).format(
        table_oid=sql.SQL("{}::regclass").format(sql.Literal(table.as_string(None))),
        signatures=sql.SQL(", ").join(map(sql.Literal, signatures)),
    )


def protocol_sql(table_parts: tuple[str, str]) -> sql.Composed:
    """The statements that (re)install the functions of ``table_parts`` (schema and
    name: they name every object with its schema)."""
    table = sql.Identifier(*table_parts)
    names = {name: function(table_parts, name) for name in ARGUMENTS}
    row_key = "^[^:]*:[^:]*:(.*)$"
    written = sql.SQL(template("protocol.sql")).format(
        **names,
        table=table,
        table_oid=sql.SQL("{}::regclass").format(sql.Literal(table.as_string(None))),
        shown=sql.Literal(".".join(table_parts)),
        quota_prefix=sql.Literal(QUOTA_KEY_PREFIX),
        group_row=sql.Literal(f"{KEY_PREFIX}:{GROUP.mode}"),
        over=sql.Literal(OVER_QUOTA),
        lock_key_of_key=sql.SQL("substring(t.key FROM {})").format(sql.Literal(row_key)),
        row_key=sql.Literal(LOCK_ROW),
        pause_prefix=sql.Literal(PAUSE_PREFIX),
        max_bytes=sql.Literal(MAX_STORED_BYTES),
        max_ttl_key=sql.Literal(MAX_TTL_KEY),
        default_max_ttl=sql.Literal(DEFAULT_MAX_TTL),
        no_grant=sql.Literal(NO_GRANT),
        timeline=TIMELINE,
        timeline_key=sql.Literal(TIMELINE_KEY),
        cap=max_ttl_of(table),
        never_noticed=NEVER_NOTICED,
        never=sql.Literal(NEVER_EXPIRES),
        ttl_prefix=sql.Literal(TTL_KEY_PREFIX),
        scope_prefix=sql.Literal(SCOPE_KEY_PREFIX),
        after_ttl_prefix=sql.Literal(len(TTL_KEY_PREFIX) + 1),
        released=sql.Literal(RELEASED_MARK),
        wake=wake_payload(sql.SQL("tableoid"), sql.SQL("p_wake_key")),
        version=sql.Literal(VERSION),
    )
    owned = owned_by_the_table(table, [signature(table_parts, name) for name in ARGUMENTS])
    return sql.SQL("{};\n{}\n{};").format(wrapped_sql(table_parts, names), written, owned)


INSTALLED = sql.SQL(
    "SELECT coalesce(obj_description(to_regprocedure(%(function)s), 'pg_proc') = %(version)s"
    " AND NOT EXISTS (SELECT FROM unnest(%(others)s::text[]) AS other"
    " WHERE to_regprocedure(other) IS NULL), false) AS installed"
)


def installed_beside(version: str, function: str, *others: str) -> Exchange[bool]:
    """Whether the functions of ``version`` are beside a table (``init``'s question
    before it writes them): ``function`` (a signature) carries ``version`` in its
    comment, and the functions ``others`` exist."""
    params = {"function": function, "version": version, "others": list(others)}
    return Exchange(INSTALLED, params, read_flag)


def installed(table_parts: tuple[str, ...]) -> Exchange[bool]:
    """Whether the lock functions of this version are beside ``table_parts``."""
    return installed_beside(VERSION, signature(table_parts, "acquire"))


@lru_cache(maxsize=256)
def call(table_parts: tuple[str, ...], name: str, params: tuple[str, ...]) -> sql.Composed:
    """``SELECT * FROM <the function name of table_parts>(p_a => %(a)s, ...)``: named
    arguments, so that the server resolves their types from the function's signature.
    Built once per function, so that connections can keep its rendering."""
    return sql.SQL("SELECT * FROM {}({})").format(
        function(table_parts, name),
        sql.SQL(", ").join(
            sql.SQL("{} => {}").format(sql.Identifier(f"p_{param}"), sql.Placeholder(param))
            for param in params
        ),
    )


def via_function(
    table_parts: tuple[str, ...], called: Exchange[Any], plain: Exchange[Any]
) -> Exchange[Any]:
    """``called`` (a function call), falling back to ``plain`` on a table without the
    functions; ``plain`` itself once this process knows it has none."""
    if table_parts in MISSING:
        return plain
    return called._replace(fallback=plain, functions_of=table_parts)


def missing(exchange: Exchange[Answer]) -> Exchange[Answer]:
    """The server has no function ``exchange`` calls: its plain statement, to send
    instead; the table's other calls are sent plain from now on."""
    assert exchange.fallback is not None and exchange.functions_of is not None
    MISSING.add(exchange.functions_of)
    return exchange.fallback
