"""The runs `a3c plot` draws, read from run folders' TensorBoard events and from the
learning-curve files of `scripts/bench_train.py --curves`, as series of (env steps,
seconds of training, value) per metric.

Metrics: `return`, the mean return of the last 100 training episodes (fewer before the
100th), the measure `solved_return` is judged by; `eval`, the evaluations'
`eval/mean_return`; or any scalar tag a run wrote, as written.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["EVAL", "RETURN", "PlotError", "Run", "Series", "read_runs", "trailing_mean", "training_seconds"]

RETURN, EVAL = "return", "eval"
EPISODES, EVAL_TAG, START_TAG = "charts/episodic_return", "eval/mean_return", "perf/start_step"
WINDOW = 100  # episodes in the training return's mean, as solved_return counts them
# What a curve's config may differ in and still be a seed of the same curve.
NOT_THE_RUN = ("logging.", "checkpoint.")  # and the seed
# bench_train.py's methods, as a legend names them.
METHODS = {"a3c": "a3c-replay", "ppo": "SB3 PPO", "ppo-cnn": "SB3 PPO, CNN", "recurrent-ppo": "RecurrentPPO",
           "ppo-constant-lr": "SB3 PPO, constant rate"}
CURVE_KEYS = ("task", "method", "seed", "threshold", "env_steps", "wall_s", "mean_return")


class PlotError(ValueError):
    """Input `a3c plot` cannot draw: one line naming the problem and the fix."""


@dataclasses.dataclass(frozen=True)
class Series:
    steps: np.ndarray    # [points] env steps
    seconds: np.ndarray  # [points] seconds of training from the run's start
    values: np.ndarray   # [points]


@dataclasses.dataclass(frozen=True)
class Run:
    source: Path
    label: str            # the curve it is a seed of
    task: str             # the environment: a row of panels of its own
    seed: int | None
    solved: float | None  # the config's solved_return, or the benchmark's threshold
    metrics: dict[str, Series]
    config: dict[str, Any] | None = None  # a run folder's config.yaml
    commit: str | None = None             # a benchmark curve's commit


def read_runs(paths: Iterable[str | Path]) -> list[Run]:
    """Every run under `paths`: run folders, folders holding them at any depth, and curve
    files (or folders of them). A run folder's curve is its config without the seed:
    runs that differ only in seed (and logging) are one, labelled by the config's name,
    and configs that share a name are told apart by the fields they differ in."""
    sources = {}  # each once, where paths overlap
    for path in map(Path, paths):
        if not path.exists():
            raise PlotError(f"{path}: no such file or folder")
        found = _sources(path)
        if not found:
            raise PlotError(f"{path}: no runs here; give run folders (config.yaml and TensorBoard events, "
                            "as a3c train writes them), folders that hold them, or the curve files of "
                            "scripts/bench_train.py --curves")
        sources.update((source.resolve(), source) for source in found)
    return _labelled([_read_curve_file(s) if s.suffix == ".json" else _read_run_folder(s) for s in sources.values()])


def _is_run(folder: Path) -> bool:
    return (folder / "config.yaml").is_file() and any(folder.glob("events.out.tfevents.*"))


def _sources(path: Path) -> list[Path]:
    if path.is_file():
        return [path] if path.suffix == ".json" else []
    if _is_run(path):
        return [path]
    return sorted(f.parent for f in path.rglob("config.yaml") if _is_run(f.parent)) + sorted(path.glob("*.json"))


def _read_curve_file(file: Path) -> Run:
    """A curve of `bench_train.py --curves`: the last-100 mean against env steps and wall
    seconds from launch."""
    try:
        curve = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise PlotError(f"{file}: not a curve file ({error})") from None
    missing = [key for key in CURVE_KEYS if not isinstance(curve, dict) or key not in curve]
    if missing:
        raise PlotError(f"{file}: not a curve of scripts/bench_train.py --curves (no {', '.join(missing)})")
    series = Series(*(np.asarray(curve[key], float) for key in ("env_steps", "wall_s", "mean_return")))
    if not len(series.steps) == len(series.seconds) == len(series.values):
        raise PlotError(f"{file}: env_steps, wall_s and mean_return differ in length")
    metrics = {RETURN: series} if len(series.steps) else {}  # no curve: ended before 100 episodes
    return Run(file, METHODS.get(curve["method"], curve["method"]), curve.get("env_id", curve["task"]),
               curve["seed"], curve["threshold"], metrics, commit=curve.get("commit"))


def _read_run_folder(folder: Path) -> Run:
    import yaml
    from tensorboard.backend.event_processing import event_accumulator

    try:
        cfg = yaml.safe_load((folder / "config.yaml").read_text())
    except (OSError, yaml.YAMLError) as error:
        raise PlotError(f"{folder / 'config.yaml'}: not readable ({error})") from None
    if not isinstance(cfg, dict):
        raise PlotError(f"{folder / 'config.yaml'}: not a config (a mapping of fields)")
    events = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    events.Reload()  # every event file of the folder: one per sitting of a resumed run
    scalars = {tag: np.array([(e.step, e.wall_time, e.value) for e in events.Scalars(tag)], float).reshape(-1, 3)
               for tag in events.Tags()["scalars"]}
    marks = scalars.get(START_TAG)
    if marks is None or not len(marks):  # runs from before the mark: one sitting, from the first event
        marks = np.array([[0.0, min(s[:, 1].min() for s in scalars.values() if len(s)), 0.0]]) \
            if any(len(s) for s in scalars.values()) else np.zeros((0, 3))
    marks = marks[np.argsort(marks[:, 1])]
    walls = np.concatenate([s[:, 1] for s in scalars.values()] or [np.zeros(0)])
    ends = np.array([walls[(walls >= start) & (walls < end)].max(initial=start)
                     for start, end in zip(marks[:, 1], [*marks[1:, 1], np.inf])])
    metrics = {}
    for tag, points in scalars.items():
        points = _kept(points, marks)
        series = Series(points[:, 0], training_seconds(points[:, 1], marks[:, 1], ends), points[:, 2])
        metrics[tag] = series
        if tag == EPISODES:
            order = np.argsort(series.steps, kind="stable")
            metrics[RETURN] = Series(series.steps[order], series.seconds[order], trailing_mean(series.values[order]))
        elif tag == EVAL_TAG:
            metrics[EVAL] = series
    env = cfg.get("env") if isinstance(cfg.get("env"), dict) else {}
    name = str(cfg.get("name", folder.name))
    return Run(folder, name, str(env.get("id") or name), cfg.get("seed"), cfg.get("solved_return"), metrics, cfg)


def _kept(points: np.ndarray, marks: np.ndarray) -> np.ndarray:
    """[n, (step, wall, value)] less what a later sitting played again: a resumed sitting
    goes on from its checkpoint's step (perf/start_step), and what an interrupted sitting
    wrote from that step on was played past the checkpoint and is replaced."""
    keep = np.ones(len(points), bool)
    for start_step, start_wall, _ in marks:
        keep &= ~((points[:, 1] < start_wall) & (points[:, 0] >= start_step))
    return points[keep]


def training_seconds(walls: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Seconds of training at each wall time (`walls`, [n]) of a run of sittings that
    start at `starts` and write their last event at `ends` ([sittings], in order): the
    time from its sitting's start, plus the whole of every earlier sitting. The time
    between sittings is left out."""
    if not len(starts):
        return np.zeros(len(walls))
    sitting = np.clip(np.searchsorted(starts, walls, side="right") - 1, 0, None)  # [n]
    before = np.concatenate([[0.0], np.cumsum(ends - starts)])[sitting]
    return before + np.clip(walls - starts[sitting], 0, None)


