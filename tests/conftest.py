"""Checks shared by every test module."""
import gc
import os

import pytest


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
