"""Checks shared by every test module, and the helpers several modules use (imported
with `from conftest import ...`, as `waiting` is)."""
import contextlib
import gc
import os
import signal
import subprocess
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="session", autouse=True)
def programs_under_test_take_ctrl_c():
    """The Ctrl-C tests send SIGINT to programs they start. A suite run from a background
    job (`pytest &` in a script) inherits SIGINT ignored, and so would those programs;
    with a handler here instead, they start with the default one."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture
def a3c_in_process(monkeypatch, capsys):
    """The command line run in this process: a function of its arguments (`"eval", run_dir,
    ...`) returning (exit code, stdout, stderr). The SIGTERM handler and the unraisable
    hook that the command line sets are put back."""
    from a3c.cli import main

    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    handler = signal.getsignal(signal.SIGTERM)

    def run(*args):
        try:
            main(list(map(str, args)))
            code = 0
        except SystemExit as exit:
            code = exit.code
        finally:
            signal.signal(signal.SIGTERM, handler)
        out, err = capsys.readouterr()
        return code, out, err

    return run


# The command line as installed (the `a3c` script next to this Python), or as a module.
_SCRIPT = Path(sys.executable).with_name("a3c")
A3C_CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "a3c.cli"]


def assert_one_line_error(code, stderr, *fragments):
    """The command line failed with exit code 2 and one line `error: ...` holding every
    fragment, and no traceback."""
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# ------------------------------------------------------------------------ shared memory
def own_segments() -> set[str]:
    """This process's queue and counter segments in /dev/shm (named rq-<pid>-<hex>)."""
    prefix = f"rq-{os.getpid()}-"
    return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}


def segments_of(pids) -> list[str]:
    """The /dev/shm segments made by any of `pids` (named rq-<creator pid>-<hex>)."""
    prefixes = tuple(f"rq-{pid}-" for pid in pids)
    return sorted(name for name in os.listdir("/dev/shm") if prefixes and name.startswith(prefixes))


@pytest.fixture(autouse=True)
def no_shared_memory_left():
    """Every test leaves no shared memory of this process behind."""
    before = own_segments()
    yield
    left = own_segments() - before
    if left:  # a collection releases what only garbage held; it costs a tenth of a second
        gc.collect()
        left = own_segments() - before
    assert not left, f"shared memory left behind: {sorted(left)}"


# ---------------------------------------------------------------------------- processes
def _stat(pid) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, ...), or None
    once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()  # the name, in parentheses, may hold spaces


@contextlib.contextmanager
def own_process_group(args, **kwargs):
    """A subprocess in a process group of its own, as a terminal starts a job (so that a
    signal to the group reaches all its processes); if it still runs when the block ends,
    its whole group is killed, so that no test leaves a process behind."""
    proc = subprocess.Popen(args, start_new_session=True, **kwargs)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def signalled_in_a_fork_hook(setup: str, signum: int, sleep_s: float = 10.0) -> subprocess.CompletedProcess:
    """A Python child that runs `setup`, forks with a hook that sends it `signum` (where
    logging's hooks run as a trainer forks its actors, a handler's exception is dropped),
    then sleeps `sleep_s` and prints "went on"; the finished process."""
    child = (f"import os, signal, sys, time\n{setup}\n"
             f"os.register_at_fork(after_in_parent=lambda: os.kill(os.getpid(), {int(signum)}))\n"
             "pid = os.fork()\nif pid == 0:\n    os._exit(0)\n"
             f"os.waitpid(pid, 0)\ntime.sleep({sleep_s})\nprint('went on')\n")
    return subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=sleep_s + 30)


def run_killing_its_actor(trainer, timeout: float = 60.0) -> tuple[dict, int]:
    """Train `trainer` (a run of one actor process) in a thread, SIGKILL the actor once it
    has acted, and wait for the run to end without an error: (its counters, the killed pid)."""
    import multiprocessing as mp
    import threading

    from waiting import wait_until

    result, errors = {}, []

    def train():
        try:
            result.update(trainer.train())
        except BaseException as error:  # reported below
            errors.append(error)

    thread = threading.Thread(target=train)
    thread.start()
    try:
        wait_until(lambda: trainer.counters["env_steps"] > 0 or not thread.is_alive(), timeout, "the actor to act")
        assert thread.is_alive(), f"the run ended before its actor acted: {errors}"
        (actor,) = [p for p in mp.active_children() if p.name.startswith("a3c-actor-")]
        os.kill(actor.pid, signal.SIGKILL)
    finally:
        thread.join(120)
    assert not thread.is_alive() and not errors, errors
    return result, actor.pid


