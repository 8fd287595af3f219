"""``python -m dislock.cli``: the same as the ``dislock`` command."""

import sys

from dislock.cli import main

sys.exit(main())
