"""Where the time goes on image tasks: env steps/s of a short training run and the cores
each part of it keeps busy, beside the environment alone stepping random actions in one
process (what an actor cannot beat).

    CarRacing-v3  96x96x3 RGB, continuous actions; a config that sets only env.id
    MinAtar       10x10x4 bool grids (configs/minatar_breakout.yaml)
    Pong          84x84x4 grayscale, frame skip 4 (configs/pong.yaml)

Each run trains for a fixed number of env steps, one run at a time; the parts are the
trainer's own timers (seconds summed over workers, divided by the run's wall time), the
figures a run charts as perf/cores_*.

    python scripts/bench_parts.py                     # about 5 minutes on 2 cores
    python scripts/bench_parts.py --tasks carracing --steps 40000
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from machine import machine  # scripts/machine.py

ROOT = Path(__file__).resolve().parents[1]
PARTS = {"actor_env_s": "actors: envs.step", "actor_policy_s": "actors: policy work",
         "actor_queue_s": "actors: waiting in put_many", "learner_update_s": "learner: update",
         "learner_queue_s": "learner: waiting in get_many"}


@dataclass(frozen=True)
class Task:
    config: str | dict  # a shipped config, or the config a user who sets only env.id writes
    steps: int  # env steps of the training run
    requires: str  # the module the environment needs


TASKS = {
    "carracing": Task({"env": {"id": "CarRacing-v3"}}, 20_000, "Box2D"),
    "minatar": Task(str(ROOT / "configs" / "minatar_breakout.yaml"), 150_000, "minatar"),
    "pong": Task(str(ROOT / "configs" / "pong.yaml"), 30_000, "ale_py"),
}


def env_alone(cfg, seconds: float) -> float:
    """Steps per second of one environment of the config, random actions, this process."""
    from a3c.envs import make_env

    env = make_env(cfg.env)
    try:
        env.reset(seed=0)
        env.action_space.seed(0)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            steps += 1
            if terminated or truncated:
                env.reset()
        return steps / (time.perf_counter() - start)
    finally:
        env.close()


def profile(task: Task, seconds: float) -> dict:
    from a3c import A3C
    from a3c.metrics import MemorySink

    with tempfile.TemporaryDirectory() as runs:
        agent = A3C(task.config, total_timesteps=task.steps, logging__run_root=runs,
                    logging__progress=False, checkpoint__interval_s=0)
        alone = env_alone(agent.config, seconds)
        start = time.perf_counter()
        agent.learn(sink=MemorySink())
        wall = time.perf_counter() - start
    counters = agent.counters
    cfg = agent.config
    return {"alone": alone, "sps": counters["env_steps"] / wall, "wall": wall,
            "actors": f"{cfg.actors.num} {cfg.actors.mode} x {cfg.actors.envs_per_actor} envs",
            "updates_per_s": counters["updates"] / wall,
            **{part: counters[part] / wall for part in PARTS}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--steps", type=int, help="env steps of each training run (default: per task)")
    parser.add_argument("--alone-s", type=float, default=5.0, help="seconds of the environment alone")
    args = parser.parse_args()
    print(machine("torch", "gymnasium", "ale-py", "minatar"), flush=True)
    rows = {}
    for name in args.tasks:
        task = TASKS[name]
        if importlib.util.find_spec(task.requires) is None:
            print(f"{name}: skipped, {task.requires} is not installed")
            continue
        if args.steps:
            task = Task(task.config, args.steps, task.requires)
        rows[name] = profile(task, args.alone_s)
        r = rows[name]
        print(f"{name}: {task.steps} env steps in {r['wall']:.1f} s, {r['sps']:.0f} env steps/s "
              f"({r['actors']}); the environment alone {r['alone']:.0f} steps/s in one process", flush=True)
    if not rows:
        return
    print(f"\n{'cores busy (of ' + str(len(os.sched_getaffinity(0))) + ')':44}"
          + "".join(f"{name:>11}" for name in rows))
    for part, label in PARTS.items():
        print(f"{label:44}" + "".join(f"{r[part]:11.2f}" for r in rows.values()))
    print(f"{'env steps/s':44}" + "".join(f"{r['sps']:11.0f}" for r in rows.values()))
    print(f"{'gradient steps/s':44}" + "".join(f"{r['updates_per_s']:11.1f}" for r in rows.values()))
    print(f"{'one environment alone, steps/s':44}" + "".join(f"{r['alone']:11.0f}" for r in rows.values()))


if __name__ == "__main__":
    main()
