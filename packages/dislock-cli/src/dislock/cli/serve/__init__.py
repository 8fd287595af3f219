"""``dislockctl serve``: the fleet's state as Prometheus metrics and a status page.

``server`` answers HTTP (``http_policy`` decides who is served); ``fleet_reader``
reads a snapshot over one kept connection with the statements of ``scrape``;
``fleet_status`` is that snapshot, ``slot_windows`` the schedule slots it counts
missed slots in; ``metrics`` renders it as metric families (a key's runs as
``dislock.cli.run_metrics`` does for the wrapper's textfile too), handed to Prometheus
by ``dislock.cli.prometheus``, ``status_page`` as HTML.
"""
