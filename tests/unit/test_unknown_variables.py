"""Variables named like dislock's that no setting is: which are likely typos of one (a
configuration error), which are only warned of, and which are never counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from dislock.core.supervision import child_environment, guard_environment
from dislock.core.unknown_variables import (
    NOT_SETTINGS,
    Unknown,
    distance_of,
    typo_error,
    unknown_variables,
)
from dislock.core.variables import VARIABLES


@pytest.mark.parametrize(
    ("name", "setting"),
    [
        ("LOCK_RETRYS", "LOCK_RETRIES"),
        ("LOCK_MAX_RUNTIME_SECOND", "LOCK_MAX_RUNTIME_SECONDS"),
        ("LOCK_MAX_RUNTIM_SECONDS", "LOCK_MAX_RUNTIME_SECONDS"),
        ("LOCK_MAX_RUNTIME", "LOCK_MAX_RUNTIME_SECONDS"),  # the unit left out
        ("lock_key", "LOCK_KEY"),  # the case
        ("LOCK_KEYS", "LOCK_KEY"),
        ("LOCK_HISTROY", "LOCK_HISTORY"),  # two neighbours swapped: one edit
        ("CRON_SCHEDUEL", "CRON_SCHEDULE"),
        # Another of dislock's beginnings: the same setting.
        ("LOCK_TTL_SECONDS", "RUN_LOCK_TTL_SECONDS"),
        ("RUN_LOCK_KEY", "LOCK_KEY"),
        ("DISLOCK_KEY", "LOCK_KEY"),
        ("LOCK_TZ", "CRON_TZ"),
        ("LOCK_SCHEDULE", "CRON_SCHEDULE"),
        ("LOCK_LOG_LEVEL", "CRONJOB_LOCK_LOG_LEVEL"),
        ("CRONJOB_LOG_LEVEL", "CRONJOB_LOCK_LOG_LEVEL"),
        ("LOCK_METRICS_TEXTFILE", "DISLOCK_METRICS_TEXTFILE"),
        # Close to a setting, so counted although it ends in _URL.
        ("LOCK_PAS_URL", "LOCK_PASS_URL"),
    ],
)
def test_a_likely_typo_names_the_setting_it_resembles(name: str, setting: str) -> None:
    assert unknown_variables([name]) == (Unknown(name, setting),)
    assert str(typo_error(unknown_variables([name]))) == (
        f"{name} is not a dislock setting: did you mean {setting}?"
    )


@pytest.mark.parametrize(
    "name",
    [
        # Other tools' names that begin like dislock's: far from every setting.
        "LOCK_FILE",
        "LOCK_DIR",
        "LOCK_PATH",
        "LOCK_TIMEOUT",
        "LOCK_NAME",
        "LOCK_TYPE",
        "LOCK_STATE",
        "LOCK_ID",
        "CRON_MAILTO",
        "CRON_T",  # a two-letter setting's name (TZ) takes no edit
        "DISLOCK_SCREENSHOT",
        # Too far to tell from another word: warned of, not refused.
        "LOCK_RETRY",
        "LOCK_HEARTBEAT",
    ],
)
def test_any_other_name_like_dislocks_is_only_warned_of(name: str) -> None:
    assert unknown_variables([name]) == (Unknown(name, None),)
    assert typo_error(unknown_variables([name])) is None
    assert Unknown(name, None).describe() == f"{name} is not a dislock setting: ignored"


def test_settings_ours_and_urls_are_never_counted() -> None:
    settings = [setting.name for setting in VARIABLES]
    urls = ["LOCK_DB_URL", "DISLOCK_URL", "DISLOCK_ADMIN_URL", "LOCK_URL"]
    others = ["PATH", "TZ", "TRACEPARENT", "DATABASE_URL", "PGOPTIONS", "MY_LOCK_KEY"]
    names = [*settings, *NOT_SETTINGS, *urls, *others]
    assert unknown_variables(names, url_variable="LOCK_DB_URL") == ()
    # The URL variable the command line names, even one close to a setting.
    assert unknown_variables(["LOCK_KEYS"], url_variable="LOCK_KEYS") == ()


def test_what_dislock_sets_for_the_command_and_its_guard_is_never_counted() -> None:
    child = child_environment({}, "nightly", 7, "token", attempt=2)
    assert unknown_variables(guard_environment(child, "token")) == ()
    # The names other parts of dislock set for the command, the list to extend.
    assert {"DISLOCK_SLOT_START", "DISLOCK_SLOT_END", "DISLOCK_LAST_SUCCESS"} <= NOT_SETTINGS


def test_the_typos_come_first_and_make_one_line() -> None:
    found = unknown_variables(["LOCK_FILE", "LOCK_WAIT", "LOCK_RETRYS", "CRON_MAILTO"])
    assert found == (
        Unknown("LOCK_RETRYS", "LOCK_RETRIES"),
        Unknown("LOCK_WAIT", "LOCK_WAIT_SECONDS"),
        Unknown("CRON_MAILTO", None),
        Unknown("LOCK_FILE", None),
    )
    assert str(typo_error(found)) == (
        "LOCK_RETRYS is not a dislock setting: did you mean LOCK_RETRIES?;"
        " LOCK_WAIT is not a dislock setting: did you mean LOCK_WAIT_SECONDS?"
    )


@pytest.mark.parametrize(
    ("a", "b", "distance"),
    [
        ("", "", 0),
        ("KEY", "", 3),
        ("RETRYS", "RETRIES", 2),
        ("HISTROY", "HISTORY", 1),
        ("ABCD", "BADC", 2),
        ("KITTEN", "SITTING", 3),
    ],
)
def test_the_distance_counts_edits_and_swaps(a: str, b: str, distance: int) -> None:
    assert distance_of(a, b) == distance == distance_of(b, a)


def test_the_docs_examples_are_judged_as_the_docs_say() -> None:
    page = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    section = " ".join(page.split("### Misspelled settings", 1)[1].split("###", 1)[0].split())
    typos, warnings = section.rsplit("close): ", 1)[1].split(" are typos; ", 1)
    warnings = warnings.split(", another tool's names, are warnings", 1)[0]
    typo_names = [word.strip("`,") for word in typos.split()]
    warning_names = [word.strip("`,") for word in warnings.split()]
    assert (len(typo_names), len(warning_names)) == (6, 3), (typo_names, warning_names)
    assert all(unknown_variables([name])[0].resembles for name in typo_names)
    assert all(unknown_variables([name])[0].resembles is None for name in warning_names)
