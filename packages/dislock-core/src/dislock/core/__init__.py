"""The sans-I/O core of dislock: every decision, none of the I/O.

The sync (``dislock._sync``), asyncio (``dislock.aio``) and command-line
(``dislock.cli``) packages import from here and only add connections, threads,
tasks and processes.  Nothing in this package opens a socket or sleeps; only
``processes`` (the wrappers' flavourless handle on their command's guard and
process group) and the guard program itself start or signal processes.  Decisions
that only the command line needs (its environment, ``dislockctl``'s SQL, error
wording) live in ``dislock.cli`` instead, so that they do not ship to library users.
"""
