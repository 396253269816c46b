"""Whether a run folder's policy held its task's threshold: the figures of
`bench_train.py --stability` (when the last-100 mean first reached the threshold, the
lowest last-100 mean from then on, the share of later episodes below the threshold, the
final mean), read from the episodes the run wrote to TensorBoard.

A run longer than one sitting can be trained with `a3c train` and resumed with
`a3c train --resume RUN`; each sitting writes its own event file, and the episodes an
interrupted sitting played after its last checkpoint, which the next sitting plays
again, are left out.

    python scripts/held.py runs/lunarlander-20261202-081629
    python scripts/held.py runs/my-run --threshold 195
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.proto import summary_pb2
from tensorboard.util import tensor_util

from bench_train import TASKS, Result, episode_limit


def scalars(event_file: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar of one event file, per tag, as (step, value, wall time) in the order written."""
    found: dict[str, list[tuple[int, float, float]]] = {}
    for event in EventFileLoader(str(event_file)).Load():
        for value in event.summary.value:
            if value.metadata.data_class == summary_pb2.DATA_CLASS_SCALAR:  # loaded as 0-d tensors
                number = tensor_util.make_ndarray(value.tensor).item()
                found.setdefault(value.tag, []).append((event.step, number, event.wall_time))
    return found


def episodes(run_dir: Path) -> tuple[list[tuple[int, float, int, float]], int]:
    """The run's episodes as (env step, return, length, wall time), sittings joined, and the
    number of sittings. A sitting starts from its checkpoint's step, the first step it
    writes: the episodes an earlier sitting wrote from there on are dropped."""
    files = [scalars(event_file) for event_file in run_dir.glob("events.out.tfevents.*")]
    if not files:
        sys.exit(f"error: {run_dir} has no TensorBoard event files; give a run folder a3c train wrote")
    played: list[tuple[int, float, int, float]] = []
    for found in sorted(filter(None, files), key=lambda found: min(v[0][2] for v in found.values())):
        returns, lengths = found.get("charts/episodic_return", []), found.get("charts/episode_length", [])
        start = min(step for values in found.values() for step, _, _ in values)
        played = [episode for episode in played if episode[0] < start]
        played += [(step, ret, int(length), wall)
                   for (step, ret, wall), (_, length, _) in zip(returns, lengths, strict=True)]
    return played, len(files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run folder (runs/NAME-DATE)")
    parser.add_argument("--threshold", type=float, default=None,
                        help="the return to hold (default: the benchmark's for the run's env.id)")
    args = parser.parse_args()
    if not (args.run_dir / "config.yaml").is_file():
        sys.exit(f"error: {args.run_dir} has no config.yaml; give a run folder a3c train wrote")
    env_id = yaml.safe_load((args.run_dir / "config.yaml").read_text())["env"]["id"]
    threshold = args.threshold if args.threshold is not None else \
        next((task.threshold for task in TASKS.values() if task.env_id == env_id), None)
    if threshold is None:
        sys.exit(f"error: the benchmark has no threshold for {env_id}; pass --threshold")
    played, sittings = episodes(args.run_dir)
    if not played:
        sys.exit(f"error: {args.run_dir} has no finished episodes yet")
    result = Result(threshold, time_limit=episode_limit(env_id))
    launch = played[0][3]
    for step, ret, length, _ in played:
        result.episode(step, ret, length)
    result.finish(played[-1][0])
    print(f"{args.run_dir.name}: {env_id}, {len(played)} episodes to {result.steps} env steps "
          f"in {sittings} sitting(s), threshold {threshold:g}")
    if result.hit is None:
        print(f"never reached {threshold:g}; final last-100 mean {result.final:.1f}")
        return
    step = result.hit[1]
    wall = next(wall for s, _, _, wall in played if s >= step) - launch
    held = "held" if result.lowest >= threshold else "not held"
    timed_out = f", of them {result.timed_out_share:.0%} at the time limit" \
        if result.time_limit and result.below else ""
    print(f"first reached at {step} env steps ({wall:.0f} s after the first episode); lowest after "
          f"{result.lowest:.1f} at {result.lowest_at} ({held}); {result.below_share:.2%} of the "
          f"{result.after} episodes after below {threshold:g}{timed_out}; final {result.final:.1f}")


if __name__ == "__main__":
    main()
