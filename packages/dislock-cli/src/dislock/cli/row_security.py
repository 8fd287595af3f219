"""How row-level security limits the connected role on the lock table
(``row_security``), for the one line that explains a refusal or a row not found;
and whether a grant's key patterns cover a key (``matches``)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

from psycopg import sql

from dislock.core.exchange import Exchange, Rows, select_list
from dislock.core.grant_catalog import parse_grant
from dislock.core.grants import POLICY_PREFIX, READER, Grant


class SecurityRow(NamedTuple):
    """The row ``row_security`` answers."""

    role: str
    limited: bool
    comment: str | None
    """The description of the role's read policy: its grant (``parse_grant``)."""


class RowSecurity(NamedTuple):
    """How row-level security limits the connected role on the lock table: whether
    dislock's grants do (on for the table, the role neither owner, superuser nor
    bypassing it, and the policies ``dislockctl grant``'s or none), and its grant there."""

    role: str
    limited: bool
    grant: Grant | None

    def hides(self, lock_key: str) -> bool:
        """Whether ``lock_key``'s rows may exist without the role seeing them."""
        if not self.limited:
            return False
        if self.grant is None:
            return True
        return self.grant.access != READER and not matches(self.grant.keys, lock_key)


def matches(patterns: Sequence[str], lock_key: str) -> bool:
    """Whether a grant's key patterns (an exact key, or a prefix ending in ``*``)
    cover ``lock_key``."""
    return any(lock_key == p or (p.endswith("*") and lock_key.startswith(p[:-1])) for p in patterns)


@lru_cache(maxsize=16)
def _security_query(table_parts: tuple[str, ...]) -> sql.Composed:
    # From the catalog, which every role may read: no privilege on the table, nor
    # USAGE on its schema, is needed to ask (to_regclass would need USAGE).
    if len(table_parts) == 2:
        table = sql.SQL(
            "(SELECT t.oid FROM pg_class t JOIN pg_namespace n ON n.oid = t.relnamespace"
            " WHERE n.nspname = {} AND t.relname = {})"
        ).format(*map(sql.Literal, table_parts))
    else:
        table = sql.SQL("to_regclass({})").format(
            sql.Literal(sql.Identifier(*table_parts).as_string(None))
        )
    columns = select_list(
        SecurityRow._fields,
        role=sql.SQL("current_user::text"),
        limited=sql.SQL(
            "c.relrowsecurity AND NOT (r.rolsuper OR r.rolbypassrls"
            " OR pg_has_role(c.relowner, 'USAGE'))"
            # Policies of the DBA's own, and none of dislock's: not dislockctl grant's table.
            " AND (EXISTS (SELECT FROM pg_policy q WHERE q.polrelid = c.oid"
            " AND starts_with(q.polname, %(prefix)s::text))"
            " OR NOT EXISTS (SELECT FROM pg_policy q WHERE q.polrelid = c.oid))"
        ),
        comment=sql.SQL(
            "(SELECT d.description FROM pg_policy p JOIN pg_description d"
            " ON d.classoid = 'pg_policy'::regclass AND d.objoid = p.oid"
            " WHERE p.polrelid = c.oid AND p.polname = %(prefix)s::text || current_user || ':read')"
        ),
    )
    return sql.SQL(
        "SELECT {columns}"
        " FROM pg_class c JOIN pg_roles r ON r.rolname = current_user WHERE c.oid = {table}"
    ).format(columns=columns, table=table)


def row_security(table_parts: tuple[str, ...]) -> Exchange[RowSecurity | None]:
    """How row-level security limits the connected role on the lock table (None: no such table)."""
    return Exchange(_security_query(table_parts), {"prefix": POLICY_PREFIX}, _read_security)


def _read_security(rows: Rows) -> RowSecurity | None:
    for found in map(SecurityRow._make, rows):
        policy = f"{POLICY_PREFIX}{found.role}:read"
        grant = None if found.comment is None else parse_grant(policy, str(found.comment))
        return RowSecurity(str(found.role), bool(found.limited), grant)
    return None
