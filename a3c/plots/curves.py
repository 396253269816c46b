"""What `a3c plot` draws, as data: learning curves (the mean over seeds with a confidence
band) and the aggregate over tasks and seeds (the interquartile mean of normalized scores
with a stratified bootstrap confidence interval, as rliable computes it).

rliable itself is not used: its bootstrap runs on the `arch` package, whose releases
either fail to import beside pandas 3 (arch 7) or no longer take the `random_state`
rliable passes (arch 8). What it computes is a few lines of numpy, checked in
tests/test_plot.py against a slow transcription.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .runs import EVAL, RETURN, PlotError, Run

__all__ = ["Curve", "Interval", "aggregate", "curves", "iqm", "iqm_interval", "mean_band", "metrics_of",
           "on_grid"]

GRID = 200          # points per curve
RESAMPLES = 2_000   # bootstrap resamples of a curve's seeds, at each grid point
AGGREGATE_RESAMPLES = 50_000  # of the aggregate's runs, as rliable's default
LEVEL = 0.95        # confidence of bands and intervals
XS = {"steps": "steps", "time": "seconds"}  # --x: the Series field each axis reads


@dataclasses.dataclass(frozen=True)
class Curve:
    task: str
    metric: str
    x: str                # steps or time
    label: str
    seeds: int
    solved: float | None  # the task's solved_return: a dashed line
    grid: np.ndarray      # [GRID]
    mean: np.ndarray      # [GRID] over seeds
    low: np.ndarray       # [GRID] the band's edges
    high: np.ndarray      # [GRID]


@dataclasses.dataclass(frozen=True)
class Interval:
    metric: str
    label: str
    runs: int
    tasks: int
    iqm: float
    low: float
    high: float


def metrics_of(runs: Sequence[Run], asked: Sequence[str] | None) -> list[str]:
    """The metrics to draw: those asked for, each of which some run has, or by default
    the training return and, where a run has it, the evaluation return."""
    have = {metric for run in runs for metric in run.metrics}
    if not asked:
        return [metric for metric in (RETURN, EVAL) if metric in have] or [RETURN]
    for metric in asked:
        if metric not in have:
            tags = sorted(tag for tag in have if "/" in tag)
            raise PlotError(f"--metric {metric}: no run given has it; choose return (training returns), eval "
                            "(evaluation returns) or a tag the runs wrote"
                            + (f" ({', '.join(tags[:5])}, ...)" if tags else ""))
    return list(dict.fromkeys(asked))


def on_grid(runs: Sequence[tuple[np.ndarray, np.ndarray]], points: int = GRID) -> tuple[np.ndarray, np.ndarray]:
    """The runs' (x, y) curves interpolated onto one grid of x, from where the last of them
    starts to where the last ends: [points], [runs, points]. A run that ended sooner keeps
    its final value, as the policy it ended with. Points are taken in the order of x (the
    episodes a monitor drains together share one wall time, and steps may interleave)."""
    runs = [(x[order], y[order]) for x, y in runs for order in [np.argsort(x, kind="stable")]]  # np.interp's order
    start = max(x[0] for x, _ in runs)
    end = max(x[-1] for x, _ in runs)
    grid = np.linspace(start, end, points) if end > start else np.array([start], float)
    return grid, np.stack([np.interp(grid, x, y) for x, y in runs])


def mean_band(values: np.ndarray, rng: np.random.Generator, resamples: int = RESAMPLES,
              level: float = LEVEL) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The mean over seeds (axis 0 of [seeds, points]) and the percentile bootstrap
    confidence interval of that mean at each point: seeds resampled with replacement."""
    picks = rng.integers(0, len(values), (resamples, len(values)))  # [resamples, seeds]
    means = values[picks].mean(1)  # [resamples, points]
    tail = 100 * (1 - level) / 2
    return values.mean(0), np.percentile(means, tail, axis=0), np.percentile(means, 100 - tail, axis=0)


