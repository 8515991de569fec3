"""A process pool whose workers end when the process that started them dies.

A ``ProcessPoolExecutor``'s idle worker waits on a queue that only its parent writes to.
When the parent ends cleanly, or by Ctrl-C or a signal it handles, it stops its
workers; when it is killed outright (SIGKILL, the out-of-memory killer), nothing does,
and the workers wait, orphaned, forever. So each worker of :class:`WorkerPool` watches
a *lifeline*: the read end of a pipe whose only write end is held by the parent (every
worker closes the copy it inherits). The operating system closes that end when the
parent dies, however it dies; the worker sees end of file and exits at once.

The watch is a thread in each worker, started by the pool's initializer, blocked on
the pipe: a run pays nothing for it and its results do not change. The thread also
checks, once per :data:`WATCH_INTERVAL_S`, that the worker's parent is still the
process it started under: on POSIX systems that catches the case where another child
of the parent inherited a copy of the write end (on Windows the check never fires, and
the pipe alone does the job).
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import threading
from multiprocessing.connection import Connection

__all__ = ["ORPHANED_EXIT_STATUS", "WATCH_INTERVAL_S", "WorkerPool"]

WATCH_INTERVAL_S = 1.0
"""How often a worker's watch thread checks that its parent process is still there."""

ORPHANED_EXIT_STATUS = 70
"""The exit status of a worker that ended because its parent was gone."""


class WorkerPool(concurrent.futures.ProcessPoolExecutor):
    """A ``ProcessPoolExecutor`` of *max_workers* processes that exit when this process dies.

    The pool holds the write end of the workers' lifeline until :meth:`shutdown` has
    waited for the workers to exit, so a worker never mistakes a clean shutdown for its
    parent's death.
    """

    def __init__(self, max_workers: int) -> None:
        self._lifeline_reader, self._lifeline_writer = multiprocessing.Pipe(duplex=False)
        super().__init__(
            max_workers=max_workers,
            initializer=watch_parent,
            initargs=(self._lifeline_reader, self._lifeline_writer),
        )

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Shut the pool down as ``ProcessPoolExecutor`` does; once the workers have
        exited (``wait=True``), let go of their lifeline."""
        super().shutdown(wait=wait, cancel_futures=cancel_futures)
        if wait:
            self._lifeline_writer.close()
            self._lifeline_reader.close()


def watch_parent(lifeline: Connection, writer: Connection) -> None:
    """A worker's initializer: exit this worker when its parent process is gone.

    *writer* is this worker's copy of the lifeline's write end (inherited on fork, sent
    on spawn): it is closed here, so that only the parent keeps the pipe open.
    """
    writer.close()
    parent_pid = os.getppid()
    threading.Thread(
        target=_exit_when_orphaned,
        args=(lifeline, parent_pid),
        name="simsim-parent-watch",
        daemon=True,
    ).start()


def _exit_when_orphaned(lifeline: Connection, parent_pid: int) -> None:
    # poll() answers True at end of file, when the last write end has closed: nothing
    # is ever sent. os._exit, not sys.exit: a run in flight in the main thread has no
    # one left to report to, and must not keep the process alive.
    try:
        while not lifeline.poll(WATCH_INTERVAL_S) and os.getppid() == parent_pid:
            pass
    except OSError:
        pass  # the pipe broke: the parent is gone too
    os._exit(ORPHANED_EXIT_STATUS)
