"""One-line explanations of database failures, for operators reading cron mail.

Errors are classified by SQLSTATE, not by the driver's exception classes; every
message is scrubbed of the URL's secrets.  A refused statement (SQLSTATE 42501) is
explained by what the command needs (``PRIVILEGES``) and what the role was found to
lack (``privilege_probe``), not by the server's message, which is translated and
names no privilege; where row-level security limits the role (``row_security``, asked of
the server, which also tells a row not found from one the role may not see), the fix is a
``dislockctl grant`` (``grant_line``), not a ``GRANT``, and never one giving a team a key
another role's grant covers (``denial_hint``).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import NamedTuple

from psycopg import sql

from dislock.core.dsn import one_line, redact_dsn, scrub
from dislock.core.errors import DatabaseUnreachableError
from dislock.core.exchange import Exchange, Rows, select_list
from dislock.core.grant_catalog import parse_grant
from dislock.core.grants import OPERATOR, POLICY_PREFIX, READER, WRAPPER, Grant
from dislock.core.patience import passing_answer
from dislock.core.table import create_table_sql

_UNDEFINED_TABLE = "42P01"
_UNDEFINED_COLUMN = "42703"
_UNDEFINED_SCHEMA = "3F000"
_INSUFFICIENT_PRIVILEGE = "42501"


def describe_database_error(error: BaseException, *, table_parts: tuple[str, ...], url: str) -> str:
    """What went wrong, what to do about it, in one line and without secrets."""
    table = ".".join(table_parts)
    # Only the driver's own words can carry a secret (libpq quotes what it parsed);
    # scrubbing just them keeps a short password from mangling the rest.
    detail = scrub(one_line(str(error)), url) or type(error).__name__
    sqlstate = getattr(error, "sqlstate", None)
    if isinstance(error, DatabaseUnreachableError):
        return _unreachable(error, url)
    if sqlstate in (_UNDEFINED_TABLE, _UNDEFINED_SCHEMA):
        return (
            f"lock table {table} does not exist; create it with `dislockctl URL_VARIABLE init`"
            f" or: {create_table_sql(table_parts)}"
        )
    if sqlstate == _UNDEFINED_COLUMN and "fence" in detail:
        return (
            f"lock table {table} has no fence column, which fencing tokens need; add it with "
            "`dislockctl URL_VARIABLE init --fencing`"
        )
    if sqlstate == _UNDEFINED_COLUMN:
        return (
            f"lock table {table} lacks a column dislock needs ({detail}); it must have "
            "key text PRIMARY KEY, value text NOT NULL, expire_at timestamptz NOT NULL"
        )
    if sqlstate == _INSUFFICIENT_PRIVILEGE:
        # Only serve gets here (the commands and the wrapper ask what the role lacks:
        # ``describe_denial``), and it reads.
        return (
            f"permission denied on lock table {table} ({detail}); reading it needs SELECT on"
            " it (where the table has grants: dislockctl URL_VARIABLE grant ROLE --reader,"
            " see docs/security.md)"
        )
    if passing_answer(error):  # read-only, and still so once the patience was spent
        return f"the database is read-only ({detail}); point the URL at the primary, not a replica"
    if sqlstate is None and type(error).__name__ in ("OperationalError", "ConnectionTimeout"):
        return f"cannot connect to the database ({redact_dsn(url)}): {detail}"
    return f"{type(error).__name__}: {detail}"


LOCK_TABLE = "lock"
HISTORY_TABLE = "history"

PRIVILEGES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "dislock": ((LOCK_TABLE, ("SELECT", "INSERT", "UPDATE")),),
    "ls": ((LOCK_TABLE, ("SELECT",)),),
    "check": ((LOCK_TABLE, ("SELECT",)),),
    "release": ((LOCK_TABLE, ("SELECT", "UPDATE")),),
    "pause": ((LOCK_TABLE, ("SELECT", "INSERT", "UPDATE")),),
    "resume": ((LOCK_TABLE, ("SELECT", "DELETE")),),
    "history": ((HISTORY_TABLE, ("SELECT",)), (LOCK_TABLE, ("SELECT",))),
    "history --prune-older-than": ((HISTORY_TABLE, ("SELECT", "DELETE")),),
    "missed": ((HISTORY_TABLE, ("SELECT",)), (LOCK_TABLE, ("SELECT",))),
    # Granting is the table owner's (no privilege makes a role one): a role that has
    # SELECT gets the server's words ("must be owner of table").
    "grant": ((LOCK_TABLE, ("SELECT",)),),
    "revoke": ((LOCK_TABLE, ("SELECT",)),),
    "grants": ((LOCK_TABLE, ("SELECT",)),),
}
"""What each command's statements need on which of its tables (``SELECT`` also for
the ``WHERE`` and ``RETURNING`` of a write).  The wrapper's history writes are not
listed: a failing one is a warning, never a failed run."""


OPERATOR_COMMANDS = frozenset({"pause", "resume", "release", "history --prune-older-than"})
"""What a grant gives with ``--operator`` only."""
READ_COMMANDS = frozenset({"ls", "check", "history", "missed"})
"""What a reader's grant (``--reader``) is enough for, as every other grant is."""


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


