"""The ``dislock`` wrapper: its command line (``command``), environment (``settings``), the run
(``run``: the locks, the command, exit codes) and the run's node_exporter ``textfile``."""
