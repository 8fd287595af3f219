"""What a wrapped command's ``PGOPTIONS`` carries for a fenced table, and the tokens
``set_fencing_token`` accepts: no database."""

from __future__ import annotations

import pytest

from dislock import ConfigurationError
from dislock.core.fencing import check_token, pgoptions, set_token
from dislock.core.supervision import child_environment


@pytest.mark.parametrize(
    ("existing", "token", "expected"),
    [
        (None, 7, "-c dislock.fencing_token=7"),
        ("-c statement_timeout=5s", 7, "-c statement_timeout=5s -c dislock.fencing_token=7"),
        # an outer run's token, however written, is never passed on
        (
            "-c dislock.fencing_token=3 -c work_mem=4MB",
            7,
            "-c work_mem=4MB -c dislock.fencing_token=7",
        ),
        ("-cdislock.fencing_token=3", None, None),
        ("--dislock.fencing_token=3 -c a.b=x\\ y", None, "-c a.b=x\\ y"),
        ("-c search_path=a\\ b", None, "-c search_path=a\\ b"),
        ("-c other.fencing_token=1", None, "-c other.fencing_token=1"),
    ],
)
def test_pgoptions_carry_this_runs_token_only(
    existing: str | None, token: int | None, expected: str | None
) -> None:
    assert pgoptions(existing, token) == expected


def test_the_childs_environment_has_the_token_in_pgoptions() -> None:
    env = child_environment({"PGOPTIONS": "-c dislock.fencing_token=1"}, "k", 9, "run")
    assert env["PGOPTIONS"] == "-c dislock.fencing_token=9"
    assert env["DISLOCK_FENCING_TOKEN"] == "9"
    assert "PGOPTIONS" not in child_environment(
        {"PGOPTIONS": "-c dislock.fencing_token=1"}, "k", None, "run"
    )
    assert child_environment({"PGOPTIONS": "-c a.b=1"}, "k", None, "run")["PGOPTIONS"] == "-c a.b=1"


@pytest.mark.parametrize("token", [None, 0, -1, "1; DROP TABLE x", "", True, 10**18, "1.5"])
def test_what_is_not_a_token_is_refused_in_one_line(token: object) -> None:
    with pytest.raises(ConfigurationError) as refused:
        check_token(token)
    assert "\n" not in str(refused.value)


def test_a_token_is_set_for_the_transaction_unless_asked() -> None:
    assert check_token(" 42 ") == 42
    assert set_token(42).params == {
        "setting": "dislock.fencing_token",
        "token": "42",
        "local": True,
    }
    assert set_token("42", local=False).params["local"] is False
