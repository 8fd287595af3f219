"""MkDocs hook: give the API pages one ``dislock`` package to read.

The four distributions each hold part of the ``dislock`` namespace in their own
``src`` tree; an install merges them into one directory, but the docs build
reads sources statically and would see only the first.  This copies the trees
into ``build/api-src/dislock`` before the build, as an install would lay them out.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any


def on_config(config: Any) -> Any:
    root = Path(config.config_file_path).resolve().parent
    merged = root / "build" / "api-src"
    shutil.rmtree(merged, ignore_errors=True)
    for tree in sorted(root.glob("packages/*/src/dislock")):
        shutil.copytree(tree, merged / "dislock", dirs_exist_ok=True)
    return config
