"""Database URLs: connection keyword arguments, and a display form without secrets.

A DSN may carry a password in its userinfo, in ``password=`` or in a query
parameter.  Nothing here ever returns it; error text from parsing is replaced
too, because libpq's parse errors quote the offending string verbatim.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from psycopg.conninfo import conninfo_to_dict

from dislock.core.errors import ConfigurationError

_SHOWN_KEYS = ("user", "host", "port", "dbname")
APPLICATION_NAME = "dislock"


def parse_dsn(url: str) -> dict[str, Any]:
    """A URL or ``key=value`` DSN's parameters; a refusal never repeats the input."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigurationError("database URL is empty")
    try:
        params = conninfo_to_dict(url)
    except Exception:
        raise ConfigurationError(
            "database URL cannot be parsed (contents not shown: they may hold a password)"
        ) from None
    # libpq parses any port and refuses it only when connecting, which would read as an
    # unreachable server (exit 1) rather than the typo it is.  A list's empty entries
    # are the default port; the port is not shown, as it may be a misplaced password.
    for entry in str(params.get("port") or "").split(","):
        port = entry.strip()
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ConfigurationError(
                "database URL's port is not a number from 1 to 65535 "
                "(contents not shown: they may hold a password)"
            )
    return params


def redact_dsn(url: str) -> str:
    """A human-readable description of ``url`` that contains no secret."""
    try:
        params = parse_dsn(url)
    except ConfigurationError:
        return "<unparseable database URL>"
    shown = [f"{key}={params[key]}" for key in _SHOWN_KEYS if params.get(key)]
    if params.get("password"):
        shown.append("password=***")
    return " ".join(shown) if shown else "<default libpq connection>"


_USED: set[str] = set()
"""The passwords this process's connections used (``learn_password``)."""


def learn_password(password: str | None) -> None:
    """Remember the password a connection used, ``conn.info.password``: libpq's own
    pick from the URL, ``PGPASSWORD``, the passfile line for the connection's host,
    port, database and user, or the service file, so that it is scrubbed too."""
    if password:
        _USED.add(password)


def secrets_in(url: str) -> list[str]:
    """The secret strings ``url`` carries, and those libpq may send beside it
    (``PGPASSWORD``, ``PGSSLPASSWORD``, ``learn_password``'s), for scrubbing them out."""
    try:
        params = parse_dsn(url)
        found = [str(params[key]) for key in ("password", "sslpassword") if params.get(key)]
    except ConfigurationError:
        # Unparseable: the whole string may be a secret.
        found = [url] if url else []
    found += [os.environ.get(name, "") for name in ("PGPASSWORD", "PGSSLPASSWORD")]
    return sorted({secret for secret in (*found, *_USED) if secret})


GLUED_LENGTH = 6
"""A secret this long or longer is scrubbed wherever it occurs, glued to other text too;
a shorter one only as a whole word (a password ``e`` would otherwise eat words)."""


def _written(secret: str) -> str:
    """A pattern for ``secret`` as text may carry it: each character as it is or
    percent-encoded, as a URL writes it, in either case (``%2f``, ``%2F``)."""
    forms = []
    for char in secret:
        encoded = "".join(f"%{byte:02x}" for byte in char.encode("utf-8", "surrogatepass"))
        forms.append(f"(?:{re.escape(char)}|(?i:{encoded}))")
    return "".join(forms)


def scrub(text: str, url: str) -> str:
    """``text`` with every secret of ``url`` replaced by ``***``: raw or percent-encoded,
    and glued to other text (``xp%40ssw0rdy``) from ``GLUED_LENGTH`` characters on."""
    for secret in sorted(secrets_in(url), key=len, reverse=True):
        pattern = _written(secret)
        if len(secret) < GLUED_LENGTH:
            pattern = rf"(?<![A-Za-z0-9]){pattern}(?![A-Za-z0-9])"
        text = re.sub(pattern, "***", text)
    return text


def one_line(text: str) -> str:
    """A driver's or a server's message, often several lines, as one: each line joined
    with ``". "`` where it starts a sentence, ``"; "`` where it does not, a space
    after a line that ends in punctuation."""
    joined = ""
    for line in text.splitlines():
        line = " ".join(line.split())
        if not line:
            continue
        if not joined or joined[-1] in ".,:;!?":
            joined += f" {line}" if joined else line
        else:
            joined += f". {line}" if line[0].isupper() else f"; {line}"
    return joined


def error_line(error: BaseException, url: str) -> str:
    """``error`` as one line, ``Type: text``, scrubbed of ``url``'s secrets: a server's
    or a trigger's message may quote anything, the password included."""
    return f"{type(error).__name__}: {scrub(one_line(str(error)), url)}"


def message_line(error: BaseException, url: str) -> str:
    """What went wrong, in one line scrubbed of ``url``'s secrets: a server error's
    primary message alone (not the statement it quotes), else ``one_line``'s."""
    primary = getattr(getattr(error, "diag", None), "message_primary", None)
    return scrub(one_line(primary if isinstance(primary, str) and primary else str(error)), url)


def connection_kwargs(
    url: str, connect_timeout_seconds: float, *, attempt_timeout: float | None = None
) -> dict[str, Any]:
    """Keyword arguments for ``psycopg.[Async]Connection.connect``.

    Autocommit keeps each lock operation in its own transaction, so ``NOW()`` is
    the time of that statement; ``prepare_threshold=None`` keeps psycopg from
    preparing statements, which PgBouncer in transaction pooling cannot route
    (``dislock.core.preparing``).  The URL's timeout and application name win,
    but not over ``attempt_timeout``, one patient try's (already bounded by the URL's).
    """
    params = parse_dsn(url)
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": None}
    if attempt_timeout is not None:
        kwargs["connect_timeout"] = max(1, math.ceil(attempt_timeout))
    elif "connect_timeout" not in params:
        kwargs["connect_timeout"] = max(1, math.ceil(connect_timeout_seconds))
    if "application_name" not in params:
        kwargs["application_name"] = APPLICATION_NAME
    return kwargs


def longest_connect_timeout(url: str, connect_timeout_seconds: float) -> float:
    """The longest one host may take to connect: the URL's ``connect_timeout`` if it
    sets a usable one, else ``connect_timeout_seconds``."""
    value = parse_dsn(url).get("connect_timeout")
    try:
        seconds = float(value) if value is not None else 0.0
    except ValueError:
        seconds = 0.0  # psycopg reports it when connecting
    return seconds if seconds > 0 and math.isfinite(seconds) else connect_timeout_seconds


def host_count(url: str) -> int:
    """How many hosts a connection to ``url`` may try, one after the other."""
    params = parse_dsn(url)
    hosts = str(params.get("host") or params.get("hostaddr") or "")
    return max(1, len(hosts.split(",")))
