"""`a3c plot`: learning curves of runs, the mean over seeds with a confidence band, and
the aggregate over tasks and seeds.

    runs.py    run folders' TensorBoard events and bench_train.py's curve files, read as series
    curves.py  the figures' data, as pure functions: curves on a common grid, bands, IQM intervals
    draw.py    the matplotlib layer

    from a3c.plots import plot
    plot(["runs/cartpole-20261201-101500"], "curves.png")            # its seed-* runs: one curve
    plot(["runs"], "iqm.png", aggregate=True, metrics=["return"])
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from .curves import aggregate, curves, metrics_of
from .runs import PlotError, read_runs

__all__ = ["PlotError", "plot"]

FORMATS = (".png", ".svg", ".pdf")


def plot(paths: Sequence[str | os.PathLike], output: str | os.PathLike | None = None, aggregate_runs: bool = False,
         x: str | None = None, metrics: Sequence[str] | None = None) -> str:
    """Draw the runs under `paths` into `output` (default: curves.png, or aggregate.png
    with `aggregate_runs`): against env steps and seconds of training, or only `x`
    ("steps" or "time"). Returns a line saying what was drawn."""
    path = Path(output or ("aggregate.png" if aggregate_runs else "curves.png"))
    if path.suffix.lower() not in FORMATS:
        raise PlotError(f"-o {path}: name a {', '.join(FORMATS)} file")
    if x not in (None, "steps", "time"):
        raise PlotError(f"--x {x}: choose steps or time")
    runs = read_runs(paths)
    chosen = metrics_of(runs, metrics)
    commits = sorted({run.commit for run in runs if run.commit})
    note = f" (commit {', '.join(commits)})" if commits else ""
    data = aggregate(runs, chosen) if aggregate_runs else curves(runs, chosen, [x] if x else ["time", "steps"])
    if not data:
        raise PlotError(f"{' '.join(map(str, paths))}: the runs have no {' or '.join(chosen)} yet (no episode "
                        "ended, or no evaluation ran)")
    from .draw import draw_curves, draw_intervals

    (draw_intervals if aggregate_runs else draw_curves)(data, path, note)
    labels = len({run.label for run in runs})
    tasks = len({run.task for run in runs})
    return (f"{path}: {len(runs)} run{'s' if len(runs) > 1 else ''}, {labels} curve{'s' if labels > 1 else ''}, "
            f"{tasks} task{'s' if tasks > 1 else ''}")
