"""dislock 0.1.0, this project's previous release, installed from PyPI into a venv.

The venv is kept in a cache directory (one per Python version) so that only the
first run downloads anything; a venv that does not work is rebuilt.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

OLD_VERSION = "0.1.0"


class PyPIUnreachable(RuntimeError):
    """PyPI could not be reached, so the old release could not be installed."""


def _works(venv: Path) -> bool:
    python = venv / "bin" / "python"
    if not python.exists():
        return False
    probe = "import importlib.metadata as m; print(m.version('dislock'))"
    result = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=False)
    return result.returncode == 0 and result.stdout.strip() == OLD_VERSION


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
    except OSError:
        return False
    return True


def old_dislock_venv(cache: Path | None = None) -> Path:
    """The venv holding dislock 0.1.0: ``bin/python -m dislock`` is the old wrapper.

    Raises ``PyPIUnreachable`` when it cannot be installed because PyPI is out of
    reach; any other failure to install raises RuntimeError with pip's output.
    """
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    root = cache or Path(tempfile.gettempdir()) / "dislock-test-cache"
    venv = root / f"dislock-{OLD_VERSION}-py{version}"
    if _works(venv):
        return venv
    root.mkdir(parents=True, exist_ok=True)
    # Built aside and renamed into place, so that a concurrent run never sees half a venv.
    building = Path(tempfile.mkdtemp(prefix=f"{venv.name}.", dir=root))
    try:
        subprocess.run([sys.executable, "-m", "venv", building], check=True, capture_output=True)
        installed = subprocess.run(
            [
                building / "bin" / "python",
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                f"dislock=={OLD_VERSION}",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if installed.returncode != 0:
            if not _pypi_reachable():
                raise PyPIUnreachable(f"cannot install dislock=={OLD_VERSION}: PyPI unreachable")
            raise RuntimeError(
                f"pip install dislock=={OLD_VERSION} failed:\n{installed.stdout}{installed.stderr}"
            )
        # A venv works from where it is moved to when run as ``python -m``
        # (only its scripts' #! lines name the old place).
        try:
            building.rename(venv)  # refused while another run's venv is there
        except OSError:
            if not _works(venv):  # a broken one: replaced
                shutil.rmtree(venv, ignore_errors=True)
                building.rename(venv)
            # else another run (a second pytest worker) finished first: keep its venv,
            # which its tests may be running from.
        if not _works(venv):
            raise RuntimeError(f"dislock {OLD_VERSION} installed into {venv} but does not run")
        return venv
    finally:
        shutil.rmtree(building, ignore_errors=True)  # gone already once renamed
