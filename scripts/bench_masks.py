"""Action masks: this trainer against sb3-contrib's MaskablePPO on a task that needs masks,
side by side in one run, and what a mask costs in env steps per second.

The task is ChooseBest (tests/mask_envs.py): each step 3 of 8 actions are valid, and only
the masks (from an `action_masks()` method, MaskablePPO's convention) say which; reward 1
for the valid action the observed context ranks first. 20 steps an episode: a random
valid choice scores about 6.7, the best policy 20. The threshold, 19, is the best choice
in 95 % of the steps. Each run trains its whole budget (no early stop), one at a time;
the figure is the wall time from launch (building the agent) until the mean return of
the last 100 episodes first reaches the threshold, with the final last-100 mean.

MaskablePPO runs with the RL Zoo's tuned PPO settings for CartPole-v1 (the zoo has none
for this task; they are its settings for a small discrete task of this size), on 8
environments, torch on one thread. This trainer runs the defaults with the settings that
PPO's have and its defaults lack for a task of short horizons (gamma 0.98, lambda 0.8),
and fragments, minibatches and a learning rate chosen here for this task
(docs/notes/2026-12-07-action-masks.md has the sweep).

The mask's cost: this trainer's env steps/s on CartPole-v1 as it is, and with a wrapper
that adds an `action_masks()` method allowing every action (the same episodes, plus the
mask's reading, storing, transfer and use), 3 runs each, alternating.

    python scripts/bench_masks.py                     # about 10 minutes on 2 cores
    python scripts/bench_masks.py --seeds 1 --only a3c --no-cost
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
from bench_train import Result, fmt_hit  # scripts/bench_train.py
from machine import exit_on_sigterm, machine

ROOT = Path(__file__).resolve().parents[1]
# The task is a test environment: actor processes import it by name, so its folder goes
# on their path too.
sys.path.insert(0, str(ROOT / "tests"))
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")]))
from mask_envs import ChooseBest  # noqa: E402  (tests/mask_envs.py)

A3C_SETTINGS = {"learners__gamma": 0.98, "vtrace__td_lambda": 0.8, "optim__lr": 3e-3,
                "actors__unroll_length": 8, "learners__minibatches": 2}
THRESHOLD = 19.0
BUDGET = 100_000
CARTPOLE_ZOO = {"n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20,
                "ent_coef": 0.0, "learning_rate": 1e-3, "clip_range": 0.2}  # linear schedules, as the zoo's


def run_a3c(seed: int, budget: int) -> Result:
    from a3c import A3C
    from a3c.metrics import MemorySink

    class Episodes(MemorySink):
        def scalar(self, tag, value, step):
            if tag == "charts/episodic_return":
                result.episode(step, value)

    result = Result(THRESHOLD)
    agent = A3C({"env": {"id": "ChooseBest"}}, env=ChooseBest, seed=seed, logging__progress=False,
                checkpoint__interval_s=0, logging__run_root="/tmp/a3c-bench-runs", **A3C_SETTINGS)
    agent.learn(budget, sink=Episodes())
    return result.finish(agent.num_timesteps)


def run_maskable_ppo(seed: int, budget: int) -> Result:
    import torch
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)

    class Episodes(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    result.episode(self.num_timesteps, info["episode"]["r"])
            return True

    def linear(start):
        return lambda progress: progress * start

    result = Result(THRESHOLD)
    hp = dict(CARTPOLE_ZOO, learning_rate=linear(CARTPOLE_ZOO["learning_rate"]),
              clip_range=linear(CARTPOLE_ZOO["clip_range"]))
    env = make_vec_env(ChooseBest, n_envs=8, seed=seed)
    model = MaskablePPO("MlpPolicy", env, seed=seed, device="cpu", **hp)
    model.learn(budget, callback=Episodes())
    return result.finish(model.num_timesteps)


class AllValid(gym.Wrapper):
    """CartPole with an action_masks() method that allows every action."""

    def action_masks(self):
        return np.ones(self.action_space.n, np.int8)


def all_valid_cartpole():
    return AllValid(gym.make("CartPole-v1"))


def steps_per_s(masked: bool, budget: int = 200_000) -> float:
    from a3c import A3C

    env = {"env": all_valid_cartpole} if masked else {}
    agent = A3C("cartpole", **env, seed=1, logging__progress=False,
                checkpoint__interval_s=0, logging__run_root="/tmp/a3c-bench-runs")
    start = time.perf_counter()
    agent.learn(budget)
    return agent.num_timesteps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--only", nargs="+", choices=["a3c", "maskable-ppo"], default=["a3c", "maskable-ppo"])
    parser.add_argument("--budget", type=int, default=BUDGET)
    parser.add_argument("--no-cost", action="store_true", help="skip the steps/s with and without masks")
    args = parser.parse_args()
    exit_on_sigterm()
    print(machine("numpy", "torch", "gymnasium", "stable-baselines3", "sb3-contrib"))
    print(f"\n== ChooseBest: threshold {THRESHOLD:g}, budget {args.budget} steps", flush=True)
    runs = {"a3c": run_a3c, "maskable-ppo": run_maskable_ppo}
    table: dict[str, list[Result]] = {}
    for method in args.only:
        for seed in args.seeds:
            r = runs[method](seed, args.budget)
            table.setdefault(method, []).append(r)
            print(f"{method:12} seed {seed}: reached at {fmt_hit(r.hit)}; final {r.final:5.2f} "
                  f"({'solved' if r.solved else 'NOT solved'}); {r.steps / r.wall:6.0f} steps/s", flush=True)
    walls = {}
    for method, rows in table.items():
        hits = [r.hit for r in rows if r.hit]
        walls[method] = statistics.median(h[0] for h in hits) if len(hits) == len(rows) else float("nan")
        print(f"{method}: {len(hits)}/{len(rows)} reached, {sum(r.solved for r in rows)}/{len(rows)} ended solved; "
              f"median wall {walls[method]:.1f} s, steps {statistics.median(h[1] for h in hits) if hits else float('nan'):.0f}")
    if len(walls) == 2:
        print(f"a3c median wall to {THRESHOLD:g} / MaskablePPO's = {walls['a3c'] / walls['maskable-ppo']:.2f}")
    if not args.no_cost:
        rates: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(3):
            for masked in (False, True):
                rates[masked].append(steps_per_s(masked))
        plain, masked = (statistics.median(rates[m]) for m in (False, True))
        print(f"\nCartPole-v1 env steps/s, median of 3: without masks {plain:.0f}, with an all-valid mask "
              f"{masked:.0f} ({masked / plain - 1:+.1%}); runs: {rates}")


if __name__ == "__main__":
    main()
