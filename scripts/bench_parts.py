"""Where the time goes on image tasks: env steps/s of a short training run and the cores
each part of it keeps busy, beside the environment alone stepping random actions in one
process (what an actor cannot beat).

    CarRacing-v3  96x96x3 RGB, continuous actions; a config that sets only env.id
    MinAtar       10x10x4 bool grids (configs/minatar_breakout.yaml)
    Pong          84x84x4 grayscale, frame skip 4 (configs/pong.yaml)

Each run trains for a fixed number of env steps, one run at a time; the parts are the
trainer's own timers (seconds summed over workers, divided by the run's wall time), the
figures a run charts as perf/cores_*.

With --before REV, each task also runs on the code at git revision REV (checked out and
built in a temporary worktree, run in a child process with that tree first on the path),
and the table puts before and after side by side. Code from before `env.imports` cannot
reach MinAtar's ids, which register only through a gymnasium.envs hook: the child runs
that hook at start-up (a sitecustomize in a temporary folder), and the task gives the
config a user of that code could write (env.id, and model.cnn false as its error said:
its CNN needed 36x36 images).

    python scripts/bench_parts.py                     # about 5 minutes on 2 cores
    python scripts/bench_parts.py --tasks carracing --steps 40000
    python scripts/bench_parts.py --before ab480b8    # about 12 minutes
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from machine import exit_on_sigterm, machine  # scripts/machine.py

ROOT = Path(__file__).resolve().parents[1]
PARTS = {"actor_env_s": "actors: envs.step", "actor_policy_s": "actors: policy work",
         "actor_queue_s": "actors: waiting in put_many", "learner_update_s": "learner: update",
         "learner_queue_s": "learner: waiting in get_many"}
COSTS = ("actor_env_s", "actor_policy_s", "learner_update_s")


@dataclass(frozen=True)
class Task:
    config: str | dict  # a shipped config (relative to the code's tree), or a config a user writes
    steps: int  # env steps of the training run
    requires: str  # the module the environment needs
    before: str | dict | None = None  # the config for code older than `config` (default: the same)


TASKS = {
    "carracing": Task({"env": {"id": "CarRacing-v3"}}, 20_000, "Box2D"),
    "minatar": Task("configs/minatar_breakout.yaml", 150_000, "minatar",
                    before={"env": {"id": "MinAtar/Breakout-v1"}, "model": {"cnn": False}}),
    "pong": Task("configs/pong.yaml", 30_000, "ale_py"),
}
# Code from before env.imports: every process runs the gymnasium.envs hooks of the tasks with a
# `before` config (the packages that register their ids only that way).
HOOKS = """import importlib.metadata, os
for hook in importlib.metadata.entry_points(group="gymnasium.envs"):
    if hook.module.partition(".")[0] in os.environ["BENCH_PARTS_HOOKS"].split(","):
        hook.load()()
"""


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


def profile(config: str | dict, steps: int, seconds: float) -> dict:
    """One run of `config` on the `a3c` this process imports (a shipped config's path is
    relative to that package's tree)."""
    import a3c
    from a3c import A3C
    from a3c.metrics import MemorySink

    if isinstance(config, str):
        config = str(Path(a3c.__file__).resolve().parents[1] / config)
    with tempfile.TemporaryDirectory() as runs:
        agent = A3C(config, total_timesteps=steps, logging__run_root=runs,
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


def profile_before(rev: str, tasks: dict[str, Task], seconds: float) -> dict:
    """Each task's profile on the code at `rev`, from child processes on a built worktree."""
    with tempfile.TemporaryDirectory() as tmp:
        tree, hooks = Path(tmp) / "tree", Path(tmp) / "hooks"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(tree), rev],
                       check=True)
        try:
            subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree,
                           check=True, stdout=subprocess.DEVNULL)
            hooks.mkdir()
            (hooks / "sitecustomize.py").write_text(HOOKS)
            env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{hooks}",
                   "BENCH_PARTS_HOOKS": ",".join(t.requires for t in tasks.values() if t.before)}
            rows = {}
            for name, task in tasks.items():
                spec = json.dumps({"config": task.before or task.config, "steps": task.steps})
                child = subprocess.run([sys.executable, __file__, "--child", spec, "--alone-s", str(seconds)],
                                       cwd=tree, env=env, check=True, stdout=subprocess.PIPE, text=True)
                rows[name] = json.loads(child.stdout.splitlines()[-1])
                report(f"{name} before", task.steps, rows[name])
            return rows
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=True)


def report(name: str, steps: int, r: dict) -> None:
    print(f"{name}: {steps} env steps in {r['wall']:.1f} s, {r['sps']:.0f} env steps/s "
          f"({r['actors']}); the environment alone {r['alone']:.0f} steps/s in one process", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--steps", type=int, help="env steps of each training run (default: per task)")
    parser.add_argument("--alone-s", type=float, default=5.0, help="seconds of the environment alone")
    parser.add_argument("--before", metavar="REV", help="also run each task on the code at git revision REV")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one profile as JSON, for --before
    args = parser.parse_args()
    exit_on_sigterm()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(profile(spec["config"], spec["steps"], args.alone_s)))
        return
    print(machine("torch", "gymnasium", "ale-py", "minatar"), flush=True)
    tasks = {}
    for name in args.tasks:
        task = TASKS[name]
        if importlib.util.find_spec(task.requires) is None:
            print(f"{name}: skipped, {task.requires} is not installed")
            continue
        tasks[name] = replace(task, steps=args.steps) if args.steps else task
    before = profile_before(args.before, tasks, args.alone_s) if args.before and tasks else {}
    rows = {}
    for name, task in tasks.items():
        rows[name] = profile(task.config, task.steps, args.alone_s)
        report(name, task.steps, rows[name])
    if before:  # columns in pairs: each task before, then after
        rows = {label: r for name in rows
                for label, r in ((f"{name} before", before[name]), (f"{name} after", rows[name]))}
    if not rows:
        return
    width = max(11, *(len(name) + 2 for name in rows))
    print(f"\n{'cores busy (of ' + str(len(os.sched_getaffinity(0))) + ')':44}"
          + "".join(f"{name:>{width}}" for name in rows))
    for part, label in PARTS.items():
        print(f"{label:44}" + "".join(f"{r[part]:{width}.2f}" for r in rows.values()))
    print(f"{'env steps/s':44}" + "".join(f"{r['sps']:{width}.0f}" for r in rows.values()))
    print(f"{'gradient steps/s':44}" + "".join(f"{r['updates_per_s']:{width}.1f}" for r in rows.values()))
    print(f"{'one environment alone, steps/s':44}" + "".join(f"{r['alone']:{width}.0f}" for r in rows.values()))
    print("\ncore-ms per 1 000 env steps (the work, not the waits)")
    for part in COSTS:
        print(f"{PARTS[part]:44}" + "".join(f"{r[part] / r['sps'] * 1e6:{width}.1f}" for r in rows.values()))

if __name__ == "__main__":
    main()