def curves(runs: Sequence[Run], metrics: Sequence[str], xs: Sequence[str], seed: int = 0) -> list[Curve]:
    """One curve per task, metric, x axis and label: the mean over the label's runs of the
    task (its seeds) on a common grid, with a band."""
    rng = np.random.default_rng(seed)
    found = []
    for task in dict.fromkeys(run.task for run in runs):
        for metric in metrics:
            for x in xs:
                for label in dict.fromkeys(run.label for run in runs):
                    mine = [run for run in runs if run.task == task and run.label == label
                            and metric in run.metrics and len(run.metrics[metric].steps)]
                    if not mine:
                        continue
                    grid, values = on_grid([(getattr(run.metrics[metric], XS[x]), run.metrics[metric].values)
                                            for run in mine])
                    mean, low, high = mean_band(values, rng)
                    found.append(Curve(task, metric, x, label, len(mine), mine[0].solved, grid, mean, low, high))
    return found


def iqm(scores: np.ndarray) -> float:
    """The interquartile mean: the mean of the middle half, a quarter cut from each end
    (as rliable's aggregate_iqm, scipy.stats.trim_mean(scores, 0.25))."""
    return float(_iqm_rows(np.asarray(scores, float).reshape(1, -1))[0])


def _iqm_rows(scores: np.ndarray) -> np.ndarray:
    """[rows, n] -> [rows]: each row's interquartile mean."""
    n = scores.shape[1]
    cut = int(0.25 * n)
    return np.sort(scores, axis=1)[:, cut:n - cut].mean(1)


def iqm_interval(per_task: Sequence[np.ndarray], rng: np.random.Generator,
                 resamples: int = AGGREGATE_RESAMPLES, level: float = LEVEL) -> tuple[float, float, float]:
    """The IQM of every task's scores together, and its stratified bootstrap percentile
    interval: each task's runs resampled with replacement on their own, as rliable's
    StratifiedBootstrap does (https://arxiv.org/abs/2108.13264, section 4)."""
    drawn = [task[rng.integers(0, len(task), (resamples, len(task)))] for task in per_task]  # [resamples, runs]
    stats = _iqm_rows(np.concatenate(drawn, axis=1))
    tail = 100 * (1 - level) / 2
    return (iqm(np.concatenate(per_task)), float(np.percentile(stats, tail)),
            float(np.percentile(stats, 100 - tail)))


def aggregate(runs: Sequence[Run], metrics: Sequence[str], seed: int = 0) -> list[Interval]:
    """Per metric and label, the IQM over tasks and seeds of each run's final value,
    normalized per task: 0 at the task's start (the mean over its runs of their first
    value) and 1 at its solved_return."""
    rng = np.random.default_rng(seed)
    found = []
    for metric in metrics:
        mine = [run for run in runs if metric in run.metrics and len(run.metrics[metric].values)]
        scales = {}
        for task in dict.fromkeys(run.task for run in mine):
            of_task = [run for run in mine if run.task == task]
            unsolved = next((run for run in of_task if run.solved is None), None)
            if unsolved is not None:
                raise PlotError(f"{unsolved.source}: --aggregate scores each run from its task's start (0) to "
                                "its solved_return (1), and this run's config names none; set solved_return "
                                "in its config.yaml")
            start, solved = np.mean([run.metrics[metric].values[0] for run in of_task]), of_task[0].solved
            if np.isclose(solved, start):
                raise PlotError(f"{task}: its runs start at the solved_return {solved:g}, so their scores "
                                "cannot be normalized; leave the task out of --aggregate")
            scales[task] = (start, solved - start)
        for label in dict.fromkeys(run.label for run in mine):
            per_task = {}
            for run in (run for run in mine if run.label == label):
                start, span = scales[run.task]
                per_task.setdefault(run.task, []).append((run.metrics[metric].values[-1] - start) / span)
            point, low, high = iqm_interval([np.array(s) for s in per_task.values()], rng)
            found.append(Interval(metric, label, sum(map(len, per_task.values())), len(per_task), point, low, high))
    return found
