"""Stop signals that Python would otherwise lose.

A signal's Python handler runs in the main thread wherever the interpreter next checks
for one. When that is inside a function Python calls where an exception cannot
propagate, such as a hook of os.fork (logging registers some, and they run each time
the trainer forks an actor), the handler's exception is printed as ignored and the
program goes on: a Ctrl-C or a SIGTERM landing there would not stop the run.

Blocking the signals in the main thread around the fork would not keep the handler out
of the hooks: the kernel then hands the signal to another thread (torch's own, say), and
Python still runs the handler in the main thread, at its next check, hooks included."""
from __future__ import annotations

import _thread
import signal
import sys
import threading
import time
from typing import Callable

__all__ = ["resend_if_lost"]


def resend_if_lost(signum: int, raised_by_it: Callable[[BaseException], bool]) -> None:
    """Send `signum` to the main thread again whenever an exception that `raised_by_it`
    recognizes as its handler's is ignored (it reaches sys.unraisablehook), except at
    exit (an atexit callback, or the interpreter finalizing), where the program is ending
    anyway and a second signal would skip the cleanup that remains.

    The signal goes 10 ms later, from a thread: sent from within the hook, the handler
    would run inside it again. Should it land in a hook once more, it is sent once more.
    A signal rather than _thread.interrupt_main, so that it also wakes the main thread
    from a blocking call."""
    default_hook = sys.unraisablehook

    def hook(unraisable) -> None:
        at_exit = sys.is_finalizing() or "atexit" in (unraisable.err_msg or "")
        if raised_by_it(unraisable.exc_value) and not at_exit:
            try:
                _thread.start_new_thread(_send_soon, (signum, threading.main_thread().ident))
                return
            except RuntimeError:  # no new threads this late
                pass
        default_hook(unraisable)

    sys.unraisablehook = hook


def _send_soon(signum: int, thread_id: int) -> None:
    time.sleep(0.01)
    signal.pthread_kill(thread_id, signum)
