"""The bounds of the numeric settings: one rule per setting, the same words everywhere,
documented; and the limits of keys and of text shown on one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dislock import ConfigurationError
from dislock.cli.wrapper.command import help_text
from dislock.cli.wrapper.settings import read_wrapper_settings
from dislock.core.bounds import (
    MAX_KEY_BYTES,
    SHOWN_CHARS,
    check_key,
    check_reason,
    clip,
    escape,
    printable,
)
from dislock.core.setting import Setting
from dislock.core.variables import NUMBERS, TTL

DOCS = Path(__file__).parents[2] / "docs" / "cli.md"


def _flat(text: str) -> str:
    return " ".join(text.split())


def _id(setting: Setting) -> str:
    return str(setting.field or setting.name)


@pytest.mark.parametrize("setting", NUMBERS, ids=_id)
def test_every_bound_is_documented(setting: Setting) -> None:
    name, bound = _id(setting), setting.bound
    assert bound is not None
    row = next(
        (
            line
            for line in DOCS.read_text().splitlines()
            if line.startswith("| ") and f"`{name}`" in line and bound.describe() in line
        ),
        None,
    )
    assert row is not None, f"docs/cli.md's limits table has no row for {name}"
    assert bound.describe() in row and bound.why in row
    if setting.name:
        assert f"`{setting.name}`" in row
        assert bound.describe() in _flat(help_text()), f"dislock --help lacks {bound.describe()}"


@pytest.mark.parametrize("setting", NUMBERS, ids=_id)
def test_every_bound_refuses_just_outside_and_accepts_its_ends(setting: Setting) -> None:
    bound = setting.bound
    assert bound is not None
    if not bound.low_open:
        assert setting.check(bound.low) == bound.low
    assert setting.check(str(bound.high)) == bound.high
    for outside in (bound.high * 1.001, bound.low - 0.001, "nan", "inf", "-inf", "", "1s", True):
        with pytest.raises(ConfigurationError) as refused:
            setting.check(outside)
        assert "\n" not in str(refused.value)
    if bound.low_open:
        with pytest.raises(ConfigurationError, match="greater than"):
            setting.check(bound.low)


def test_the_wrapper_and_lock_context_use_the_same_words() -> None:
    from dislock import LockContext

    env = {
        "DATABASE_URL": "postgresql://app:pw@db/app",
        "LOCK_KEY": "job",
        "LOCK_STRATEGY": "lease",
        "RUN_LOCK_TTL_SECONDS": "1e12",
    }
    with pytest.raises(ConfigurationError) as from_env:
        read_wrapper_settings("DATABASE_URL", ["true"], env)
    with pytest.raises(ConfigurationError) as from_python:
        LockContext(
            url="postgresql://db/app",
            table_parts=["kv"],
            lock_key="job",
            owner="o",
            run_ttl_seconds=1e12,
        )
    # The same words but for the setting's name and how the value was written.
    assert str(from_env.value) == "RUN_LOCK_TTL_SECONDS must be at most 604800 s, got '1e12'"
    assert str(from_python.value) == "run_ttl_seconds must be at most 604800 s, got 1000000000000.0"


def test_huge_numbers_that_overflow_float_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="must be a finite number"):
        TTL.check("1e400")
    with pytest.raises(ConfigurationError, match="at most 604800"):
        TTL.check(10**400)


@pytest.mark.parametrize(
    "key", ["nightly", "ops/daily report", "ünï·cødé", "k" * MAX_KEY_BYTES, "emoji 🎉", "a b"]
)
def test_keys_that_are_accepted(key: str) -> None:
    assert check_key("LOCK_KEY", key) == key


@pytest.mark.parametrize(
    "key", ["", " ", "a\nb", "a\x00b", "a\x1bb", "a\u2028b", "a\u202eb", "a\udcffb", "é" * 1025]
)
def test_keys_that_are_refused_in_one_line(key: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        check_key("LOCK_KEY", key)
    message = str(refused.value)
    assert message.startswith("LOCK_KEY ") and "\n" not in message
    assert message.isprintable()


def test_printing_escapes_what_would_break_a_line() -> None:
    assert escape("plain key") == "plain key"
    assert escape("a\nb\u202ec") == "a\\nb\\u202ec"
    assert printable("it's\n") == "'it\\'s\\n'"
    assert re.fullmatch(r"'x{80}\.\.\.'", printable("x" * 200, limit=80))


def test_pause_reasons_may_be_empty_or_long_but_not_longer_or_broken() -> None:
    assert check_reason("--reason", "") == ""
    assert check_reason("--reason", "é" * 500) == "é" * 500  # 1000 bytes
    for bad, words in (("é" * 501, "1002 bytes long"), ("a\tb", "control"), ("\udcff", "control")):
        with pytest.raises(ConfigurationError, match=words):
            check_reason("--reason", bad)


def test_clipping_escapes_and_cuts_to_the_limit() -> None:
    assert clip("plain key") == "plain key"
    assert clip("x" * SHOWN_CHARS) == "x" * SHOWN_CHARS
    assert clip("x" * 5_000_000) == "x" * (SHOWN_CHARS - 1) + "…"
    assert clip("a\x1b[2Jb") == "a\\x1b[2Jb"
    # An escape is never cut in two, and the result never exceeds the limit.
    assert clip("ab\x1b", limit=5) == "ab…"
    assert clip("\x1b" * 100, limit=10) == "\\x1b\\x1b…"
    for text in ("é" * 100, "\u202e" * 30, "x\ny" * 40):
        assert len(clip(text, limit=20)) <= 20 and clip(text, limit=20).endswith("…")


@pytest.mark.parametrize("bound", [0, 0.5, -1, 31 * 86400, "soon", True])
def test_a_max_runtime_out_of_range_is_refused_by_the_context(bound: object) -> None:
    from dislock import LockContext

    with pytest.raises(ConfigurationError, match="max_runtime_seconds"):
        LockContext(url="postgresql://db/app", lock_key="k", max_runtime_seconds=bound)  # type: ignore[arg-type]


def _context_defaults() -> dict[str, object]:
    from dataclasses import fields

    from dislock import LockContext

    return {f.name: f.default for f in fields(LockContext)}


@pytest.mark.parametrize("setting", [s for s in NUMBERS if s.field in _context_defaults()], ids=_id)
def test_none_is_a_number_left_unset_only_where_none_is_the_default(setting: Setting) -> None:
    """Where a LockContext field defaults to None, None leaves it unset; anywhere else
    None is refused in one line, not a TypeError later (found by test_generated_input)."""
    from dislock import LockContext

    assert setting.field is not None
    arguments = {"url": "postgresql://db/app", "lock_key": "k", "schedule": "* * * * *"}
    if _context_defaults()[setting.field] is None:
        LockContext(**arguments, **{setting.field: None})  # type: ignore[arg-type]
    else:
        with pytest.raises(ConfigurationError, match=f"^{setting.field} must be .*got None$"):
            LockContext(**arguments, **{setting.field: None})  # type: ignore[arg-type]
