"""The table of the wrapper's variables: --help, the docs, the bounds and the
reading agree with it, and a context written as variables reads back the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dislock import ConfigurationError, LeaseLossPolicy, LockContext
from dislock.cli.wrapper.command import help_text
from dislock.cli.wrapper.settings import read_wrapper_settings
from dislock.core import variables
from dislock.core.setting import Setting
from dislock.core.variables import SETTINGS, VARIABLES
from tests.support.drivers import wrapper_variables

DOCS = Path(__file__).parents[2] / "docs" / "cli.md"


def _flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("variable", VARIABLES, ids=lambda variable: variable.name)
def test_every_variable_is_in_help_and_the_docs_with_its_default(variable: Setting) -> None:
    shown = [line.split() for line in help_text().splitlines()]
    assert any(variable.name in words for words in shown), variable.name
    assert _flat(variable.describe()) in _flat(help_text())
    rows = [
        line for line in DOCS.read_text().splitlines() if line.startswith(f"| `{variable.name}` |")
    ]
    assert rows, f"docs/cli.md's variable table has no row for {variable.name}"


def test_each_variable_and_field_is_named_once() -> None:
    assert len({variable.name for variable in VARIABLES}) == len(VARIABLES)
    named = [setting.field for setting in SETTINGS if setting.field]
    assert len(set(named)) == len(named)


def test_every_field_named_is_a_lock_context_field() -> None:
    fields = set(LockContext.__dataclass_fields__)
    assert {setting.field for setting in SETTINGS if setting.field} <= fields


@pytest.mark.parametrize(
    "setting", [s for s in SETTINGS if s.bound and s.field], ids=lambda setting: setting.name
)
def test_a_numbers_default_is_the_lock_contexts(setting: Setting) -> None:
    default = LockContext.__dataclass_fields__[str(setting.field)].default
    assert default is None or default == setting.value


@pytest.mark.parametrize(
    ("variable", "text", "message"),
    [
        (variables.TTL, "1e12", "RUN_LOCK_TTL_SECONDS must be at most 604800 s, got '1e12'"),
        (variables.SLOTS, "2.5", "LOCK_SLOTS must be a whole number, got '2.5'"),
        (variables.TABLE, "a.b.c", "LOCK_TABLE='a.b.c': table must be 'table' or"),
        (variables.FENCING, "maybe", "LOCK_FENCING must be one of 1/true/yes/on"),
        (variables.LEASE_LOSS, "ignore", "LOCK_ON_LEASE_LOSS must be 'terminate' or"),
    ],
)
def test_a_refusal_names_the_variable(variable: Setting, text: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        variable.read({variable.name: text})
    assert str(refused.value).startswith(message)


def test_blank_is_unset() -> None:
    assert variables.JITTER.read({"LOCK_JITTER_SECONDS": "  "}) is None
    assert variables.WAIT_LISTEN.read({}) is None


@pytest.mark.parametrize(
    ("strategies", "fields"),
    [
        (
            ("lease",),
            {
                "run_ttl_seconds": 12.5,
                "lease_interval_seconds": 0.25,
                "lease_loss_policy": LeaseLossPolicy.CONTINUE,
                "wait_seconds": 3.0,
                "wait_poll_seconds": 0.125,
                "wait_listen": False,
                "slots": 4,
                "connect_patience_seconds": 0.0,
            },
        ),
        (
            ("schedule", "lease"),
            {
                "schedule": "*/5 * * * *",
                "cron_tz": "Europe/Berlin",
                "run_ttl_seconds": 60.0,
                "jitter_max_seconds": 1.5,
                "fencing": True,
                "history": True,
                "history_table": ("ops", "runs"),
                "table_parts": ("ops", "Locks"),
            },
        ),
    ],
)
def test_a_context_written_as_variables_reads_back_the_same(
    strategies: tuple[str, ...], fields: dict[str, Any]
) -> None:
    """What the tests' CLI driver relies on: the wrapper runs the context it was given."""
    context = LockContext(url="postgresql://db/app", lock_key="job", owner="o", **fields)
    environ = {
        "DATABASE_URL": context.url,
        **wrapper_variables(context),
        variables.STRATEGY.name: ",".join(strategies),
    }
    read = read_wrapper_settings("DATABASE_URL", ["true"], environ)
    assert read.strategies == strategies
    for name in LockContext.__dataclass_fields__:
        if name not in ("owner", "cron_zone"):
            assert getattr(read.context, name) == getattr(context, name), name


_SHOWN_ONLY = ("required", "derived", "-", "local zone")
"""Defaults ``--help`` describes rather than gives as a value."""


@pytest.mark.parametrize(
    "variable",
    [v for v in VARIABLES if v.field is not None and v.default not in _SHOWN_ONLY],
    ids=lambda variable: variable.name,
)
def test_the_default_help_shows_is_the_one_a_run_gets(variable: Setting) -> None:
    assert variable.field is not None
    environ = {"DATABASE_URL": "postgresql://db/app", "LOCK_KEY": "k", "LOCK_STRATEGY": "lease"}
    settings = read_wrapper_settings("DATABASE_URL", ["true"], environ)
    shown = variable.read({variable.name: variable.default})
    assert getattr(settings.context, variable.field) == shown


def test_the_wrappers_own_defaults_are_the_ones_help_shows() -> None:
    environ = {"DATABASE_URL": "postgresql://db/app", "LOCK_KEY": "k", "CRON_SCHEDULE": "@daily"}
    settings = read_wrapper_settings("DATABASE_URL", ["true"], environ)
    assert settings.strategies == variables.STRATEGY.read(
        {variables.STRATEGY.name: variables.STRATEGY.default}
    )
    assert settings.pass_url is variables.PASS_URL.read(
        {variables.PASS_URL.name: variables.PASS_URL.default}
    )
    assert settings.conflict_exit_code == variables.CONFLICT_EXIT_CODE.read(
        {variables.CONFLICT_EXIT_CODE.name: variables.CONFLICT_EXIT_CODE.default}
    )
