"""The rarer lock statements as functions beside the table: each plain statement
(a lease's slots, a retrying slot, a replacer's steps, a hand-back), wrapped
unchanged in a function that runs as the table's owner once the caller passed
``<table>_dislock_caller`` (``sql/protocol.sql``), so that a team of ``dislockctl
grant`` needs no right to write the lock table.  The same text serves a table
without the functions (``dislock.core.protocol``'s fallback): they cannot drift
(docs/design.md, "The protocol lives in the database").
"""

from __future__ import annotations

import re
from typing import NamedTuple

from psycopg import sql

from dislock.core.bounds import MAX_STORED_BYTES
from dislock.core.failover import TTL_KEY_PREFIX

TYPES = {
    **dict.fromkeys(("keys", "owners"), "text[]"),
    "ttls": "float8[]",
    **dict.fromkeys(("ends", "latest"), "timestamptz[]"),
    **dict.fromkeys(("covered_from", "expire_at"), "timestamptz"),
    **dict.fromkeys(("ttl", "delay"), "float8"),
    "attempts": "int8",
    "fencing": "boolean",
    **dict.fromkeys(("key", "pause", "owner", "value", "lease", "reopened"), "text"),
    **dict.fromkeys(("channel", "wake_key"), "text"),
    **dict.fromkeys(("successor", "mark", "marked", "handed", "prefix", "released"), "text"),
}
"""Each parameter's type, by its name in the statements."""

_CLAIM = "acquired boolean, token int8, paused_for text, paused_until timestamptz,"


class Wrapped(NamedTuple):
    """One statement as a function."""

    name: str
    """Its name after the table's, without ``_dislock_``; the statement's ``Queries``
    field, or ``replace``'s query function."""
    params: tuple[str, ...]
    returns: str
    """The function's ``RETURNS``: ``TABLE (...)`` with the statement's columns, or
    ``SETOF boolean`` (a row per row the statement returned)."""
    keys: str
    """The row keys it writes, an array expression of the arguments: their lock key
    is the one the caller must be granted."""
    pause: str = "NULL"
    """The pause row it reads, when it takes any."""
    new_key: str = "NULL"
    """The row whose absence makes the call take a new key (its quota), or NULL."""
    fenced: bool = False
    """Whether the statement differs with fencing tokens (an argument ``p_fencing``)."""

    @property
    def arguments(self) -> tuple[str, ...]:
        """The function's arguments, named as its call's parameters."""
        return (*self.params, "fencing") if self.fenced else self.params


WRAPPED = (
    Wrapped(
        "acquire_slot",
        ("keys", "pause", "owner", "ttl"),
        "TABLE (key text, token int8, free int8, paused_for text, paused_until timestamptz,"
        " delayed_until timestamptz, ttl_cap float8)",
        "p_keys",
        "p_pause",
        "p_keys[1]",
        fenced=True,
    ),
    Wrapped(
        "acquire_retrying",
        ("key", "pause", "owner", "expire_at", "lease", "reopened", "attempts", "delay"),
        f"TABLE ({_CLAIM} timeline int8, delayed_until timestamptz, attempt int4,"
        " retry_at timestamptz)",
        "ARRAY[p_key]",
        "p_pause",
        "p_key",
        fenced=True,
    ),
    Wrapped(
        "take_over",
        ("key", "pause", "owner", "successor", "ttl"),
        f"TABLE ({_CLAIM} timeline int8, delayed_until timestamptz, ttl_cap float8)",
        "ARRAY[p_key]",
        "p_pause",
        fenced=True,
    ),
    Wrapped("hand_back", ("keys", "owner", "channel", "wake_key"), "SETOF boolean", "p_keys"),
    Wrapped(
        "reopen",
        ("key", "value", "expire_at", "reopened", "delay"),
        "TABLE (expire_at timestamptz)",
        "ARRAY[p_key]",
    ),
    Wrapped("done", ("key", "value", "expire_at"), "SETOF boolean", "ARRAY[p_key]"),
    Wrapped(
        "mark",
        ("key", "mark", "marked", "handed"),
        "TABLE (holder text, remaining float8)",
        "ARRAY[p_key]",
    ),
    Wrapped("hand_over", ("key", "prefix", "handed"), "TABLE (successor text)", "ARRAY[p_key]"),
    Wrapped("withdraw", ("key", "mark", "handed", "released"), "SETOF boolean", "ARRAY[p_key]"),
)

HOT = {
    "acquire": ("key", "pause", "owner", "expire_at", "ttl", "fencing"),
    "acquire_by_clock": ("key", "pause", "owner", "covered_from", "ends", "latest", "fencing"),
    "renew": ("keys", "owners", "ttls"),
    "release": ("key", "owner", "channel", "wake_key"),
}
"""The hot functions, written out in ``sql/protocol.sql``: their arguments."""

