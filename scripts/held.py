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

from bench_train import TASKS, WINDOW, Result, episode_limit


def scalars(event_file: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar of one event file, per tag, as (step, value, wall time) in the order written."""
    found: dict[str, list[tuple[int, float, float]]] = {}
    for event in EventFileLoader(str(event_file)).Load():
        for value in event.summary.value:
            if value.metadata.data_class == summary_pb2.DATA_CLASS_SCALAR:  # loaded as 0-d tensors
                number = tensor_util.make_ndarray(value.tensor).item()
                found.setdefault(value.tag, []).append((event.step, number, event.wall_time))
    return found


def episodes(run_dir: Path) -> tuple[list[tuple[int, float, int]], int]:
    """The run's episodes as (env step, return, length), sittings joined in the order they
    ran, and the number of sittings. Each sitting writes the step it starts from
    (perf/start_step; before that was written, its first step): the episodes an earlier
    sitting wrote from there on, played past the checkpoint it resumed from, are dropped."""
    files = [scalars(event_file) for event_file in run_dir.glob("events.out.tfevents.*")]
    sittings = sorted(filter(None, files), key=lambda found: min(v[0][2] for v in found.values()))
    played: list[tuple[int, float, int]] = []
    for found in sittings:
        returns, lengths = found.get("charts/episodic_return", []), found.get("charts/episode_length", [])
        start = found["perf/start_step"][0][0] if "perf/start_step" in found else \
            min(step for values in found.values() for step, _, _ in values)
        played = [episode for episode in played if episode[0] < start]
        # zip: a sitting killed between an episode's return and its length ends with one unpaired
        played += [(step, ret, int(length)) for (step, ret, _), (_, length, _) in zip(returns, lengths)]
    return played, len(sittings)


def threshold_of(cfg: dict, given: float | None) -> tuple[float, str]:
    """The threshold to judge the run by, and where it came from."""
    if given is not None:
        return given, "given"
    task = next((name for name, task in TASKS.items() if task.env_id == cfg["env"]["id"]), None)
    if task is None:
        sys.exit(f"error: the benchmark has no threshold for {cfg['env']['id']}; pass --threshold")
    return TASKS[task].threshold, f"the benchmark's {task} task"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a run folder (runs/NAME-DATE)")
    parser.add_argument("--threshold", type=float, default=None,
                        help="the return to hold (default: the benchmark's for the run's env.id)")
    args = parser.parse_args()
    try:
        cfg = yaml.safe_load((args.run_dir / "config.yaml").read_text())
        env_id = cfg["env"]["id"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        sys.exit(f"error: {args.run_dir} has no config.yaml with an env.id; give a run folder a3c train wrote")
    threshold, source = threshold_of(cfg, args.threshold)
    played, sittings = episodes(args.run_dir)
    print(f"{args.run_dir.name}: {env_id}, {len(played)} episodes to {played[-1][0] if played else 0} "
          f"env steps in {sittings} sitting(s); threshold {threshold:g} ({source})")
    result = Result(threshold, time_limit=cfg["env"].get("max_episode_steps") or episode_limit(env_id))
    for step, ret, length in played:
        result.episode(step, ret, length)
    if result.hit is None:
        print(f"never reached {threshold:g}; final last-100 mean {result.final:.1f}"
              + (f" (fewer than {WINDOW} episodes)" if len(played) < WINDOW else ""))
        return
    held = "held" if result.lowest >= threshold else "not held"
    timed_out = f", of them {result.timed_out_share:.0%} at the time limit" \
        if result.time_limit and result.below else ""
    print(f"first reached at {result.hit[1]} env steps; lowest after {result.lowest:.1f} at "
          f"{result.lowest_at} ({held}; std of its 100 returns {result.lowest_std:.1f}); "
          f"{result.below_share:.2%} of the {result.after} episodes after below {threshold:g}{timed_out}; "
          f"final {result.final:.1f}")


if __name__ == "__main__":
    main()
