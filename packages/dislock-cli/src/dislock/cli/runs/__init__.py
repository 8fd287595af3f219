"""The run history as operators read it (``dislockctl history``, ``missed``, and
``serve``'s counts): ``run_history`` reads the rows, ``missed_slots`` judges each slot
of a schedule, ``history_report`` words them."""
