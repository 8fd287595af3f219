"""Every Prometheus alert rule the docs show is checked by the real ``promtool`` as
pasted (a block of bare ``- alert:`` entries is checked inside a group, as it would be
pasted under ``rules:``), and the grants' rule fires on a loophole and only then."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (apt-get install prometheus)"
)


def rule_blocks() -> list[tuple[str, str]]:
    """``(where, text)`` of every yaml block in README.md and docs/ with an alert rule."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        for match in re.finditer(r"^```yaml\n(.*?)^```", text, re.S | re.M):
            if "alert:" in match.group(1):
                line = text[: match.start()].count("\n") + 1
                found.append((f"{path.relative_to(ROOT)}:{line}", match.group(1)))
    return found


def as_rule_file(text: str) -> dict[str, Any]:
    loaded = yaml.safe_load(text)
    if isinstance(loaded, dict) and "groups" in loaded:
        return loaded
    return {"groups": [{"name": "pasted", "rules": loaded}]}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, check=False, timeout=60
    )


def test_the_docs_show_the_rules_this_test_checks() -> None:
    names = {
        rule["alert"]
        for _, text in rule_blocks()
        for group in as_rule_file(text)["groups"]
        for rule in group["rules"]
    }
    assert {
        "DislockGrantLoopholes",
        "DislockMissedSlots",
        "DislockLockDelay",
        "DislockLateSlots",
        "DislockFailedSlots",
        "DislockRunPastEnvelope",
    } <= names


@pytest.mark.parametrize(("where", "text"), rule_blocks(), ids=[w for w, _ in rule_blocks()])
def test_each_rule_block_passes_promtool(where: str, text: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(as_rule_file(text)))
    checked = promtool("check", "rules", "rules.yml", cwd=tmp_path)
    assert checked.returncode == 0, (where, checked.stdout, checked.stderr)


def promtool_test(
    tmp_path: Path, alert: str, series: str, values: str, quiet_at: str, fires_at: str, **fired: Any
) -> None:
    """The docs' rule ``alert``, fed ``series`` with ``values`` a minute apart: silent at
    ``quiet_at``, firing at ``fires_at`` with the ``exp_labels`` and ``exp_annotations``
    of ``fired``, in the real ``promtool test rules``."""
    ((where, text),) = [b for b in rule_blocks() if alert in b[1]]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(as_rule_file(text)))
    expected = [
        {"eval_time": quiet_at, "alertname": alert, "exp_alerts": []},
        {"eval_time": fires_at, "alertname": alert, "exp_alerts": [fired]},
    ]
    test = {
        "interval": "1m",
        "input_series": [{"series": series, "values": values}],
        "alert_rule_test": expected,
    }
    tests = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [test]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests))
    tested = promtool("test", "rules", "test.yml", cwd=tmp_path)
    assert tested.returncode == 0, (where, tested.stdout, tested.stderr)


def test_the_loophole_alert_fires_on_a_loophole_only(tmp_path: Path) -> None:
    promtool_test(
        tmp_path,
        "DislockGrantLoopholes",
        'dislock_grant_loopholes{job="dislock"}',
        "0 0 2",
        "1m",
        "2m",
        exp_labels={"job": "dislock", "severity": "page"},
        exp_annotations={
            "summary": "2 roles can get around the lock table's grants"
            " (dislockctl grants lists them)"
        },
    )


def test_the_late_slots_alert_fires_once_a_slot_is_late_and_not_before(tmp_path: Path) -> None:
    promtool_test(
        tmp_path,
        "DislockLateSlots",
        'dislock_runs_total{key="nightly-export",outcome="late"}',
        "0 0 0 1 1",
        "2m",
        "4m",
        exp_labels={"key": "nightly-export", "outcome": "late"},
        exp_annotations={
            "summary": "nightly-export had a slot nobody started before its deadline"
            " (dislockctl history nightly-export)"
        },
    )


def test_the_failed_slots_alert_fires_once_a_slot_failed_and_not_before(tmp_path: Path) -> None:
    promtool_test(
        tmp_path,
        "DislockFailedSlots",
        'dislock_failed_slots{key="nightly-export"}',
        "0 0 0 1 1",
        "2m",
        "4m",
        exp_labels={"key": "nightly-export"},
        exp_annotations={
            "summary": "nightly-export failed 1 slots in the last 24 h, every attempt"
            " (dislockctl missed nightly-export)"
        },
    )


def test_the_envelope_alert_fires_while_a_run_is_past_its_envelope(tmp_path: Path) -> None:
    promtool_test(
        tmp_path,
        "DislockRunPastEnvelope",
        'dislock_running_past_envelope{key="nightly-export"}',
        "0 0 1 1",
        "1m",
        "2m",
        exp_labels={"key": "nightly-export"},
        exp_annotations={
            "summary": "nightly-export has been running longer than its runs usually take"
            " (dislockctl history nightly-export)"
        },
    )
