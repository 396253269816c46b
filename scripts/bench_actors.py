"""Actor-side env steps/s on Atari, the learner left out: actor processes that each step
their vector of environments with the policy (the actors' own loop, a3c.actors.loop, with
the config's model and its precision) and drop the fragments, for `--seconds` each. Two
figures: env steps/s of the actors (policy and environments), and of the environments
alone (steps over the seconds spent in envs.step, summed over actors).

Side by side in one run, rounds alternating the settings, medians of the rounds:
- env.atari_backend ale (one ale_py AtariVectorEnv per actor, C++ threads) against
  gymnasium (AtariPreprocessing and FrameStackObservation in a SyncVectorEnv);
- how the environments are laid out: one actor of 16 against 2 of 8 and 4 of 4 (--layouts).
With --no-policy, processes step their environments with random actions and nothing else:
what the backends cost, without the CNN's forward pass.

    python scripts/bench_actors.py                  # Pong, about 4 minutes on 2 cores
    python scripts/bench_actors.py --layouts 1x16 2x8 --rounds 5 --seconds 15
    python scripts/bench_actors.py --no-policy --layouts 1x8 1x16 2x8
"""
from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import statistics
import time

import numpy as np
import torch

from a3c.actors.loop import ActorLoop, fragment_dtype
from a3c.config import load_config
from a3c.envs import make_vector_env
from a3c.models import build_model

from machine import machine  # scripts/machine.py


def environments(cfg, seconds: float, seed: int, out) -> None:
    """One process stepping its vector of environments with random actions, no policy."""
    envs = make_vector_env(cfg.env, cfg.actors.envs_per_actor)
    try:
        envs.reset(seed=seed)
        envs.action_space.seed(seed)
        actions = [envs.action_space.sample() for _ in range(64)]
        envs.step(actions[0])
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            envs.step(actions[steps % 64])
            steps += 1
        rate = steps * envs.num_envs / (time.perf_counter() - start)
        out.put((rate, rate))
    finally:
        envs.close()


def actor(cfg, seconds: float, seed: int, out) -> None:
    """One actor: unroll for `seconds` after one unroll of warm-up; put (env steps/s, env
    steps per second in envs.step) on `out`."""
    torch.set_num_threads(1)  # as a3c's actor processes
    envs = make_vector_env(cfg.env, cfg.actors.envs_per_actor)
    try:
        policy = build_model(envs.single_observation_space, envs.single_action_space, cfg.model)
        loop = ActorLoop(envs, policy.requires_grad_(False), cfg.actors.unroll_length, seed)
        buf = np.zeros(loop.E, fragment_dtype(envs.single_observation_space, envs.single_action_space,
                                              loop.T))
        loop.unroll(buf, 0)
        steps, env_s, start = 0, 0.0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            env_s += loop.unroll(buf, 0).env_s
            steps += buf.size * loop.T
        out.put((steps / (time.perf_counter() - start), steps / env_s))
    finally:
        envs.close()


def steps_per_s(cfg, seconds: float, target=actor) -> tuple[float, float]:
    """(env steps/s, env steps/s in envs.step) of cfg.actors.num actor processes stepping
    at once, summed over them."""
    ctx, results = mp.get_context("fork"), mp.get_context("fork").Queue()
    procs = [ctx.Process(target=target, args=(cfg, seconds, 1000 * i, results)) for i in range(cfg.actors.num)]
    for p in procs:
        p.start()
    rates = [results.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    return sum(r[0] for r in rates), sum(r[1] for r in rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/pong.yaml")
    parser.add_argument("--backends", nargs="+", default=["ale", "gymnasium"])
    parser.add_argument("--layouts", nargs="+", default=["1x16", "2x8", "4x4"], help="actors x envs each")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--no-policy", action="store_true",
                        help="step the environments with random actions, without the policy and the loop")
    args = parser.parse_args()
    base = load_config(args.config)
    print(machine("torch", "gymnasium", "ale-py"))
    print(f"{args.config}: fragments of {base.actors.unroll_length} steps, model.precision "
          f"{base.model.precision}; {args.rounds} rounds of {args.seconds:.0f} s\n", flush=True)
    settings = [(backend, layout) for layout in args.layouts for backend in args.backends]
    rows: dict[tuple[str, str], list[tuple[float, float]]] = {s: [] for s in settings}
    for _ in range(args.rounds):
        for backend, layout in settings:
            num, envs = map(int, layout.split("x"))
            cfg = dataclasses.replace(
                base, env=dataclasses.replace(base.env, atari_backend=backend),
                actors=dataclasses.replace(base.actors, num=num, envs_per_actor=envs))
            rows[backend, layout].append(steps_per_s(cfg, args.seconds, environments if args.no_policy else actor))
    print(f"{'layout':>6}  {'backend':<10}  {'actors, steps/s':>15}  {'ratio':>5}  {'envs.step alone':>15}  "
          f"{'ratio':>5}  rounds (actors)")
    for backend, layout in settings:
        actors, alone = (statistics.median(r[i] for r in rows[backend, layout]) for i in (0, 1))
        base = rows.get(("gymnasium", layout))
        ratios = [f"{x / statistics.median(r[i] for r in base):.2f}" if base else "" for i, x in enumerate((actors, alone))]
        print(f"{layout:>6}  {backend:<10}  {actors:15.0f}  {ratios[0]:>5}  {alone:15.0f}  {ratios[1]:>5}  "
              f"{' '.join(f'{r[0]:.0f}' for r in rows[backend, layout])}")


if __name__ == "__main__":
    main()
