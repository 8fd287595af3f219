#!/usr/bin/env python3
"""Set one version on every distribution, and the exact pins between them.

    hatch run bump 0.3.0

Rewrites each member's ``version``, its ``dislock*==X`` requirements and the
``__version__`` strings, so that the four distributions always release together.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECTS = sorted(ROOT.glob("packages/*/pyproject.toml"))
VERSION_MODULES = [
    ROOT / "packages/dislock-core/src/dislock/__init__.py",
    ROOT / "packages/dislock-cli/src/dislock/cli/__init__.py",
]
VERSION = re.compile(r"^\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?$")


def bump(version: str) -> list[Path]:
    changed = []
    for path in PYPROJECTS:
        text = path.read_text()
        new = re.sub(r'(?m)^version = "[^"]+"$', f'version = "{version}"', text)
        new = re.sub(r'"(dislock(?:-core|-aio|-cli)?)==[^"]+"', rf'"\1=={version}"', new)
        if new != text:
            path.write_text(new)
            changed.append(path)
    for path in VERSION_MODULES:
        text = path.read_text()
        new = re.sub(r'(?m)^__version__ = "[^"]+"$', f'__version__ = "{version}"', text)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


def main() -> int:
    if len(sys.argv) != 2 or not VERSION.match(sys.argv[1]):
        print("usage: bump_version.py X.Y.Z", file=sys.stderr)
        return 2
    for path in bump(sys.argv[1]):
        print(f"updated {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