def trailing_mean(values: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """The mean of the last `window` values at each point (of all of them before)."""
    sums = np.cumsum(np.concatenate([[0.0], values]))  # [n + 1]
    ends = np.arange(1, len(values) + 1)
    starts = np.clip(ends - window, 0, None)
    return (sums[ends] - sums[starts]) / (ends - starts)


def _flat(data: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value, sort_keys=True, default=str)
    return out


def _labelled(runs: list[Run]) -> list[Run]:
    """Run folders labelled by config name, and where two curves share one, by the fields
    their configs differ in too (at most three)."""
    keys = {run.source: frozenset((k, v) for k, v in _flat(run.config).items()
                                  if k != "seed" and not k.startswith(NOT_THE_RUN))
            for run in runs if run.config is not None}
    curves: dict[str, set[frozenset]] = {}
    for run in runs:
        if run.source in keys:
            curves.setdefault(run.label, set()).add(keys[run.source])
    labels = {}
    for name, configs in curves.items():
        fields = sorted({key for key, _ in set().union(*configs) - frozenset.intersection(*configs)})
        for config in configs if len(configs) > 1 else ():
            values = {k: json.loads(v) for k, v in config}
            labels[name, config] = f"{name} " + ", ".join(f"{k}={values.get(k, '-')}" for k in fields[:3])
    return [dataclasses.replace(run, label=labels.get((run.label, keys.get(run.source)), run.label)) for run in runs]
