"""What the benchmarks share: the machine a benchmark ran on, for the first lines of its
output (CPU, cores, load, OS, Python and the versions of the packages it compares),
`time_limit`, which stops a run after so many seconds, and `exit_on_sigterm`."""
from __future__ import annotations

import contextlib
import os
import platform
import signal
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

from a3c.procs import resend_if_lost


def machine(*packages: str) -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"CPU: {model}, {os.cpu_count()} logical cores ({usable} usable), "
            f"load average {load_average()} at start\n"
            f"OS: {platform.platform()}\n"
            f"Python {platform.python_version()} ({platform.python_implementation()}), "
            + ", ".join(f"{name} {version(name)}" for name in packages) + gpu())


def gpu() -> str:
    """The GPUs nvidia-smi lists, if any: asked without starting CUDA in this process,
    which would then fork its workers with CUDA's threads running."""
    if shutil.which("nvidia-smi") is None:
        return ""
    try:
        names = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=10).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return ""
    names = [name.strip() for name in names if name.strip()]
    return f"\nGPU: {', '.join(names)}" if names else ""


def version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def exit_on_sigterm() -> None:
    """Make SIGTERM (`kill`, a job scheduler's stop) end the benchmark by an exception
    instead of at once, so that the run in progress unwinds through its cleanup: worker
    processes stopped, shared memory unlinked. SystemExit, not the KeyboardInterrupt of
    Ctrl-C, which `time_limit` takes for the end of one run's time and goes on. A SIGTERM
    whose exception Python drops (raised inside a hook of the actors' fork) is sent again."""
    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    resend_if_lost(signal.SIGTERM, lambda e: isinstance(e, SystemExit) and e.code == 128 + signal.SIGTERM)


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Ends the block after `seconds` (None: no limit) as Ctrl-C ends a run: a
    KeyboardInterrupt from SIGALRM in the main thread, caught here, so that the run's
    results so far stand. A timer, not a thread: the actor processes fork from this one."""
    if seconds is None:
        yield
        return

    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except KeyboardInterrupt:
        pass
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
