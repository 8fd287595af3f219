"""The sans-I/O core of dislock: every decision, none of the I/O.

The sync, asyncio and command-line packages import from here and only add
connections, threads, tasks and processes.  Nothing here opens a socket or sleeps;
only ``processes`` and the guard program start or signal processes.
"""
