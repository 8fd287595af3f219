"""The ``dislock`` wrapper: ``command`` reads its command line, ``settings`` its
environment, ``run`` takes the locks and supervises the command, ``textfile``
writes the run's metrics for node_exporter."""
