"""A lock statement refused by a role's grant, in the operator's words: which role
may not lock which key, and where to look.

Every acquisition imports this module, and almost none is refused: what only a
refusal needs (the quota trigger's words, ``getpass``) is imported when one comes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from psycopg.conninfo import conninfo_to_dict

from dislock.core.bounds import escape
from dislock.core.errors import KeyNotGrantedError
from dislock.core.kinds import parse_row_key

NO_GRANT = "no grant covers that key"
"""Words of the lock functions' refusal (``dislock.core.protocol``) that it is known by."""


def refused(
    error: BaseException, *, url: str, key: str, table_parts: Sequence[str]
) -> KeyNotGrantedError | None:
    """The error to raise for a lock statement on the row ``key`` that row-level
    security refused, else None.  It names the lock key and the strategy, as
    ``LOCK_KEY``, ``LOCK_STRATEGY`` and ``dislockctl grant --keys`` do, not the row key.

    The server reports it with SQLSTATE 42501, the same as a missing privilege; the
    two are told apart by the message (untranslated only under an English
    ``lc_messages``: elsewhere the refusal is reported as a missing privilege)."""
    if getattr(error, "sqlstate", None) != "42501":
        return None
    from dislock.core.key_quota import OVER_QUOTA

    diag = getattr(error, "diag", None)
    message = getattr(diag, "message_primary", None) or str(error)
    if OVER_QUOTA in message:  # dislock.core.key_quota's trigger, in its own words
        return KeyNotGrantedError(escape(message))
    if "row-level security" not in message and NO_GRANT not in message:
        return None
    kind, lock_key, _ = parse_row_key(key)
    what = repr(lock_key) if kind is None else f"{lock_key!r} (strategy {kind.name})"
    return KeyNotGrantedError(
        f"role {role_of(url)!r} may not lock {what} in {'.'.join(table_parts)}: {NO_GRANT}"
        # Not "dislockctl grant adds one": the key may be another team's (#62).
        " (dislockctl grants says whose key it is; a key of this team's, the table's owner"
        " adds to its grant with dislockctl grant)"
    )


def role_of(url: str) -> str:
    """The role a URL logs in as, as libpq picks it (the URL's user, ``PGUSER``, or the
    operating-system user)."""
    try:
        user = conninfo_to_dict(url).get("user")
    except Exception:
        user = None
    if user or os.environ.get("PGUSER"):
        return str(user or os.environ["PGUSER"])
    import getpass

    return getpass.getuser()
