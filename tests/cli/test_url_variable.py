"""``LOCK_PASS_URL``: whether the wrapped command (and the wrapper's guard) inherits
the variable holding the database URL."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli.conftest import DISLOCK
from tests.support.eventually import wait_for


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (``/proc/PID/stat``: the parent is the
    second field after the command name, which may hold spaces and parentheses)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_bytes().rsplit(b")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _environment_names(pid: int) -> set[str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return {entry.split(b"=", 1)[0].decode() for entry in raw.split(b"\0") if entry}


@pytest.mark.parametrize(("value", "passed"), [(None, True), ("1", True), ("0", False)])
def test_the_command_inherits_the_url_variable_unless_lock_pass_url_is_0(
    cli_env: dict[str, str], tmp_path: Path, value: str | None, passed: bool
) -> None:
    env = {**cli_env, "LOCK_STRATEGY": "lease"}  # a lease: the guard runs all along
    if value is not None:
        env["LOCK_PASS_URL"] = value
    seen, started, stop = tmp_path / "seen", tmp_path / "started", tmp_path / "stop"
    script = (
        f'echo "${{DATABASE_URL-unset}}" > "{seen}"; echo $$ > "{started}";'
        f' while [ ! -e "{stop}" ]; do sleep 0.02; done'
    )
    wrapper = subprocess.Popen(
        [*DISLOCK, "DATABASE_URL", "sh", "-c", script], env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(started, timeout=30)
        command = int(started.read_text())
        # The guard is the wrapper's other child (started before the command).
        children = _children(wrapper.pid)
        assert command in children
        assert len(children) == 2, children
        assert ("DATABASE_URL" in _environment_names(command)) is passed
        if not passed:
            (guard,) = (child for child in children if child != command)
            assert "DATABASE_URL" not in _environment_names(guard)
        assert seen.read_text().strip() == (cli_env["DATABASE_URL"] if passed else "unset")
    finally:
        stop.touch()
        _, stderr = wrapper.communicate(timeout=30)
    assert wrapper.returncode == 0, stderr
