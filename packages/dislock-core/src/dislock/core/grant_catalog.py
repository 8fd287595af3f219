"""A lock table's grants read back from PostgreSQL's catalog: which roles have which
keys (``dislockctl grants``), whether row-level security is on, where the table
lives, and what would let a granted role around its policies."""

from __future__ import annotations

import json
from typing import NamedTuple

from psycopg import sql

from dislock.core.bounds import escape
from dislock.core.exchange import Exchange, Rows, read_flag, select_list
from dislock.core.grants import POLICY_PREFIX, Access, Grant


def _name(table: tuple[str, ...]) -> str:
    return sql.Identifier(*table).as_string(None)


class Qualified(NamedTuple):
    """The row ``qualified`` answers."""

    schema: str
    name: str


def _read_qualified(rows: Rows) -> tuple[str, str] | None:
    found = [Qualified._make(row) for row in rows]
    return (str(found[0].schema), str(found[0].name)) if found else None


def qualified(table: tuple[str, ...]) -> Exchange[tuple[str, str] | None]:
    """``(schema, name)`` of ``table`` as the search path finds it (None: no such
    table), for names that do not depend on the search path."""
    columns = select_list(Qualified._fields, schema=sql.SQL("n.nspname"), name=sql.SQL("c.relname"))
    query = sql.SQL(
        "SELECT {} FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.oid = to_regclass(%(table)s)"
    ).format(columns)
    return Exchange(query, {"table": _name(table)}, _read_qualified)


# What lets a role around the policies, for a row ``r`` of pg_roles and ``c`` of
# pg_class: table-wide UPDATE, TRUNCATE (LOCK TABLE, emptying the table), TRIGGER or
# REFERENCES (code run in other roles' sessions), DELETE without a delete policy,
# MAINTAIN on PostgreSQL 17+ (LOCK TABLE again; older servers do not know it),
# membership in the owner's role, BYPASSRLS; and any INSERT or UPDATE by a role whose
# grant writes nothing by hand, which no policy of dislock's expects.
_POLICY = (
    "EXISTS (SELECT FROM pg_policy p WHERE p.polrelid = c.oid"
    f" AND p.polname = '{POLICY_PREFIX}' || r.rolname || ':{{}}')"
)
_LOOPHOLES = (
    "array_remove(ARRAY["
    " CASE WHEN has_table_privilege(r.oid, c.oid, 'UPDATE') THEN 'UPDATE'"
    f" WHEN NOT {_POLICY.format('write')}"
    " AND has_any_column_privilege(r.oid, c.oid, 'UPDATE') THEN 'UPDATE' END,"
    f" CASE WHEN NOT {_POLICY.format('take')}"
    " AND has_any_column_privilege(r.oid, c.oid, 'INSERT') THEN 'INSERT' END,"
    " CASE WHEN has_table_privilege(r.oid, c.oid, 'TRUNCATE') THEN 'TRUNCATE' END,"
    " CASE WHEN has_table_privilege(r.oid, c.oid, 'TRIGGER') THEN 'TRIGGER' END,"
    " CASE WHEN has_table_privilege(r.oid, c.oid, 'REFERENCES') THEN 'REFERENCES' END,"
    " CASE WHEN EXISTS (SELECT FROM pg_policy p WHERE p.polrelid = c.oid"
    f"  AND p.polname = '{POLICY_PREFIX}' || r.rolname || ':delete') THEN NULL"
    " WHEN has_table_privilege(r.oid, c.oid, 'DELETE') THEN 'DELETE' END,"
    " CASE WHEN current_setting('server_version_num')::int < 170000 THEN NULL"
    " WHEN has_table_privilege(r.oid, c.oid, 'MAINTAIN') THEN 'MAINTAIN' END,"
    " CASE WHEN r.oid <> c.relowner AND pg_has_role(r.oid, c.relowner, 'MEMBER')"
    " THEN 'membership in the owner' END,"
    " CASE WHEN (r.rolbypassrls OR r.rolsuper)"
    "  AND has_table_privilege(r.oid, c.oid, 'SELECT, INSERT, UPDATE, DELETE')"
    " THEN 'BYPASSRLS' END], NULL)"
)


def loopholes(role: str, table: tuple[str, ...]) -> Exchange[list[str]]:
    """What would let ``role`` around its policies on ``table`` (held through
    ``PUBLIC`` or a role it belongs to)."""
    query = sql.SQL(
        "SELECT " + _LOOPHOLES + " AS holes FROM pg_class c, pg_roles r"
        " WHERE c.oid = to_regclass(%(table)s) AND r.rolname = %(role)s"
    )
    params = {"role": role, "table": _name(table)}
    return Exchange(query, params, lambda rows: [str(h) for (holes,) in rows for h in holes or []])


def exempt(role: str, table: tuple[str, ...]) -> Exchange[bool]:
    """Whether ``role`` owns ``table``, is a superuser or bypasses row-level security:
    no grant limits it."""
    query = sql.SQL(
        "SELECT r.rolsuper OR r.rolbypassrls OR c.relowner = r.oid AS exempt"
        " FROM pg_roles r, pg_class c WHERE r.rolname = %(role)s AND c.oid = to_regclass(%(table)s)"
    )
    return Exchange(query, {"role": role, "table": _name(table)}, read_flag)