def running(pid) -> bool:
    """True while `pid` exists and is not a zombie (a zombie has exited; only its parent's
    wait is missing, which for an orphan is up to whoever adopted it)."""
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def children(pid) -> list[int]:
    """Pids whose parent is `pid`, read from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(entry)
            if fields is not None and int(fields[1]) == pid:
                out.append(int(entry))
    return out


def descendants(pid) -> list[int]:
    """Children of `pid`, their children, and so on."""
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


@pytest.fixture(scope="module")
def stop_the_fork_server():
    """Actor processes come from multiprocessing's fork server; stop it when the module is
    done so that no child of the test process remains. Use it with
    `pytestmark = pytest.mark.usefixtures("stop_the_fork_server")`."""
    yield
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


def fail_to_start(monkeypatch, name: str) -> list:
    """Make the start of the process named `name` fail as a fork that finds no memory
    does; return the list of the processes started, as they start."""
    import multiprocessing as mp

    start, started = mp.process.BaseProcess.start, []

    def start_unless_named(process):
        if process.name == name:
            raise OSError(12, "Cannot allocate memory")
        start(process)
        started.append(process)

    monkeypatch.setattr(mp.process.BaseProcess, "start", start_unless_named)
    return started


# ------------------------------------------------------------------------ replay buffers
VALUE = np.dtype([("v", "i8")])


def values(start, stop) -> np.ndarray:
    """Records of VALUE holding start, start + 1, ..., stop - 1."""
    items = np.zeros(stop - start, VALUE)
    items["v"] = np.arange(start, stop)
    return items


def chi_square_limit(df) -> float:
    """The 99.9 % quantile of chi-square with df degrees of freedom (Wilson-Hilferty)."""
    z = 3.090
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


# ------------------------------------------------------------------------ learning
WINDOW = 100  # episodes in a learning curve's running mean


def means(episodes):
    """(env step, mean of the last WINDOW returns) after every episode from the WINDOW-th on,
    for episodes as (env step, return) pairs, such as a MemorySink's charts/episodic_return."""
    window = deque(maxlen=WINDOW)
    for step, ret in episodes:
        window.append(ret)
        if len(window) == WINDOW:
            yield step, sum(window) / WINDOW


@dataclass
class Hold:
    """How a run held a threshold: the env step its last-WINDOW mean first reached it, the
    lowest mean from then on and its env step, and the final mean."""
    reached_at: int
    lowest: float
    lowest_at: int
    final: float

    def __str__(self) -> str:
        return (f"reached at step {self.reached_at}; lowest last-{WINDOW} mean after that "
                f"{self.lowest:.1f} (step {self.lowest_at}); final {self.final:.1f}")


def hold(episodes, threshold) -> Hold | None:
    """How the run of `episodes` (as for `means`) held `threshold`; None if it never reached it."""
    curve = list(means(episodes))
    first = next((i for i, (_, mean) in enumerate(curve) if mean >= threshold), None)
    if first is None:
        return None
    lowest_at, lowest = min(curve[first:], key=lambda point: point[1])
    return Hold(curve[first][0], lowest, lowest_at, curve[-1][1])


# The modules whose tests run the command line, start a Ray cluster, build and run the
# native stress harness, or kill and restart processes: a second or more each. They are
# marked `system`, so that `-m "not slow and not learning and not system"` is the fast
# selection for development.
SYSTEM_MODULES = {"test_atari", "test_bench_train", "test_cli", "test_dying_consumer", "test_dying_producer",
                  "test_dying_writer", "test_example_apex", "test_learner_processes", "test_lunarlander",
                  "test_mujoco", "test_native_stress", "test_orphaned_actors", "test_ray", "test_readme",
                  "test_shm_leaks", "test_signals", "test_spaces_end_to_end", "test_tune", "test_video"}


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.stem in SYSTEM_MODULES:
            item.add_marker(pytest.mark.system)
