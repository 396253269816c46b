"""The drawing layer of `a3c plot`: matplotlib figures of what a3c.plots.curves computes,
and nothing computed here. matplotlib's Figure is used without pyplot, so no backend or
global figure state is involved."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .curves import LEVEL, Curve, Interval
from .runs import EVAL, RETURN

X_LABELS = {"steps": "env steps", "time": "wall seconds of training"}
Y_LABELS = {RETURN: "return, mean of the last 100 episodes", EVAL: "evaluation return"}


def _colors(labels: Sequence[str]) -> dict:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {label: cmap(i % 10) for i, label in enumerate(dict.fromkeys(labels))}


def draw_curves(curves: Sequence[Curve], path: Path, note: str = "") -> None:
    """A row of panels per task and metric, one per x axis; a line and band per label."""
    from matplotlib.figure import Figure

    rows = list(dict.fromkeys((c.task, c.metric) for c in curves))
    xs = list(dict.fromkeys(c.x for c in curves))
    colors = _colors([c.label for c in curves])
    fig = Figure(figsize=(5.5 * len(xs), 3.4 * len(rows)))
    for (task, metric), row in zip(rows, fig.subplots(len(rows), len(xs), squeeze=False)):
        for x, ax in zip(xs, row):
            here = [c for c in curves if (c.task, c.metric, c.x) == (task, metric, x)]
            for c in here:
                ax.plot(c.grid, c.mean, color=colors[c.label],
                        label=f"{c.label} ({c.seeds} seed{'s' if c.seeds > 1 else ''})")
                ax.fill_between(c.grid, c.low, c.high, color=colors[c.label], alpha=0.2, linewidth=0)
            solved = next((c.solved for c in here if c.solved is not None), None)
            if solved is not None and metric in (RETURN, EVAL):
                ax.axhline(solved, color="0.3", linestyle="--", linewidth=1, label=f"solved_return {solved:g}")
            ax.set_xlabel(X_LABELS[x])
            ax.set_ylabel(Y_LABELS.get(metric, metric))
            ax.set_title(task if metric == RETURN else f"{task}: {metric}")
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=8)
    fig.suptitle(f"learning curves{note}: the mean over seeds, and a {LEVEL:.0%} bootstrap interval of it")
    _save(fig, path)


def draw_intervals(intervals: Sequence[Interval], path: Path, note: str = "") -> None:
    """A panel per metric: each label's IQM (a tick) and its interval (a bar)."""
    from matplotlib.figure import Figure

    metrics = list(dict.fromkeys(i.metric for i in intervals))
    colors = _colors([i.label for i in intervals])
    most = max(sum(i.metric == metric for i in intervals) for metric in metrics)
    fig = Figure(figsize=(8, (1.3 + 0.55 * most) * len(metrics)))
    for metric, ax in zip(metrics, fig.subplots(len(metrics), 1, squeeze=False)[:, 0]):
        mine = [i for i in intervals if i.metric == metric]
        ys = np.arange(len(mine))
        ax.barh(ys, [i.high - i.low for i in mine], left=[i.low for i in mine], height=0.6,
                color=[colors[i.label] for i in mine], alpha=0.6)
        ax.vlines([i.iqm for i in mine], ys - 0.3, ys + 0.3, color="black", linewidth=2)
        ax.set_yticks(ys, [f"{i.label} ({i.runs} run{'s' if i.runs > 1 else ''}, {i.tasks} "
                           f"task{'s' if i.tasks > 1 else ''})" for i in mine])
        ax.axvline(1.0, color="0.3", linestyle="--", linewidth=1)
        ax.set_xlabel(f"final {Y_LABELS.get(metric, metric)}, normalized per task:\n0 where its runs "
                      "start, 1 at solved_return (dashed)", fontsize=9)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"final scores{note}: interquartile mean over tasks and seeds, and a {LEVEL:.0%} "
                 "stratified bootstrap interval", fontsize=10)
    _save(fig, path)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