def grant_line(command: str, security: RowSecurity, key: str | None) -> str | None:
    """The ``dislockctl grant`` that gives the role what ``command`` needs on ``key``,
    where row-level security limits it; None elsewhere (a grant would turn it on for
    the whole table, shutting out every role of a broad ``GRANT``) and for the owner's
    commands.  A grant replaces the role's earlier one, so it keeps that grant's keys
    (and its access, for a reader's command) and adds ``key`` if none covers it."""
    if not security.limited:
        return None
    granted = security.grant
    if command in READ_COMMANDS:
        access = READER if granted is None else granted.access
    elif command in OPERATOR_COMMANDS:
        access = OPERATOR
    elif command == "dislock":
        access = OPERATOR if granted is not None and granted.access == OPERATOR else WRAPPER
    else:
        return None
    keys: list[str] = []
    if access != READER:
        if granted is not None:
            keys = list(granted.keys)
        if key is not None and not matches(keys, key):
            keys.append(key)
        keys = keys or ["PATTERN"]
    flag = {WRAPPER: "", OPERATOR: " --operator", READER: " --reader"}[access]
    patterns = "".join(f" --keys {_single_quoted(k)}" for k in keys)
    return f"dislockctl URL_VARIABLE grant {shlex.quote(security.role)}{flag}{patterns}"


def denial_hint(
    command: str, security: RowSecurity, key: str | None, grants: Sequence[Grant]
) -> str | None:
    """What a refusal where row-level security limits the role advises (None: no grant
    would help): for a key another role's grant covers (among ``grants``, the table's)
    and the role's own does not, whose key it is; else the grant the table's owner gives."""
    own = security.grant
    if security.limited and key is not None and (own is None or not matches(own.keys, key)):
        owners = sorted(
            grant.role
            for grant in grants
            if grant.role != security.role and grant.access != READER and matches(grant.keys, key)
        )
        if owners:
            who = f"role {owners[0]}" if len(owners) == 1 else f"roles {', '.join(owners)}"
            return f"{key!r} is a key of {who}: ask that team, or the table's owner, to run it"
    line = grant_line(command, security, key)
    return None if line is None else f"as the table's owner, {line}"


def _single_quoted(word: str) -> str:
    """Quoted for the shell, as the docs show patterns (``'billing-*'``)."""
    return "'" + word.replace("'", "'\"'\"'") + "'"


class Need(NamedTuple):
    """One privilege a command needs: ``USAGE`` on a schema, or a table privilege."""

    privilege: str
    kind: str
    """``schema`` or ``table``."""
    name: str
    """As messages show it (``ops.locks``)."""
    identifier: str
    """As ``has_*_privilege`` takes it: a table's name quoted, a schema's as it is."""
    schema: str | None = None


