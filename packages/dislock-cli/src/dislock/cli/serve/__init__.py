"""``dislockctl serve``: the fleet's state as Prometheus metrics and a status page.

``server`` answers HTTP (``http_policy`` decides who is served); ``fleet_reader``
reads a snapshot over one kept connection with the statements of ``scrape``;
``fleet_status`` is that snapshot, ``slot_windows`` the schedule slots it counts
missed slots in; ``metrics`` and ``_prometheus`` render it for Prometheus (and
for the wrapper's textfile), ``status_page`` as HTML.
"""
