"""Stopping a sweep on SIGTERM or SIGHUP the way Ctrl-C stops it.

Ctrl-C in a terminal reaches every process of the foreground group, so a sweep's worker
processes stop together with it. A batch scheduler's SIGTERM, or the SIGHUP of a closed
ssh session, may reach the main process only: with the default action it dies at once,
and the workers of its process pool live on, orphaned, blocked on a queue nobody writes
to. So while a sweep runs, these signals raise :class:`SweepStopped` (a
``KeyboardInterrupt``) in the main thread instead. The runner then stops its workers and
the sweep ends as after Ctrl-C: every finished run is on disk, and the same call resumes.

A signal is taken over only where its handler is the default one and only in the main
thread (the only place Python runs signal handlers): a handler of the program's own, or
the ignored SIGHUP that ``nohup`` sets, is left alone.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

__all__ = ["STOP_SIGNALS", "StopOnSignals", "SweepStopped"]

STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)
"""The signals that stop a running sweep as Ctrl-C does (SIGHUP does not exist on Windows)."""


class SweepStopped(KeyboardInterrupt):
    """A sweep stopped by SIGTERM or SIGHUP; its finished runs are kept, as after Ctrl-C.

    A subclass of ``KeyboardInterrupt``, so code that handles Ctrl-C handles it too.
    """

    def __init__(self, signal_number: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signal_number).name}")
        self.signal_number = signal_number

    @property
    def signal_name(self) -> str:
        """The signal's name, e.g. ``"SIGTERM"``."""
        return signal.Signals(self.signal_number).name

    @property
    def exit_status(self) -> int:
        """The shell's convention for a process ended by this signal: 128 + its number."""
        return 128 + self.signal_number


class StopOnSignals:
    """A context in which SIGTERM and SIGHUP raise :class:`SweepStopped` in the main thread.

    Only the first signal raises: later ones are ignored while the sweep stops its workers,
    so a second SIGTERM cannot cut the clean-up short (SIGKILL still can). On leaving, the
    previous handlers are put back.
    """

    def __init__(self) -> None:
        self._previous: dict[int, signal.Handlers] = {}
        self._owner_pid = os.getpid()
        self._raised = False

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        self._owner_pid = os.getpid()
        for number in STOP_SIGNALS:
            if signal.getsignal(number) is signal.SIG_DFL:
                self._previous[number] = signal.SIG_DFL
                signal.signal(number, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous.clear()

    def _handle(self, number: int, frame: FrameType | None) -> None:
        if os.getpid() != self._owner_pid:
            # A worker forked while this handler was set inherited it: a signal sent to
            # the worker (its pool stopping it, say) must end it as by default.
            signal.signal(number, signal.SIG_DFL)
            os.kill(os.getpid(), number)
            return
        if self._raised:
            return
        self._raised = True
        raise SweepStopped(number)
