"""``python -m dislock.cli``: the same as the ``dislock`` command."""

from dislock.cli.wrapper.command import console_main

console_main()
