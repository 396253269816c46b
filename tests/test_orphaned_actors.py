"""A trainer that dies without stopping its workers (SIGKILL, or a SIGTERM whose handler
never ran) takes them with it: actor and learner processes end with their parent, instead
of waiting on the queue forever."""
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import A3C_CLI, children, running
from waiting import wait_until

from replay import remove_stale_segments

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("learners", ["thread", "process"])
def test_actor_and_learner_processes_end_when_the_trainer_is_killed(learners, tmp_path):
    workers = 2 if learners == "thread" else 4  # the actors, and two learner processes
    trainer = subprocess.Popen(
        [*A3C_CLI, "train", str(ROOT / "configs" / "cartpole.yaml"), "total_timesteps=100000000",
         "logging.progress=false", f"logging.run_root={tmp_path}", "checkpoint.interval_s=0",
         f"learners.mode={learners}", "learners.num=2"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until(lambda: len(children(trainer.pid)) >= workers, timeout=60,
                   what=f"{workers} worker processes")
        actors = children(trainer.pid)
        time.sleep(0.5)  # acting
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(30)
        wait_until(lambda: not any(running(pid) for pid in actors), timeout=15,
                   what=f"the workers {actors} to end with their trainer")
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        remove_stale_segments()  # the trainer died before it could remove its own