CALLED = {**HOT, **{wrapped.name: wrapped.arguments for wrapped in WRAPPED}}
"""Every lock function a statement is sent as, and its arguments."""


def argument_types(arguments: tuple[str, ...]) -> str:
    """The types of ``arguments``, as ``regprocedure`` names them."""
    return ", ".join(TYPES[argument] for argument in arguments)


RECORD = sql.SQL("({} || v_role)").format(sql.Literal(TTL_KEY_PREFIX))
"""The longest-TTL record of the role whose grant let the caller in."""


def _statement(table_parts: tuple[str, str], wrapped: Wrapped, fencing: bool) -> str:
    """The statement's text, its placeholders turned into the function's arguments."""
    from dislock.core import lock_queries, replace_marks

    if wrapped.name in ("mark", "hand_over", "withdraw"):
        query: sql.Composable = getattr(replace_marks, f"{wrapped.name}_query")(table_parts)
    else:
        query = getattr(lock_queries.queries(table_parts, fencing, RECORD), wrapped.name)
    text = query.as_string(None)
    return re.sub(r"%\((\w+)\)s", r"p_\1", text).replace("%%", "%")


def _body(table_parts: tuple[str, str], wrapped: Wrapped, fencing: bool) -> str:
    statement = _statement(table_parts, wrapped, fencing)
    if wrapped.returns.startswith("TABLE"):
        return f"RETURN QUERY {statement};"
    if " RETURNING " not in statement:  # (a loop would open it as a cursor)
        return f"{statement};"
    return f"FOR v_row IN {statement} LOOP RETURN NEXT true; END LOOP;"


def _bounded(params: tuple[str, ...], most: int) -> str:
    """Refuse a text argument longer than the grants' bound, as their policies did."""
    texts = [f"octet_length(p_{name})" for name in params if TYPES[name] == "text"]
    return (
        f"IF greatest({', '.join(texts)}) > {most} THEN RAISE EXCEPTION USING"
        f" ERRCODE = 'insufficient_privilege', MESSAGE = 'a text is longer than {most} bytes';"
        " END IF;\n"
    )


APPENDING = ("mark", "hand_over", "reopen", "done", "withdraw")
"""The statements that append to a row's value: their functions refuse a value past
the grants' bound, however often a team calls them (security review #61, N9)."""


def _still_bounded(table_parts: tuple[str, str], wrapped: Wrapped, most: int) -> str:
    if wrapped.name not in APPENDING:
        return ""
    table = sql.Identifier(*table_parts).as_string(None)
    return (
        f"\nIF EXISTS (SELECT FROM {table} AS t WHERE t.key = ANY({wrapped.keys})"
        f" AND octet_length(t.value) > {most}) THEN RAISE EXCEPTION USING"
        f" ERRCODE = 'insufficient_privilege', MESSAGE = 'a lock row''s value would be"
        f" longer than {most} bytes'; END IF;"
    )


def wrapped_sql(table_parts: tuple[str, str], names: dict[str, sql.Identifier]) -> sql.Composed:
    """The ``CREATE OR REPLACE FUNCTION`` of each wrapped statement; ``names``: the
    functions beside the table (``dislock.core.protocol.function``), ``caller``'s too."""
    statements = []
    for wrapped in WRAPPED:
        arguments = ", ".join(f"p_{name} {TYPES[name]}" for name in wrapped.arguments)
        if wrapped.fenced:
            body = (
                f"IF p_fencing THEN {_body(table_parts, wrapped, True)}"
                f" ELSE {_body(table_parts, wrapped, False)} END IF;"
            )
        else:
            body = _body(table_parts, wrapped, False)
        statements.append(
            sql.SQL(
                "CREATE OR REPLACE FUNCTION {name}({arguments}) RETURNS {returns}"
                " LANGUAGE plpgsql VOLATILE SECURITY DEFINER"
                " SET search_path = pg_catalog, pg_temp AS {source}"
            ).format(
                name=names[wrapped.name],
                arguments=sql.SQL(arguments),
                returns=sql.SQL(wrapped.returns),
                source=sql.Literal(
                    "#variable_conflict use_column\n"
                    "DECLARE v_role text; v_row record;\nBEGIN\n"
                    f"{_bounded(wrapped.params, MAX_STORED_BYTES)}"
                    f"SELECT c.role INTO v_role FROM {names['caller'].as_string(None)}"
                    f"({wrapped.new_key}, {names['lock_of'].as_string(None)}"
                    f"({wrapped.keys}, {wrapped.pause})) AS c;\n{body}"
                    f"{_still_bounded(table_parts, wrapped, MAX_STORED_BYTES)}\nEND"
                ),
            )
        )
    return sql.SQL(";\n").join(statements)
