"""``dislockctl serve``: the fleet's state as Prometheus metrics and a status page.

``server`` answers HTTP (``http_policy`` decides who is served); ``fleet_reader``
reads a snapshot with the statements of ``scrape``; ``fleet_status`` is that
snapshot, ``metrics`` and ``status_page`` render it.
"""
