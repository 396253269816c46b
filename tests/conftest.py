"""Checks shared by every test module."""
import gc
import os
import signal

import pytest


@pytest.fixture(scope="session", autouse=True)
def programs_under_test_take_ctrl_c():
    """The Ctrl-C tests send SIGINT to programs they start. A suite run from a background
    job (`pytest &` in a script) inherits SIGINT ignored, and so would those programs;
    with a handler here instead, they start with the default one."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


def own_segments() -> set[str]:
    """This process's queue and counter segments in /dev/shm (named rq-<pid>-<hex>)."""
    prefix = f"rq-{os.getpid()}-"
    return {name for name in os.listdir("/dev/shm") if name.startswith(prefix)}


@pytest.fixture(autouse=True)
def no_shared_memory_left():
    """Every test leaves no shared memory of this process behind."""
    before = own_segments()
    yield
    gc.collect()
    left = own_segments() - before
    assert not left, f"shared memory left behind: {sorted(left)}"