def needs_of(command: str, tables: Mapping[str, tuple[str, ...] | None]) -> list[Need]:
    """The privileges ``command`` needs on ``tables`` (by role: ``LOCK_TABLE``,
    ``HISTORY_TABLE``): ``USAGE`` on each named schema, then the table privileges."""
    needs: list[Need] = []
    for role, privileges in PRIVILEGES.get(command, ()):
        parts = tables.get(role)
        if parts is None:
            continue
        if len(parts) == 2:
            schema = Need("USAGE", "schema", parts[0], parts[0])
            if schema not in needs:
                needs.append(schema)
        identifier = sql.Identifier(*parts).as_string(None)
        schema_of = parts[0] if len(parts) == 2 else None
        needs += [Need(p, "table", ".".join(parts), identifier, schema_of) for p in privileges]
    return needs


def privilege_probe(needs: Sequence[Need]) -> tuple[str, list[str]]:
    """A query answering ``current_user`` and, per need, whether the role has it.  A table
    is only looked up once its schema's ``USAGE`` is known (naming a table in a schema
    the role may not use is itself refused): NULL for those."""
    checks: list[str] = []
    params: list[str] = []
    for need in needs:
        if need.kind == "schema":
            checks.append("has_schema_privilege(%s::text, 'USAGE')")
            params.append(need.identifier)
            continue
        check = "has_table_privilege(%s::text, %s::text)"
        if need.schema is not None:
            check = f"CASE WHEN has_schema_privilege(%s::text, 'USAGE') THEN {check} END"
            params.append(need.schema)
        checks.append(check)
        params += [need.identifier, need.privilege]
    return (
        f"SELECT current_user::text AS role, ARRAY[{', '.join(checks)}]::bool[] AS granted",
        params,
    )


def describe_denial(
    program: str,
    *,
    missing: Sequence[Need],
    role: str | None,
    table: str,
    detail: str,
    fix: str | None = None,
) -> str:
    """The one line for a refused statement: the privileges the role lacks, by object, or,
    when it lacks none the command needs (a policy, a column privilege), what the
    server said about ``table``; ``fix`` (``denial_hint``) instead of a ``GRANT``."""
    who = f"role {role}" if role else "this role"
    prefix = f"{program}: " if program else ""
    see = None
    if fix is not None:
        see = f"row-level security is on: {fix}, see docs/security.md"
    if not missing:
        see = see or "see docs/security.md"
        return f"{prefix}permission denied on table {table} for {who}: {detail} ({see})"
    by_object: dict[tuple[str, str], list[str]] = {}
    for need in missing:
        by_object.setdefault((need.kind, need.name), []).append(need.privilege)
    lacking = ", ".join(
        f"{_and(privileges)} on {kind} {name}" for (kind, name), privileges in by_object.items()
    )
    see = see or f"grant {'it' if len(missing) == 1 else 'them'}, see docs/security.md"
    return f"{prefix}permission denied: {lacking} for {who} ({see})"


def _and(words: Sequence[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _unreachable(error: DatabaseUnreachableError, url: str) -> str:
    """A wrapper that gave up connecting: for how long, and which slot went by if the
    slot's end made it give up."""
    detail = scrub(error.detail, url)
    where = redact_dsn(url)
    tries = f"{error.attempts} attempt{'' if error.attempts == 1 else 's'}"
    lost = error.lost_answer_of
    # The connection broke under the acquiring statement: "cannot connect" would
    # send the operator looking at the wrong thing.
    lost_words = (
        ""
        if lost is None
        else f", after the connection was lost during the acquisition of {lost}"
        " (whether it was taken is unknown; a row it took expires by itself)"
    )
    if error.slot_end is not None:
        return (
            f"the schedule slot of {error.lock_key!r} ending {error.slot_end.isoformat()}"
            f" ended while the database was unreachable for {error.unreachable_for:.1f} s"
            f" ({where}){lost_words}; the command did not run: {detail}"
        )
    if lost is not None:
        return (
            f"lost the connection to the database ({where}) during the acquisition of {lost},"
            f" and it stayed unreachable for {error.unreachable_for:.1f} s, {tries}"
            f" (LOCK_CONNECT_PATIENCE_SECONDS={error.patience:g}); whether it was"
            f" taken is unknown (a row it took expires by itself): {detail}"
        )
    return (
        f"cannot connect to the database ({where}): unreachable for"
        f" {error.unreachable_for:.1f} s, {tries}"
        f" (LOCK_CONNECT_PATIENCE_SECONDS={error.patience:g}): {detail}"
    )
