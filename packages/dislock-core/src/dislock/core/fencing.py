"""Fencing enforced by the database: the guard a user's table gets from ``dislockctl
fence``, and how a writer's transaction carries its lease's fencing token to it
(``PGOPTIONS`` or ``set_config``: docs/fencing.md).

A guarded table refuses every write (and ``TRUNCATE``) whose transaction does not carry,
in the setting ``dislock.fencing_token``, the token of a live lease of the guard's lock
key; the check runs as the transaction commits (``sql/fence_guard.sql``).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from psycopg import sql

from dislock.core import bounds
from dislock.core.errors import ConfigurationError
from dislock.core.exchange import Exchange, Rows
from dislock.core.failover import SCOPE_KEY_PREFIX
from dislock.core.kinds import LEASE, kind
from dislock.core.policy_functions import beside, template
from dislock.core.replace_marks import HANDED_MARK, REPLACED_MARK
from dislock.core.variables import SLOTS

SETTING = "dislock.fencing_token"
"""The setting a writer's transaction carries its token in."""

SQLSTATE = "FENCE"
"""The error code of a write the guard refused (class ``FE``, which no standard uses)."""

TRIGGER = "dislock_fence"
"""The deferred constraint trigger on a guarded table (inserts, updates, deletes)."""

TRUNCATE_TRIGGER = "dislock_fence_truncate"

VERSION = "dislock fence guard 3"
"""The guard functions' comment: ``init --fencing`` rewrites functions of another one."""

HINT = (
    "Run the writer under dislock with LOCK_FENCING=1 (it passes the token in PGOPTIONS),"
    f" or send SELECT set_config('{SETTING}', <token>, true) first in each transaction;"
    " dislockctl ... unfence TABLE removes the guard."
)


def guard_function(lock_table: tuple[str, str]) -> sql.Identifier:
    """The guard's check (a trigger function), beside the lock table."""
    return beside(lock_table, "_dislock_fence")


def due_function(lock_table: tuple[str, str]) -> sql.Identifier:
    """What the WHEN of a trigger of an earlier ``fence`` calls (now always true)."""
    return beside(lock_table, "_dislock_fence_due")


def guard_sql(lock_table: tuple[str, str]) -> sql.Composed:
    """The statements that (re)install the guard functions of ``lock_table`` (schema and
    name: the functions name every object with its schema)."""
    lease = kind(LEASE)
    return sql.SQL(template("fence_guard.sql")).format(
        due=due_function(lock_table),
        guard=guard_function(lock_table),
        table=sql.Identifier(*lock_table),
        table_oid=sql.SQL("{}::regclass").format(
            sql.Literal(sql.Identifier(*lock_table).as_string(None))
        ),
        triggers=sql.SQL(", ").join(map(sql.Literal, (TRIGGER, TRUNCATE_TRIGGER))),
        scope_prefix=sql.Literal(SCOPE_KEY_PREFIX),
        lease_row=sql.Literal(lease.row_key("")),
        slot_row=sql.Literal(lease.row_key("", 2).removesuffix("2:")),
        max_slots=sql.Literal(int(SLOTS.high)),
        replaced=sql.Literal(REPLACED_MARK),
        handed=sql.Literal(HANDED_MARK),
        handed_length=sql.Literal(len(HANDED_MARK)),
        sqlstate=sql.Literal(SQLSTATE),
        hint=sql.Literal(HINT),
        version=sql.Literal(VERSION),
    )


def guard_installed(lock_table: tuple[str, str]) -> Exchange[bool]:
    """Whether the guard functions of this version are beside ``lock_table``."""
    from dislock.core.protocol import installed_beside

    guard = f"{guard_function(lock_table).as_string(None)}()"
    return installed_beside(VERSION, guard, f"{due_function(lock_table).as_string(None)}(text)")


def fence_statements(
    lock_table: tuple[str, str], user_table: tuple[str, ...], lock_key: str
) -> list[sql.Composed]:
    """Guard ``user_table`` by ``lock_key``'s lease (replacing a guard it had).  The
    triggers fire for every role, and under ``session_replication_role = replica`` too
    (``ENABLE ALWAYS``): only ``unfence`` takes the guard away."""
    table = sql.Identifier(*user_table)
    key = sql.Literal(lock_key)
    guard = guard_function(lock_table)
    statements = unfence_statements(user_table)
    statements += [
        sql.SQL(
            "CREATE CONSTRAINT TRIGGER {trigger} AFTER INSERT OR UPDATE OR DELETE ON {table}"
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {guard}({key})"
        ).format(trigger=sql.Identifier(TRIGGER), table=table, key=key, guard=guard),
        sql.SQL(
            "CREATE TRIGGER {trigger} BEFORE TRUNCATE ON {table}"
            " FOR EACH STATEMENT EXECUTE FUNCTION {guard}({key})"
        ).format(trigger=sql.Identifier(TRUNCATE_TRIGGER), table=table, guard=guard, key=key),
    ]
    enable = sql.SQL("ALTER TABLE {} ENABLE ALWAYS TRIGGER {}")
    triggers = (TRIGGER, TRUNCATE_TRIGGER)
    return statements + [enable.format(table, sql.Identifier(name)) for name in triggers]


