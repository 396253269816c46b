"""A trainer that dies without stopping its actors (SIGKILL, or a SIGTERM whose handler
never ran) takes them with it: actor processes end with their parent, instead of
waiting on the queue forever."""
import signal
import subprocess
import time
from pathlib import Path

from conftest import A3C_CLI, children, running
from waiting import wait_until

from replay import remove_stale_segments

ROOT = Path(__file__).resolve().parents[1]


def test_actor_processes_end_when_the_trainer_is_killed(tmp_path):
    trainer = subprocess.Popen(
        [*A3C_CLI, "train", str(ROOT / "configs" / "cartpole.yaml"), "total_timesteps=100000000",
         "logging.progress=false", f"logging.run_root={tmp_path}", "checkpoint.interval_s=0"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: len(children(trainer.pid)) >= 2, timeout=60, what="two actor processes")
        actors = children(trainer.pid)
        time.sleep(0.5)  # acting
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(30)
        wait_until(lambda: not any(running(pid) for pid in actors), timeout=15,
                   what=f"the actors {actors} to end with their trainer")
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        remove_stale_segments()  # the trainer died before it could remove its own
