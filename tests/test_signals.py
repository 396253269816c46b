"""a3c.signals: a stop signal whose exception Python drops, because its handler ran inside
a hook of os.fork, is sent again and stops the program."""
import signal

from conftest import signalled_in_a_fork_hook


def test_a_ctrl_c_raised_inside_a_fork_hook_still_interrupts_the_main_thread():
    proc = signalled_in_a_fork_hook("from a3c.signals import resend_if_lost\n"  # as the command line does
                                    "resend_if_lost(signal.SIGINT, lambda e: isinstance(e, KeyboardInterrupt))",
                                    signal.SIGINT)
    assert "went on" not in proc.stdout and proc.stderr.rstrip().endswith("KeyboardInterrupt"), proc.stderr
