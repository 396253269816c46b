"""Learning curves from `scripts/bench_train.py --curves DIR`: one figure per task family.

Each task gets a row of two panels: the mean return of the last 100 episodes against
wall seconds from launch, and against env steps. Each method is drawn as its mean over
seeds with a band (min to max over the seeds, or a 95 % bootstrap interval of the mean),
and the task's threshold as a dashed line.

    python scripts/bench_train.py --tasks cartpole acrobot pendulum --only a3c ppo --seeds 1 2 3 --curves docs/curves/classic
    python scripts/plot_results.py docs/curves/classic -o docs/img/classic.png
    python scripts/plot_results.py curves -o docs/img/          # every family: docs/img/<family>.png
    python scripts/plot_results.py curves/cartpole-*.json --band bootstrap -o cartpole.svg

With several families and a file name, each figure is written beside it as
<name>-<family><suffix>. Needs matplotlib (`pip install matplotlib`).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

# Task family of each bench_train.py task; a task not named here is a family of its own.
FAMILIES = {"cartpole": "classic", "acrobot": "classic", "pendulum": "classic",
            "lunarlander": "lunarlander", "lunarlander-long": "lunarlander",
            "breakout": "minatar", "invaders": "minatar", "novel": "memory",
            "hopper": "mujoco", "walker": "mujoco", "ant": "mujoco", "cheetah": "mujoco"}
ORDER = list(FAMILIES)  # tasks in this order within a figure, then the others by name
LABELS = {"a3c": "a3c-replay", "ppo": "SB3 PPO", "ppo-cnn": "SB3 PPO, CNN",
          "recurrent-ppo": "RecurrentPPO", "ppo-constant-lr": "SB3 PPO, constant rate"}
BANDS = {"minmax": "band: min to max over seeds", "bootstrap": "band: 95 % bootstrap interval"}
KEYS = ("task", "method", "seed", "threshold", "budget", "env_steps", "wall_s", "mean_return")
GRID = 200  # points per curve


def read_curves(paths: list[Path]) -> list[dict]:
    """The curves in the files named and the *.json files of the folders named."""
    files = []
    for path in paths:
        files += sorted(path.glob("*.json")) if path.is_dir() else [path]
    curves = []
    for file in files:
        try:
            curve = json.loads(file.read_text())
        except (OSError, ValueError) as error:
            sys.exit(f"{file}: not a curve file ({error})")
        missing = [key for key in KEYS if key not in curve]
        if missing:
            sys.exit(f"{file}: not a curve from bench_train.py --curves (no {', '.join(missing)})")
        if len(curve["env_steps"]) != len(curve["wall_s"]) or len(curve["wall_s"]) != len(curve["mean_return"]):
            sys.exit(f"{file}: env_steps, wall_s and mean_return differ in length")
        if curve["mean_return"]:  # a run that ended before its first 100 episodes has no curve
            curves.append(curve)
    if not curves:
        sys.exit(f"no curves in {' '.join(map(str, paths))}")
    return curves


def on_grid(runs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The runs' (x, y) curves on one grid of x, from where the last of them starts to
    where the last ends: [grid], [runs, grid]. A run that ended sooner keeps its final
    value, as the policy it ended with."""
    start = max(x[0] for x, _ in runs)
    end = max(x[-1] for x, _ in runs)
    grid = np.linspace(start, end, GRID) if end > start else np.array([start])
    return grid, np.stack([np.interp(grid, x, y) for x, y in runs])


def band(values: np.ndarray, kind: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Low and high edges of the band over seeds (axis 0)."""
    if kind == "minmax" or len(values) < 2:
        return values.min(0), values.max(0)
    picks = rng.integers(0, len(values), (1000, len(values)))
    means = values[picks].mean(1)  # [resamples, grid]
    return np.percentile(means, 2.5, axis=0), np.percentile(means, 97.5, axis=0)


def draw(family: str, curves: list[dict], kind: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({c["task"] for c in curves}, key=lambda t: (ORDER.index(t) if t in ORDER else len(ORDER), t))
    methods = sorted({c["method"] for c in curves}, key=lambda m: (m != "a3c", m))
    colors = {m: plt.get_cmap("tab10")(i) for i, m in enumerate(methods)}
    fig, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.4 * len(tasks)), squeeze=False)
    rng = np.random.default_rng(0)
    for row, task in zip(axes, tasks):
        mine = [c for c in curves if c["task"] == task]
        name = mine[0].get("env_id", task)
        threshold, budget = mine[0]["threshold"], mine[0]["budget"]
        for ax, x_key, x_label in ((row[0], "wall_s", "wall seconds from launch"),
                                   (row[1], "env_steps", "env steps")):
            for method in methods:
                runs = [c for c in mine if c["method"] == method]
                if not runs:
                    continue
                grid, values = on_grid([(np.asarray(c[x_key], float), np.asarray(c["mean_return"], float))
                                        for c in runs])
                low, high = band(values, kind, rng)
                seeds = len(runs)
                ax.plot(grid, values.mean(0), color=colors[method],
                        label=f"{LABELS.get(method, method)} ({seeds} seed{'s' if seeds > 1 else ''})")
                ax.fill_between(grid, low, high, color=colors[method], alpha=0.2, linewidth=0)
            if threshold is not None:
                ax.axhline(threshold, color="0.3", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
            ax.set_xlabel(x_label)
            ax.set_ylabel("mean return, last 100 episodes")
            ax.set_title(f"{name}, budget {budget:,} steps" if x_key == "env_steps" else name)
            ax.grid(alpha=0.3)
        row[0].legend(title=f"mean over seeds; {BANDS[kind]}", fontsize=8, title_fontsize=8, loc="lower right")
    commits = sorted({str(c.get("commit", "unknown")) for c in curves})
    fig.suptitle(f"{family}: learning curves (commit {', '.join(commits)})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"{path}: {family}, {len(tasks)} task(s), {len(curves)} run(s)")


def outputs(families: list[str], out: str) -> dict[str, Path]:
    """Where each family's figure goes: out itself for one family and a file name; beside
    it, <name>-<family><suffix>, for several; <out>/<family>.png for a folder."""
    path = Path(out)
    if out.endswith(("/", "\\")) or path.is_dir():
        return {family: path / f"{family}.png" for family in families}
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        sys.exit(f"-o {out}: name a .png, .svg or .pdf file, or a folder")
    if len(families) == 1:
        return {families[0]: path}
    return {family: path.with_name(f"{path.stem}-{family}{path.suffix}") for family in families}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("curves", nargs="+", type=Path, help="curve files, or folders of them")
    parser.add_argument("-o", "--output", required=True,
                        help="the figure's file (.png, .svg or .pdf), or a folder for one per family")
    parser.add_argument("--family", nargs="+", help="draw only these families (default: every one found)")
    parser.add_argument("--band", choices=list(BANDS), default="minmax",
                        help="min to max over seeds (default), or a 95 %% bootstrap interval of the mean")
    args = parser.parse_args()
    by_family = defaultdict(list)
    for curve in read_curves(args.curves):
        by_family[FAMILIES.get(curve["task"], curve["task"])].append(curve)
    families = [f for f in by_family if not args.family or f in args.family]
    if not families:
        sys.exit(f"no curves of the families {' '.join(args.family)}; found: {' '.join(by_family)}")
    for family, path in outputs(families, args.output).items():
        draw(family, by_family[family], args.band, path)


if __name__ == "__main__":
    main()
