"""How many lock keys a granted role may hold in a table (``dislockctl grant --max-keys``;
what counts, and why: docs/security.md).

Each granted role's quota is a metadata row ``dislock:quota:<role>`` that only
``dislockctl grant`` writes, and a trigger beside the table refuses the row of a new key
beyond it.  It fires **after an insert only** (a new key, or a key's first lease slot or
pause), so an acquisition of a key that has its row never reaches it.  (An ``INSERT``
policy could not do the same: PostgreSQL checks it on every ``INSERT … ON CONFLICT``,
even one that ends in an update.)  It runs as the inserting role, under that role's
row-level security, so it counts the keys that have rows under its grant (within its
scope, ``dislock.core.failover``); the table's owner, superusers and roles that bypass
row-level security have no quota.  Two new keys inserted at the same instant may both
pass at the limit.
"""

from __future__ import annotations

from psycopg import sql

from dislock.core.failover import SCOPE_KEY_PREFIX
from dislock.core.limits import metadata_row
from dislock.core.policy_functions import PINNED, beside

QUOTA_KEY_PREFIX = "dislock:quota:"
"""Metadata rows ``<prefix><role>``: ``value`` is the most keys the role may hold."""

DEFAULT_MAX_KEYS = 1000
"""A granted role's quota unless ``--max-keys`` says otherwise."""

OVER_QUOTA = "may hold at most"
"""Words of the trigger's refusal that the clients recognise it by."""

TRIGGER = "dislock_key_quota"

_LOCK_KEY = r"substring(key from '^[^:]*:[^:]*:(.*)$')"
"""The lock key of a row key (``cronjob-lock:<mode>:<lock key>``)."""


def quota_trigger(table_parts: tuple[str, ...]) -> list[sql.Composed]:
    """The function and the trigger that hold each granted role to its quota."""
    table = sql.Identifier(*table_parts)
    shown = ".".join(table_parts)
    body = sql.SQL(
        "DECLARE most int8; scope text; held int8;"
        " mine text := substring(NEW.key from '^[^:]*:[^:]*:(.*)$');"
        " BEGIN"
        " IF starts_with(NEW.key, 'dislock:') THEN RETURN NULL; END IF;"
        # No policy binds the owner (or its members), a superuser or a role that
        # bypasses row-level security: no quota either (a superuser is a member of
        # every role, whose quotas it would otherwise inherit).
        " IF EXISTS (SELECT FROM pg_roles AS r, pg_class AS c"
        " WHERE r.rolname = current_user AND c.oid = TG_RELID"
        " AND (r.rolsuper OR r.rolbypassrls OR pg_has_role(r.oid, c.relowner, 'MEMBER')))"
        " THEN RETURN NULL; END IF;"
        # The smallest quota of the role and of the roles it is a member of: a login
        # role in a team's group role is held to the group's.
        " SELECT min(q.value::int8) INTO most FROM {table} AS q"
        ' WHERE q.key IN (SELECT {quota} || a.rolname::text COLLATE "default"'
        " FROM pg_roles AS a WHERE pg_has_role(current_user, a.oid, 'MEMBER'));"
        " IF most IS NULL THEN RETURN NULL; END IF;"
        # A key that has a row already (its other strategy, another slot, its
        # pause) is not one more key, whatever the count.
        " IF EXISTS (SELECT FROM {table} WHERE {lock_key} = mine AND key <> NEW.key)"
        " THEN RETURN NULL; END IF;"
        " SELECT value INTO scope FROM {table}"
        ' WHERE key = {scope_prefix} || current_user::text COLLATE "default";'
        " SELECT count(DISTINCT {lock_key}) INTO held FROM {table}"
        " WHERE NOT starts_with(key, 'dislock:') AND {lock_key} ~ coalesce(scope, '');"
        " IF held > most THEN"
        " RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', MESSAGE = format("
        "'role %L ' || {over} || ' %s %s in %s: key %L would be one more'"
        " || ' (its dislockctl grant again with --max-keys N raises the limit)',"
        " current_user::text, most, CASE WHEN most = 1 THEN 'key' ELSE 'keys' END, {shown},"
        " mine);"
        " END IF;"
        " RETURN NULL;"
        " END"
    ).format(
        table=table,
        quota=sql.Literal(QUOTA_KEY_PREFIX),
        scope_prefix=sql.Literal(SCOPE_KEY_PREFIX),
        lock_key=sql.SQL(_LOCK_KEY),
        over=sql.Literal(OVER_QUOTA),
        shown=sql.Literal(shown),
    )
    function = beside(table_parts, "_dislock_quota")
    return [
        sql.SQL(
            "CREATE OR REPLACE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql {pinned} AS {body}"
        ).format(fn=function, pinned=PINNED, body=sql.Literal(body.as_string(None))),
        sql.SQL(
            "CREATE OR REPLACE TRIGGER {name} AFTER INSERT ON {table}"
            " FOR EACH ROW EXECUTE FUNCTION {fn}()"
        ).format(name=sql.Identifier(TRIGGER), table=table, fn=function),
    ]


def set_quota(table_parts: tuple[str, ...], role: str, max_keys: int) -> sql.Composed:
    """Record ``role``'s quota; ``0`` removes it (no limit)."""
    if max_keys <= 0:
        return sql.SQL("DELETE FROM {table} WHERE key = {key}").format(
            table=sql.Identifier(*table_parts), key=sql.Literal(QUOTA_KEY_PREFIX + role)
        )
    return metadata_row(table_parts, QUOTA_KEY_PREFIX + role, str(max_keys))
