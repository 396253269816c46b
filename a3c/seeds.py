"""Several seeds of one config, one run after another, in one parent folder:

    for agent, run_dir in seed_runs("cartpole", [1, 2, 3], ["total_timesteps=200000"]):
        agent.learn(run_dir=run_dir)   # runs/cartpole-<time>/seed-1, seed-2, seed-3

One at a time, not side by side: each run already keeps every core busy with its actors
and learners, so runs side by side would only share the cores and slow each other, and
their wall-time curves would no longer say how fast one run is. `a3c plot` draws the
parent folder as one curve, the mean over its seeds.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from .api import A3C, new_run_dir
from .config import Config, ConfigError, load_config

__all__ = ["seed_runs"]


def seed_runs(config: str | os.PathLike | dict | Config, seeds: Sequence[int],
              overrides: Sequence[str] | Mapping[str, Any] = (),
              env: Callable | None = None) -> Iterator[tuple[A3C, Path]]:
    """An agent for each seed, made as its turn comes, and the folder to train it in:
    `<run_root>/<name>-<time>/seed-<seed>`. The config and its overrides are checked once,
    for every seed, and the first agent's environment before the parent folder is made;
    a parent folder that no run was written into is removed as the loop ends (wrap it in
    `contextlib.closing` where the loop may stop early)."""
    seeds = list(seeds)
    given = overrides.keys() if isinstance(overrides, Mapping) else \
        [item.partition("=")[0].strip() for item in ([overrides] if isinstance(overrides, str) else overrides)]
    if "seed" in given:
        raise ConfigError(["seed: the seeds are given as a list (--seeds); drop the seed override"])
    if not seeds or len(set(seeds)) < len(seeds):
        raise ConfigError([f"seeds {' '.join(map(str, seeds))}: give one seed or more, each once"])
    base = load_config(config, overrides)
    configs = [load_config(dataclasses.replace(base, seed=seed)) for seed in seeds]  # seed's range
    parent = None
    try:
        for seed, cfg in zip(seeds, configs):
            agent = A3C(cfg, env=env)  # the preflight: before the parent folder, for the first
            if parent is None:
                parent = new_run_dir(cfg)
            yield agent, parent / f"seed-{seed}"
    finally:
        if parent is not None:
            with contextlib.suppress(OSError):  # only while empty: no run was written into it
                parent.rmdir()
