"""Stop signals that land inside a hook of os.fork, where Python drops a handler's
exception (a3c.procs): sent again, they stop the command line and the benchmarks."""
import signal
import subprocess
import sys
from pathlib import Path

from conftest import signalled_in_a_fork_hook

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def test_sigterm_inside_a_fork_hook_still_stops_the_command_line_also_in_the_background():
    # in the background (nohup, `&` in a script) SIGINT is ignored: the stop must not need it
    proc = signalled_in_a_fork_hook("signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                    "from a3c.cli import stop_on_sigterm\nstop_on_sigterm()", signal.SIGTERM)
    assert "went on" not in proc.stdout and proc.stderr.rstrip().endswith("KeyboardInterrupt"), proc.stderr


def test_sigterm_inside_a_fork_hook_still_ends_the_benchmark():
    proc = signalled_in_a_fork_hook(f"sys.path.insert(0, {str(SCRIPTS)!r})\n"
                                    "import machine\nmachine.exit_on_sigterm()", signal.SIGTERM)
    assert proc.returncode == 128 + signal.SIGTERM and "went on" not in proc.stdout, proc.stderr


def test_a_stop_dropped_at_exit_is_not_sent_again():
    # At exit the program is ending anyway: sent again, the stop would cut short the
    # cleanup left (here the earlier-registered callback, which atexit runs second).
    child = ("import atexit, os, signal, time\nfrom a3c.cli import stop_on_sigterm\nstop_on_sigterm()\n"
             "atexit.register(lambda: (time.sleep(0.5), print('the next cleanup ran')))\n"
             "atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM))\n")
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=30)
    assert "the next cleanup ran" in proc.stdout, proc.stdout + proc.stderr
