"""What evaluation while training (the eval section) costs a run: env steps/s of a config
with it off and on, the runs one at a time and alternating, so that drifts in the
machine's speed spread over both. A run's rate is measured over its training: from the
monitor's first write to its last one before the run ends (the final evaluation comes
after, and is counted in the wall time).

    python scripts/bench_eval.py                                   # CartPole, every 50 000 steps
    python scripts/bench_eval.py --interval 25000 --variants off process thread

`thread` plays the evaluator's loop in a thread of the trainer instead of a process of
its own: the design a3c.evaluator rejects, measured here to say why.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine  # noqa: E402  (scripts/machine.py)

import a3c.evaluator  # noqa: E402
import a3c.procs  # noqa: E402
from a3c import A3C  # noqa: E402
from a3c.metrics import MemorySink  # noqa: E402


class Timed(MemorySink):
    """Keeps when each perf/sps was written: (seconds, env steps)."""

    def __init__(self):
        super().__init__()
        self.writes: list[tuple[float, int]] = []

    def scalar(self, tag, value, step):
        if tag == "perf/sps":
            self.writes.append((time.monotonic(), step))
        super().scalar(tag, value, step)


class _InThread:
    """A multiprocessing context whose Process is a thread: the evaluator in the trainer."""

    def get_start_method(self) -> str:
        return "fork"

    def Process(self, target, name, daemon, args):  # noqa: N802 (multiprocessing's name)
        return threading.Thread(target=target, name=name, daemon=daemon, args=args)


def run(config: str, variant: str, interval: int, seed: int, timesteps: int | None) -> dict:
    in_thread = variant == "thread"
    a3c.evaluator.worker_context = _InThread if in_thread else a3c.procs.worker_context
    a3c.evaluator.as_worker_process = (lambda: None) if in_thread else a3c.procs.as_worker_process
    overrides = {} if variant == "off" else {"eval__interval_steps": interval}
    sink = Timed()
    started = time.monotonic()
    agent = A3C(config, seed=seed, logging__progress=False, logging__interval_s=1.0, checkpoint__interval_s=0,
                logging__run_root="/tmp/a3c-bench-runs", **overrides)
    agent.learn(timesteps, sink=sink)
    wall = time.monotonic() - started
    (t0, s0), (t1, s1) = sink.writes[0], sink.writes[-2]  # the last one is written after the end
    return {"sps": (s1 - s0) / (t1 - t0), "wall": wall, "evaluations": len(sink.scalars.get("eval/mean_return", []))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="cartpole")
    parser.add_argument("--interval", type=int, default=50_000, help="eval.interval_steps of the runs with it")
    parser.add_argument("--variants", nargs="+", default=["off", "process"], choices=["off", "process", "thread"])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each variant, seeds 1, 2, ...")
    parser.add_argument("--timesteps", type=int, help="env steps per run (default: the config's)")
    args = parser.parse_args()
    print(machine("torch", "gymnasium"), flush=True)
    results: dict[str, list[dict]] = {v: [] for v in args.variants}
    for seed in range(1, args.rounds + 1):
        for variant in args.variants:
            r = run(args.config, variant, args.interval, seed, args.timesteps)
            results[variant].append(r)
            print(f"seed {seed} {variant:8s} {r['sps']:8.0f} env steps/s  {r['wall']:6.1f} s  "
                  f"{r['evaluations']} evaluations  (load {os.getloadavg()[0]:.1f})", flush=True)
    base = statistics.median(r["sps"] for r in results[args.variants[0]])
    for variant, rows in results.items():
        sps = statistics.median(r["sps"] for r in rows)
        wall = statistics.median(r["wall"] for r in rows)
        print(f"{variant:8s} median {sps:8.0f} env steps/s ({sps / base:.3f} of {args.variants[0]}), "
              f"median wall {wall:.1f} s")


if __name__ == "__main__":
    main()
