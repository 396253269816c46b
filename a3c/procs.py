"""Process plumbing: how workers (actor and learner processes, the Ray pump's thread)
start, stop and end with the trainer, and the stop signals Python would otherwise lose.

    worker_context()    where worker processes come from (fork, or the fork server)
    actor_context()     where actor processes come from (the fork server for GPU actors)
    learner_context()   where learner processes come from
    as_worker_process() what every worker process does first
    join_worker()       wait for a stopped worker; kill a process that is stuck
    stop_on_sigterm()   SIGTERM stops a run as Ctrl-C does

A signal's Python handler runs in the main thread wherever the interpreter next checks
for one. When that is inside a function Python calls where an exception cannot
propagate, such as a hook of os.fork (logging registers some, and they run each time
the trainer forks an actor), the handler's exception is printed as ignored and the
program goes on: a Ctrl-C or a SIGTERM landing there would not stop the run
(`resend_if_lost`). Blocking the signals in the main thread around the fork would not
keep the handler out of the hooks: the kernel then hands the signal to another thread
(torch's own, say), and Python still runs the handler in the main thread, at its next
check, hooks included.
"""
from __future__ import annotations

import _thread
import ctypes
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from typing import Callable

__all__ = ["JOIN_TIMEOUT_S", "actor_context", "as_worker_process", "end_with_parent", "join_worker",
           "learner_context", "resend_if_lost", "stop_on_sigterm", "worker_context"]

# A worker (actor or learner process, or the Ray pump's thread) still running this long
# after it was asked to stop is stuck, and is killed or left to the process's end.
JOIN_TIMEOUT_S = 10.0
# Imported once by the fork server, so that the processes it forks start at once.
_WORKER_MODULES = ["a3c.actors.local", "a3c.learners.workers"]


def as_worker_process() -> None:
    """What an actor or learner process does first. Ctrl-C reaches the whole process
    group, and the trainer decides how to stop; a forked worker also inherits the command
    line's SIGTERM handler: back to the default. It ends with its parent, and runs torch
    on one thread (parallelism comes from workers)."""
    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    end_with_parent()
    torch.set_num_threads(1)


def end_with_parent() -> None:
    """Have the kernel send this process SIGTERM when its parent ends (Linux's
    PR_SET_PDEATHSIG), however it ends: a trainer killed with SIGKILL, or whose SIGTERM
    handler never ran, cannot stop its actors (or learner processes), and without this
    they would wait on the queue forever. The parent is the trainer, or the fork server,
    which ends with the trainer (restarted actors, and learner processes where an
    accelerator is visible, come from it)."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it ended before the request was made
        os.kill(os.getpid(), signal.SIGTERM)


_PR_SET_PDEATHSIG = 1


def join_worker(worker, timeout_s: float = JOIN_TIMEOUT_S) -> None:
    """Wait for a stopped worker to end: a thread ends on its own (a learner within a
    gradient step); a process still alive after `timeout_s` is stuck, and is killed
    (stuck in an environment step, or a checkpoint without its last update is fine)."""
    if isinstance(worker, threading.Thread):
        worker.join()
        return
    worker.join(timeout_s)
    if worker.is_alive():
        worker.kill()
        worker.join()


def worker_context():
    """Where actor (and learner) processes come from. Forking this process is fast (no
    imports) and safe while it runs a single thread, as when a run starts; once learner or
    monitor threads run, a thread may hold a lock the child would inherit locked, so
    restarted actors come from the fork server."""
    if threading.active_count() == 1:
        return mp.get_context("fork")
    return _fork_server()


def actor_context(device: str):
    """Where actor processes come from: as `worker_context` says, except that actors
    acting on a GPU (`actors.device`) come from the fork server, which has not touched
    CUDA, as a fork of a process that has would find it unusable."""
    return worker_context() if device == "cpu" else _fork_server()


def learner_context():
    """Where learner processes come from: as actors, except where an accelerator is
    visible. There the first backward pass in this process (learner threads of an earlier
    run, say) starts autograd's device threads, and a forked child's backward pass then
    fails ("Unable to handle autograd's threading in combination with fork-based
    multiprocessing"); whether one ran cannot be asked, so learners come from the fork
    server."""
    return _fork_server() if _accelerator_visible() else worker_context()


def _accelerator_visible() -> bool:
    import torch

    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()


def _fork_server():
    """The fork server: a clean process that imported the worker code once."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_WORKER_MODULES)
    return ctx


def stop_on_sigterm() -> None:
    """SIGTERM stops a run the way Ctrl-C does: workers stop, a checkpoint is written. A
    stop whose KeyboardInterrupt Python drops (raised inside a hook of an actor's fork) is
    sent again, as SIGTERM: a run started in the background ignores SIGINT."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    resend_if_lost(signal.SIGTERM, lambda e: isinstance(e, KeyboardInterrupt))


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
