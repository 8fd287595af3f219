"""Validation rules shared by ``LockContext``, the locks and the CLI environment: each
refusal is one line naming the setting and the value it was given."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from dislock.core.bounds import escape
from dislock.core.errors import ConfigurationError
from dislock.core.kinds import LEASE as LEASE
from dislock.core.kinds import NAMES
from dislock.core.kinds import SCHEDULE as SCHEDULE

# PostgreSQL truncates longer identifiers silently, which could make two
# configured names point at one table.
MAX_IDENTIFIER_BYTES = 63


def normalize_strategies(strategies: str | Iterable[str]) -> tuple[str, ...]:
    """Lock strategies (``"schedule,lease"`` or names) in acquisition order."""
    names = strategies.split(",") if isinstance(strategies, str) else list(strategies)
    chosen: set[str] = set()
    for raw in names:
        if not isinstance(raw, str):
            raise ConfigurationError(f"lock strategy must be a string, got {raw!r}")
        name = raw.strip().lower()
        if name not in NAMES:
            raise ConfigurationError(
                f"unknown lock strategy {raw.strip()!r}: expected 'schedule', 'lease' "
                "or 'schedule,lease'"
            )
        chosen.add(name)
    if not chosen:
        raise ConfigurationError("no lock strategy given: expected 'schedule', 'lease' or both")
    return tuple(name for name in NAMES if name in chosen)


def check_table_parts(parts: Sequence[str]) -> tuple[str, ...]:
    """``[table]`` or ``[schema, table]``; every part a usable identifier."""
    if isinstance(parts, str) or not isinstance(parts, Sequence):
        raise ConfigurationError(
            f"table_parts must be a list like ['key_value'] or ['schema', 'key_value'], "
            f"got {parts!r}"
        )
    result = tuple(parts)
    if not 1 <= len(result) <= 2:
        raise ConfigurationError(
            f"table_parts must name a table or schema.table (1 or 2 parts), got {list(result)!r}"
        )
    for part in result:
        check_identifier(part)
    return result


def check_identifier(part: object) -> str:
    if not isinstance(part, str) or not part:
        raise ConfigurationError(f"table name parts must be non-empty strings, got {part!r}")
    if "\x00" in part:
        raise ConfigurationError(f"table name part {part!r} contains a NUL character")
    if escape(part) != part:
        raise ConfigurationError(
            f"table name part {part!r} contains control or invisible characters"
        )
    if "%" in part:
        # psycopg reads % in a statement's text as a placeholder, quoted identifiers too.
        raise ConfigurationError(f"table name part {part!r} contains '%', which is not supported")
    if len(part.encode()) > MAX_IDENTIFIER_BYTES:
        raise ConfigurationError(
            f"table name part {part!r} is longer than PostgreSQL's "
            f"{MAX_IDENTIFIER_BYTES}-byte identifier limit"
        )
    return part


def parse_table(value: str) -> tuple[str, ...]:
    """``"key_value"`` or ``"schema.key_value"`` as table parts (names are taken
    literally and quoted later, so they keep their case)."""
    text = value.strip()
    if not text:
        raise ConfigurationError("table name is empty")
    parts = text.split(".")
    if len(parts) > 2:
        raise ConfigurationError(f"table must be 'table' or 'schema.table', got {value!r}")
    return check_table_parts(parts)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def parse_flag(name: str, value: str) -> bool:
    """An on/off setting: 1/true/yes/on or 0/false/no/off (empty is off)."""
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigurationError(
        f"{name} must be one of 1/true/yes/on or 0/false/no/off, got {value!r}"
    )


def parse_auto_flag(name: str, value: str) -> bool | None:
    """``auto`` (or empty) as None, else an on/off setting like ``parse_flag``."""
    if value.strip().lower() in ("", "auto"):
        return None
    try:
        return parse_flag(name, value)
    except ConfigurationError:
        raise ConfigurationError(
            f"{name} must be auto, 1/true/yes/on or 0/false/no/off, got {value!r}"
        ) from None