def unfence_statements(user_table: tuple[str, ...]) -> list[sql.Composed]:
    table = sql.Identifier(*user_table)
    return [
        sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(sql.Identifier(trigger), table)
        for trigger in (TRIGGER, TRUNCATE_TRIGGER)
    ]


class Guarded(NamedTuple):
    """A user's table as ``fence`` finds it (the row ``table_state`` answers)."""

    owned: bool
    """Whether the connected role owns it (or is a member of its owner)."""
    key: str | None
    """The lock key of its guard, None if it has none."""


def table_state(user_table: tuple[str, ...]) -> Exchange[Guarded | None]:
    """``user_table``'s owner and guard; None if there is no such table."""
    query = sql.SQL(
        "SELECT pg_has_role(c.relowner, 'USAGE') AS owned,"
        " (SELECT encode(t.tgargs, 'escape') FROM pg_trigger t"
        "  WHERE t.tgrelid = c.oid AND t.tgname = %(trigger)s) AS key"
        " FROM pg_class c WHERE c.oid = to_regclass(%(table)s)"
    )
    params = {"table": sql.Identifier(*user_table).as_string(None), "trigger": TRIGGER}
    return Exchange(query, params, _read_guarded)


def _read_guarded(rows: Rows) -> Guarded | None:
    if not rows:
        return None
    found = Guarded._make(rows[0])
    # tgargs holds each argument followed by a NUL, which ``escape`` shows as \000.
    key = None if found.key is None else str(found.key).removesuffix("\\000")
    return Guarded(bool(found.owned), key)


def scoped_roles(lock_table: tuple[str, ...]) -> Exchange[set[str]]:
    """The roles whose grants on ``lock_table`` bound what the connected role does: its
    own and those it is a member of; none for a superuser or the table's owner."""
    query = sql.SQL(
        "SELECT r.rolname FROM pg_roles r WHERE pg_has_role(r.oid, 'USAGE')"
        " AND NOT (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)"
        " AND NOT coalesce((SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c"
        "  WHERE c.oid = to_regclass(%(table)s)), false)"
    )
    params = {"table": sql.Identifier(*lock_table).as_string(None)}
    return Exchange(query, params, lambda rows: {str(role) for (role,) in rows})


def set_token(token: int | str | None, *, local: bool = True) -> Exchange[object]:
    """The statement that gives the rest of this transaction (``local``) or this session
    the fencing token ``token``."""
    query = sql.SQL("SELECT set_config(%(setting)s, %(token)s, %(local)s)")
    params = {"setting": SETTING, "token": str(check_token(token)), "local": local}
    return Exchange(query, params, lambda rows: None)


def check_token(token: object) -> int:
    """A fencing token: a whole number of at least 1 (a lease's ``fence``)."""
    if token is None:
        raise ConfigurationError(
            "no fencing token: the lock was taken without fencing (LockContext(fencing=True))"
        )
    text = str(token).strip()
    if isinstance(token, bool) or not text.isdigit() or int(text) < 1 or len(text) > 18:
        raise ConfigurationError(f"fencing token {bounds.escape(text[:40])!r} is not a token")
    return int(text)


# One option carrying the token, as libpq reads PGOPTIONS: words split on white space,
# a backslash keeping the character after it.
_CARRIED = re.compile(r"(?:^|\s)(?:-c\s*|--)" + re.escape(SETTING) + r"=(?:\\.|\S)*")


def pgoptions(existing: str | None, token: int | None) -> str | None:
    """``PGOPTIONS`` for a wrapped command: ``existing`` as it is but for any fencing
    token in it (an outer run's would be stale), with ``-c dislock.fencing_token=TOKEN``
    added when there is a ``token``; None when nothing is left."""
    kept = _CARRIED.sub("", existing or "").strip()
    if token is not None:
        kept = f"{kept} -c {SETTING}={token}".strip()
    return kept or None