class Loophole(NamedTuple):
    """A role that can get around the table's policies, and how: the row ``audit``
    answers."""

    role: str
    privileges: tuple[str, ...]


def _read_audit(rows: Rows) -> list[Loophole]:
    return [
        Loophole(str(row.role), tuple(map(str, row.privileges)))
        for row in map(Loophole._make, rows)
    ]


# On the run history, a wrapper role inserts only the columns of a run's start: an
# INSERT of every column would let it choose ids (the next ones, so that other teams'
# runs could not be recorded).
_HISTORY_LOOPHOLES = _LOOPHOLES.replace(
    "array_remove(ARRAY[",
    f"array_remove(ARRAY[ CASE WHEN {_POLICY.format('take')}"
    " AND has_table_privilege(r.oid, c.oid, 'INSERT') THEN 'INSERT' END,",
    1,
)


def audit(table: tuple[str, ...], *, history: bool = False) -> Exchange[list[Loophole]]:
    """Every role that can get around ``table``'s policies (none without row-level
    security, where every role locks every key anyway; not the owner, superusers, or
    ``pg_*`` roles, reported through their members).  ``history``: ``table`` is a
    run history, where a table-wide ``INSERT`` is one more way around."""
    columns = select_list(Loophole._fields, role=sql.SQL("rolname"), privileges=sql.SQL("holes"))
    holes = _HISTORY_LOOPHOLES if history else _LOOPHOLES
    query = sql.SQL(
        "SELECT {} FROM (SELECT r.rolname, " + holes + " AS holes"
        " FROM pg_class c, pg_roles r"
        " WHERE c.oid = to_regclass(%(table)s) AND c.relrowsecurity"
        " AND r.oid <> c.relowner AND NOT r.rolsuper"
        " AND r.rolname NOT LIKE 'pg\\_%%') audited"
        " WHERE holes <> '{{}}' ORDER BY rolname"
    ).format(columns)
    return Exchange(query, {"table": _name(table)}, _read_audit)


def describe(loophole: Loophole, table: tuple[str, ...]) -> str:
    """One line: what ``loophole.role`` holds and how to take it away (statements
    that run as printed: names quoted as identifiers)."""
    name, who = _name(table), sql.Identifier(loophole.role)
    privileges = [p for p in loophole.privileges if p.isupper() and p != "BYPASSRLS"]
    fixes = []
    if privileges:
        fixes.append(f"REVOKE {', '.join(privileges)} ON {name} FROM {who.as_string(None)}")
    if "membership in the owner" in loophole.privileges:
        fixes.append(f"REVOKE <the owner of {name}> FROM {who.as_string(None)}")
    if "BYPASSRLS" in loophole.privileges:
        fixes.append(f"ALTER ROLE {who.as_string(None)} NOBYPASSRLS")
    return escape(
        f"loophole: role '{loophole.role}' has {', '.join(loophole.privileges)} on"
        f" {'.'.join(table)}, which no policy limits: {'; '.join(fixes)} (or take it from"
        " the role or PUBLIC it comes through)"
    )


class PolicyRow(NamedTuple):
    """The row ``grants_on`` answers: a role's read policy and its comment."""

    policy: str
    comment: str | None


def _read_grants(rows: Rows) -> list[Grant]:
    found = (parse_grant(str(row.policy), row.comment) for row in map(PolicyRow._make, rows))
    return [grant for grant in found if grant is not None]


def grants_on(table: tuple[str, ...]) -> Exchange[list[Grant]]:
    """The dislock grants on ``table``, by role, from each read policy's comment (one
    that cannot be read is left out)."""
    columns = select_list(
        PolicyRow._fields, policy=sql.SQL("p.polname"), comment=sql.SQL("d.description")
    )
    query = sql.SQL(
        "SELECT {} FROM pg_policy p"
        " LEFT JOIN pg_description d ON d.classoid = 'pg_policy'::regclass AND d.objoid = p.oid"
        " WHERE p.polrelid = to_regclass(%(table)s) AND p.polname LIKE 'dislock:%%:read'"
        " ORDER BY p.polname"
    ).format(columns)
    return Exchange(query, {"table": _name(table)}, _read_grants)


def parse_grant(policy: str, comment: str | None) -> Grant | None:
    """A read policy and its comment as a grant (None for a comment it cannot read)."""
    role = policy[len(POLICY_PREFIX) : -len(":read")]
    try:
        described = json.loads(comment or "")
        most = described.get("max_keys")
        budget = described.get("max_history_mib")
        return Grant(
            role,
            Access(described["access"]),
            tuple(map(str, described["keys"])),
            None if most is None else int(most),
            None if not budget else int(budget),
            bool(described.get("plain_writes", False)),
            described.get("protocol") == 1,
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def secured(table: tuple[str, ...]) -> Exchange[bool]:
    """Whether row-level security is on for ``table`` (False: no such table)."""
    query = sql.SQL(
        "SELECT relrowsecurity AS secured FROM pg_class WHERE oid = to_regclass(%(table)s)"
    )
    return Exchange(query, {"table": _name(table)}, read_flag)
