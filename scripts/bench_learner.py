"""Learner updates/s on image models: the trainer's own Updater taking a config's update
(its batch of B fragments of T steps, its passes and minibatches, its optimizer) on the
CPU, for each `model.precision`, with the torch threads a learner of a 2-core machine
gets. The batch is Pong-shaped random bytes: the update's cost does not depend on what
the frames show.

    python scripts/bench_learner.py                               # configs/pong.yaml, about 1 minute
    python scripts/bench_learner.py --threads 1 2 --repeats 30
    python scripts/bench_learner.py --config configs/minatar_breakout.yaml
    python scripts/bench_learner.py --archs nature impala --threads 1

The first figure of each row is the median seconds per update over `--repeats` updates
(after 3 to warm up), the ratio is float32's median (of the same torso) over the row's.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import gymnasium as gym
import numpy as np
import torch

from a3c.config import load_config
from a3c.learners.batch import Batch
from a3c.learners.optim import build_optimizer
from a3c.learners.updater import Updater, step_queue
from a3c.models import build_model
from a3c.models.actor_critic import native_bfloat16
from a3c.trainer import COUNTERS, TIMERS
from replay import Counters

from machine import machine  # scripts/machine.py

SPACES = {"pong": (gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6)),
          "minatar": (gym.spaces.Box(0, 1, (10, 10, 4), bool), gym.spaces.Discrete(6))}


def random_batch(space: gym.Space, T: int, B: int, n_actions: int) -> Batch:
    rng = np.random.default_rng(0)
    high = 256 if space.dtype == np.uint8 else 2
    obs = torch.from_numpy(rng.integers(0, high, (T + 1, B, *space.shape)).astype(space.dtype))
    return Batch(obs=obs[:T], action=torch.from_numpy(rng.integers(0, n_actions, (T, B))),
                 reward=torch.from_numpy(rng.choice([-1.0, 0.0, 1.0], (T, B)).astype(np.float32)),
                 logp=torch.full((T, B), -float(np.log(n_actions))),
                 terminated=torch.zeros(T, B, dtype=torch.bool), truncated=torch.zeros(T, B, dtype=torch.bool),
                 trunc_value=torch.zeros(T, B), version=torch.zeros(T, B, dtype=torch.long),
                 bootstrap_obs=obs[T])


def seconds_per_update(cfg, spaces, arch: str, precision: str, repeats: int) -> float:
    torch.manual_seed(0)
    model = build_model(*spaces, dataclasses.replace(cfg.model, cnn_arch=arch, precision=precision)).share_memory()
    updater = Updater(cfg, model, build_optimizer(model, cfg.optim), Counters(COUNTERS, TIMERS), step_queue())
    batch = random_batch(spaces[0], cfg.actors.unroll_length, cfg.learners.batch_size, spaces[1].n)
    times = []
    for i in range(repeats + 3):
        start = time.perf_counter()
        updater.train(batch, is_fresh=True)
        if i >= 3:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/pong.yaml")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--precisions", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--archs", nargs="+", help="model.cnn_arch values (default: the config's)")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    cfg = load_config(args.config)
    spaces = SPACES["minatar" if "minatar" in args.config else "pong"]
    steps = cfg.actors.unroll_length * cfg.learners.batch_size
    print(machine("torch"))
    print(f"bfloat16 in hardware: {native_bfloat16('cpu')}; {args.config}: {steps} steps per update "
          f"({cfg.learners.batch_size} fragments of {cfg.actors.unroll_length}), {cfg.learners.epochs} "
          f"pass(es) in {cfg.learners.minibatches} minibatch(es), {cfg.optim.name}\n")
    print(f"{'threads':>7}  {'cnn_arch':<8}  {'precision':<9}  {'s/update':>8}  {'updates/s':>9}  {'steps/s':>8}  "
          f"ratio")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for arch in args.archs or [cfg.model.cnn_arch]:
            base = None
            for precision in args.precisions:
                seconds = seconds_per_update(cfg, spaces, arch, precision, args.repeats)
                base = base or seconds
                print(f"{threads:>7}  {arch:<8}  {precision:<9}  {seconds:8.3f}  {1 / seconds:9.2f}  "
                      f"{steps / seconds:8.0f}  {base / seconds:.2f}", flush=True)


if __name__ == "__main__":
    main()
