"""The ``dislock`` commands the CLI measures compare, each installed in a throwaway venv.

``dislock==0.1.0`` from PyPI is the baseline a user would otherwise pick; this
checkout is installed from wheels, as users install it.  An editable install is
not what any user runs: each member adds a ``sys.path`` entry that every import
searches, which would make ours look slower than it is.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def old_dislock() -> Iterator[Path | None]:
    """``dislock==0.1.0`` in a throwaway venv: its ``dislock`` command, or None."""
    with tempfile.TemporaryDirectory(prefix="dislock-010-") as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        installed = subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--quiet", "dislock==0.1.0"],
            capture_output=True,
            text=True,
            check=False,
        )
        command = venv / "bin" / "dislock"
        yield command if installed.returncode == 0 and command.exists() else None


@contextmanager
def installed_dislock(root: Path | None = None) -> Iterator[tuple[Path, str]]:
    """This checkout (or the one at ``root``) installed as users install it: wheels of
    ``dislock-cli`` and what it needs, built there and installed into a throwaway venv
    (what ``pipx`` does).  Its ``dislock`` command, and how it was installed.  Falls back
    to this environment's editable ``dislock`` where ``hatch`` cannot build."""
    from tools.release_check import ROOT, build_into

    editable = Path(sys.executable).parent / "dislock"
    with tempfile.TemporaryDirectory(prefix="dislock-ours-") as tmp:
        wheels = Path(tmp) / "wheels"
        packages = ["dislock-core", "dislock", "dislock-cli"]
        if build_into(wheels, ["wheel"], packages, root or ROOT) is not None:
            yield editable, "editable install (hatch could not build wheels)"
            return
        venv = Path(tmp) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        installed = subprocess.run(
            [
                str(venv / "bin" / "pip"),
                "install",
                "--quiet",
                "--find-links",
                str(wheels),
                "dislock-cli",
            ],
            capture_output=True,
            check=False,
        )
        command = venv / "bin" / "dislock"
        if installed.returncode == 0 and command.exists():
            yield command, "installed from wheels"
        else:
            yield editable, "editable install (the wheels did not install)"


@contextmanager
def revision(rev: str) -> Iterator[Path]:
    """A checkout of git revision ``rev`` of this repository (a throwaway worktree)."""
    from tools.release_check import ROOT

    with tempfile.TemporaryDirectory(prefix="dislock-rev-") as tmp:
        checkout = Path(tmp) / "checkout"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(checkout), rev],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            yield checkout
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(checkout)],
                cwd=ROOT,
                check=False,
                capture_output=True,
            )
