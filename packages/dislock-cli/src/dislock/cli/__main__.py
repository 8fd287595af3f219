"""``python -m dislock.cli``: the same as the ``dislock`` command."""

from dislock.cli import console_main

console_main()
