"""MkDocs hook: give the API pages one ``dislock`` package to read.

The four distributions each hold part of the ``dislock`` namespace in their own
``src`` tree; an install merges them into one directory, but the docs build
reads sources statically and would see only the first.  This copies the trees
into ``build/api-src/dislock`` before the build, as an install would lay them out.
"""

from __future__ import annotations

import shutil
from pathlib import Path


def on_startup(command: str, dirty: bool) -> None:
    # on_startup, not on_config: mkdocstrings drops search paths that do not
    # exist yet when its own on_config runs, which is before any hook's.
    root = Path(__file__).resolve().parent.parent
    merged = root / "build" / "api-src"
    shutil.rmtree(merged, ignore_errors=True)
    for tree in sorted(root.glob("packages/*/src/dislock")):
        shutil.copytree(tree, merged / "dislock", dirs_exist_ok=True)
