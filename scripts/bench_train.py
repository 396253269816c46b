"""Time to solve CartPole-v1: this trainer against Stable-Baselines3 A2C and PPO.

For each seed, measures wall-clock seconds and env steps until the mean return of the
last 100 episodes reaches 475 (budget 500k steps), side by side in one run, and prints
medians and ratios. Also prints training throughput against the raw throughput of the
same environments stepped with random actions on the same cores.

    python scripts/bench_train.py                 # 5 seeds
    python scripts/bench_train.py --seeds 1 2 3 --only a3c
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import numpy as np

TARGET, BUDGET = 475.0, 500_000


PARTS = {"actor_env_s": "actors: envs.step", "actor_policy_s": "actors: policy work",
         "actor_queue_s": "actors: waiting in put_many", "learner_update_s": "learner: update",
         "learner_queue_s": "learner: waiting in get_many"}
profiles: list[dict] = []  # cores busy per part, one dict per A3C run


def run_a3c(seed: int) -> tuple[float, int, bool]:
    from a3c import A3C

    start = time.perf_counter()
    agent = A3C("configs/cartpole.yaml", seed=seed, target_return=TARGET,
                logging__progress=False, logging__run_root="/tmp/a3c-bench-runs")
    agent.learn(BUDGET)
    wall = time.perf_counter() - start
    counters = agent.counters
    profiles.append({part: counters[part] / wall for part in PARTS})
    solved = len(agent.recent_returns) == 100 and np.mean(agent.recent_returns) >= TARGET
    return wall, agent.num_timesteps, solved


def run_sb3(algo: str, seed: int) -> tuple[float, int, bool]:
    import torch
    from stable_baselines3 import A2C, PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)

    class StopAtTarget(BaseCallback):
        def _on_step(self) -> bool:
            buf = self.model.ep_info_buffer
            return not (len(buf) == 100 and np.mean([e["r"] for e in buf]) >= TARGET)

    def linear(start):
        return lambda progress: progress * start

    start = time.perf_counter()
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    if algo == "ppo":  # RL Zoo hyperparams/ppo.yml
        model = PPO("MlpPolicy", env, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98,
                    n_epochs=20, ent_coef=0.0, learning_rate=linear(1e-3),
                    clip_range=linear(0.2), seed=seed, device="cpu")
    else:  # RL Zoo hyperparams/a2c.yml
        model = A2C("MlpPolicy", env, ent_coef=0.0, seed=seed, device="cpu")
    callback = StopAtTarget()
    model.learn(BUDGET, callback=callback)
    wall = time.perf_counter() - start
    buf = model.ep_info_buffer
    solved = len(buf) == 100 and np.mean([e["r"] for e in buf]) >= TARGET
    return wall, model.num_timesteps, solved


def raw_env_throughput(num_envs: int = 16, steps: int = 20_000) -> float:
    import gymnasium as gym

    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * num_envs)
    envs.reset(seed=0)
    start = time.perf_counter()
    for _ in range(steps // num_envs):
        envs.step(envs.action_space.sample())
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--only", choices=["a3c", "ppo", "a2c"], nargs="+",
                        default=["a3c", "ppo", "a2c"])
    args = parser.parse_args()
    runners = {"a3c": run_a3c, "ppo": lambda s: run_sb3("ppo", s),
               "a2c": lambda s: run_sb3("a2c", s)}
    results: dict[str, list] = {}
    for name in args.only:
        if name != "a3c" and importlib.util.find_spec("stable_baselines3") is None:
            print(f"{name}: stable-baselines3 is not installed, skipped")
            continue
        for seed in args.seeds:  # interleaving would make runs share the cores; run one at a time
            wall, steps, solved = runners[name](seed)
            results.setdefault(name, []).append((wall, steps, solved))
            print(f"{name} seed {seed}: {wall:6.1f} s, {steps:7d} steps, "
                  f"{'solved' if solved else 'NOT solved'}", flush=True)
    print(f"\n{'method':6} {'median s':>9} {'median steps':>13} {'solved':>7} {'steps/s':>9}")
    medians = {}
    for name, rows in results.items():
        wall = statistics.median(r[0] for r in rows)
        steps = statistics.median(r[1] for r in rows)
        medians[name] = wall
        print(f"{name:6} {wall:9.1f} {steps:13.0f} {sum(r[2] for r in rows):>4}/{len(rows)} "
              f"{steps / wall:9.0f}")
    if "a3c" in medians:
        for other in ("ppo", "a2c"):
            if other in medians:
                print(f"a3c time / {other} time: {medians['a3c'] / medians[other]:.2f}")
    if profiles:
        print("\nA3C time per part, cores busy (median over seeds):")
        for part, label in PARTS.items():
            print(f"  {label:30s} {statistics.median(p[part] for p in profiles):.2f}")
    print(f"raw CartPole throughput, random actions, 16 envs, 1 core: "
          f"{raw_env_throughput():.0f} steps/s")


if __name__ == "__main__":
    main()
