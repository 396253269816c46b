"""The tests' one polling helper: wait for a condition another thread or process makes true."""
import time


def wait_until(predicate, timeout=10.0, what="a condition"):
    """Return once `predicate()` is true; fail the test naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)
