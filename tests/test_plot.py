"""`a3c plot` and `a3c train --seeds`: the figures' data (curves over seeds on a common
grid, their bands, the aggregate's IQM and its interval) against slow references and
hand-made runs, the run folders read from TensorBoard events, and bad input."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("tensorboard")
pytest.importorskip("matplotlib")
from conftest import assert_one_line_error  # noqa: E402
from torch.utils.tensorboard import SummaryWriter  # noqa: E402

from a3c import cli  # noqa: E402
from a3c.plots import PlotError, plot  # noqa: E402
from a3c.plots.curves import aggregate, curves, iqm, iqm_interval, mean_band, metrics_of, on_grid  # noqa: E402
from a3c.plots.runs import read_runs, trailing_mean, training_seconds  # noqa: E402


def fake_run(folder: Path, seed: int, episodes, name="cartpole", env_id="CartPole-v1", solved=475.0,
             evals=(), sittings=((0, 1000.0),), **fields) -> Path:
    """A run folder as a3c train writes one: config.yaml, and per sitting (start step,
    wall time) an event file with perf/start_step, then the episodes (env step, return,
    wall time) and evaluations (env step, mean return, wall time) of that sitting."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(
        {"name": name, "seed": seed, "solved_return": solved, "env": {"id": env_id},
         "logging": {"run_root": str(folder.parent)}, **fields}))
    bounds = [wall for _, wall in sittings[1:]] + [float("inf")]
    for (start, wall), end in zip(sittings, bounds):
        writer = SummaryWriter(str(folder), filename_suffix=f".{start}")
        writer.add_scalar("perf/start_step", start, start, walltime=wall)
        for step, ret, at in episodes:
            if wall <= at < end:
                writer.add_scalar("charts/episodic_return", ret, step, walltime=at)
        for step, ret, at in evals:
            if wall <= at < end:
                writer.add_scalar("eval/mean_return", ret, step, walltime=at)
        writer.close()
    return folder


def episodes_of(returns, every=100, wall=1000.0, seconds_each=1.0):
    """Episodes with these returns, one each `every` env steps and `seconds_each` seconds."""
    return [(every * (i + 1), float(r), wall + seconds_each * (i + 1)) for i, r in enumerate(returns)]


def run_cli(*argv) -> int:
    try:
        cli.main([str(a) for a in argv])
    except SystemExit as stop:
        return stop.code
    return 0


# ------------------------------------------------------------------------ curves over seeds
def test_each_parent_folder_of_seeds_is_one_curve_and_each_environment_a_row(tmp_path):
    for seed in (1, 2, 3):
        fake_run(tmp_path / "cartpole-1" / f"seed-{seed}", seed, episodes_of(range(10 * seed, 10 * seed + 20)))
    for seed in (1, 2):
        fake_run(tmp_path / "acrobot-1" / f"seed-{seed}", seed, episodes_of([-500 + seed] * 5), name="acrobot",
                 env_id="Acrobot-v1", solved=-100.0)
    runs = read_runs([tmp_path / "cartpole-1", tmp_path / "acrobot-1"])
    drawn = curves(runs, metrics_of(runs, None), ["steps", "time"])
    assert [(c.task, c.x, c.label, c.seeds) for c in drawn] == [
        ("CartPole-v1", "steps", "cartpole", 3), ("CartPole-v1", "time", "cartpole", 3),
        ("Acrobot-v1", "steps", "acrobot", 2), ("Acrobot-v1", "time", "acrobot", 2)]
    acrobot = drawn[2]
    assert acrobot.solved == -100.0 and np.allclose(acrobot.mean, -498.5)  # seeds at -499 and -498
    assert run_cli("plot", tmp_path, "-o", tmp_path / "curves.png") == 0
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_runs_whose_configs_differ_in_more_than_the_seed_are_separate_curves(tmp_path):
    for seed in (1, 2):  # one by one, not in one parent: a curve is a config, not a folder
        fake_run(tmp_path / f"a{seed}", seed, episodes_of([1, 2]), optim={"lr": 0.001})
        fake_run(tmp_path / f"b{seed}", seed, episodes_of([3, 4]), optim={"lr": 0.0003})
    labels = {run.label for run in read_runs([tmp_path])}
    assert labels == {"cartpole optim.lr=0.001", "cartpole optim.lr=0.0003"}
    assert [c.seeds for c in curves(read_runs([tmp_path]), ["return"], ["steps"])] == [2, 2]


def test_the_training_return_is_the_mean_of_the_last_100_episodes():
    returns = np.random.default_rng(0).normal(size=250)
    slow = [np.mean(returns[max(0, i - 99):i + 1]) for i in range(len(returns))]
    assert np.allclose(trailing_mean(returns), slow)


def test_evaluation_returns_are_drawn_where_runs_have_them(tmp_path):
    fake_run(tmp_path / "with", 1, episodes_of([1, 2, 3]), evals=[(500, 42.0, 1010.0), (900, 44.0, 1020.0)])
    fake_run(tmp_path / "without", 2, episodes_of([1, 2, 3]), name="other")
    runs = read_runs([tmp_path])
    assert metrics_of(runs, None) == ["return", "eval"]
    evaluated = curves(runs, ["eval"], ["steps"])
    assert [(c.label, c.seeds) for c in evaluated] == [("cartpole", 1)]
    assert evaluated[0].grid[[0, -1]].tolist() == [500, 900] and evaluated[0].mean[[0, -1]].tolist() == [42, 44]
    assert metrics_of(runs, ["charts/episodic_return"]) == ["charts/episodic_return"]


def test_seeds_sampled_at_different_steps_are_interpolated_onto_one_grid():
    # y = x sampled at different points, and a run that ended at 50 (it keeps its last value)
    a = (np.array([0.0, 30.0, 100.0]), np.array([0.0, 30.0, 100.0]))
    b = (np.array([10.0, 55.0, 100.0]), np.array([10.0, 55.0, 100.0]))
    c = (np.array([5.0, 50.0]), np.array([5.0, 50.0]))
    grid, values = on_grid([a, b, c], points=10)
    assert np.allclose(grid, np.linspace(10, 100, 10))  # from where the last starts to where the last ends
    assert np.allclose(values[:2], grid) and np.allclose(values[2], np.minimum(grid, 50))
    reversed_a = (a[0][::-1], a[1][::-1])  # points in the order of x, however written
    assert np.allclose(on_grid([reversed_a, b, c], points=10)[1], values)


def test_the_band_of_two_seeds_spans_them_and_identical_seeds_have_none():
    rng = np.random.default_rng(0)
    values = np.array([[0.0, 1.0, 2.0], [2.0, 3.0, 6.0]])
    # resampled means of two seeds: a, (a + b) / 2 or b, the ends a quarter of the time each
    mean, low, high = mean_band(values, rng)
    assert np.allclose(mean, [1, 2, 4]) and np.allclose(low, values[0]) and np.allclose(high, values[1])
    same = np.tile([5.0, 6.0], (4, 1))
    assert np.allclose(mean_band(same, rng)[1:], [same[0], same[0]])


def test_the_band_matches_the_exact_bootstrap_distribution_of_the_mean():
    values = np.array([[0.0], [1.0], [3.0], [7.0]])  # 4 seeds: all 4**4 resamples, equally likely
    exact = [values[list(pick)].mean() for pick in itertools.product(range(4), repeat=4)]
    _, low, high = mean_band(values, np.random.default_rng(1), resamples=20_000)
    assert low[0] == pytest.approx(np.percentile(exact, 2.5), abs=0.15)
    assert high[0] == pytest.approx(np.percentile(exact, 97.5), abs=0.15)


def test_wall_time_counts_each_sitting_and_leaves_out_the_time_between():
    starts, ends = np.array([100.0, 1000.0]), np.array([160.0, 1030.0])
    walls = np.array([100.0, 130.0, 160.0, 1000.0, 1030.0])
    assert training_seconds(walls, starts, ends).tolist() == [0, 30, 60, 60, 90]


def test_a_resumed_run_is_read_as_it_went_on(tmp_path):
    # The first sitting ran from 1000 s to 1050 s and played to step 5000; the second resumed
    # at 3000 (the last checkpoint) at 9000 s and played again from there.
    first = [(1000 * i, float(i), 1000.0 + 10 * i) for i in range(1, 6)]
    second = [(3000 + 1000 * i, 10.0 * i, 9000.0 + 10 * i) for i in range(1, 3)]
    fake_run(tmp_path / "run", 1, first + second, sittings=((0, 1000.0), (3000, 9000.0)))
    (run,) = read_runs([tmp_path / "run"])
    episodes = run.metrics["charts/episodic_return"]
    assert episodes.steps.tolist() == [1000, 2000, 4000, 5000]  # 3000-5000 of the first sitting replaced
    assert episodes.values.tolist() == [1, 2, 10, 20]
    assert episodes.seconds.tolist() == [10, 20, 60, 70]  # the first sitting's 50 s, then 10 and 20


# ---------------------------------------------------------------------------- the aggregate
def slow_iqm(scores) -> float:
    """The interquartile mean as its definition reads: sorted, the lowest and highest
    quarter (rounded down) dropped, the rest averaged."""
    ordered = sorted(float(s) for s in np.ravel(scores))
    cut = len(ordered) // 4
    middle = ordered[cut:len(ordered) - cut]
    return sum(middle) / len(middle)


@pytest.mark.parametrize("scores", [np.arange(1.0, 9.0).reshape(4, 2), np.array([[3.0, -1.0, 10.0], [0.5, 2.0, 7.0],
                                    [100.0, 4.0, 1.0]]), np.array([[2.0]]), np.array([[1.0, 5.0, 2.0, 9.0, 4.0]])])
def test_the_iqm_matches_a_slow_reference(scores):
    assert iqm(scores) == pytest.approx(slow_iqm(scores))


def test_the_iqm_of_one_to_eight_is_the_mean_of_three_to_six():
    assert iqm(np.arange(1.0, 9.0)) == 4.5


def test_the_iqm_matches_scipys_trimmed_mean():
    stats = pytest.importorskip("scipy.stats")
    scores = np.random.default_rng(2).normal(size=(7, 3))
    assert iqm(scores) == pytest.approx(stats.trim_mean(scores, 0.25, axis=None))


def test_the_aggregate_interval_is_a_stratified_bootstrap_of_the_iqm():
    per_task = [np.array([0.9, 1.1, 1.0]), np.array([0.2, 0.8]), np.array([1.5, 1.2, 0.7, 1.0])]
    point, low, high = iqm_interval(per_task, np.random.default_rng(3), resamples=500)
    # The slow transcription: the same draws (each task's runs resampled on their own), one
    # resample at a time.
    rng = np.random.default_rng(3)
    draws = [rng.integers(0, len(task), (500, len(task))) for task in per_task]
    stats = [slow_iqm([task[i] for task, d in zip(per_task, draws) for i in d[r]]) for r in range(500)]
    assert point == pytest.approx(slow_iqm(np.concatenate(per_task)))
    assert (low, high) == pytest.approx((np.percentile(stats, 2.5), np.percentile(stats, 97.5)))
    assert low <= point <= high
    assert iqm_interval([np.full(3, 0.5)], np.random.default_rng(0), resamples=100) == (0.5, 0.5, 0.5)


def test_the_aggregate_normalizes_each_task_from_its_start_to_its_solved_return(tmp_path):
    # CartPole runs start at 20 (0) and solve at 475 (1); Acrobot's at -500 and -100.
    for seed, final in ((1, 475.0), (2, 247.5)):
        fake_run(tmp_path / f"c{seed}", seed, episodes_of([20.0] + [final] * 300))
    for seed, final in ((1, -100.0), (2, -300.0)):
        fake_run(tmp_path / f"a{seed}", seed, episodes_of([-500.0] + [final] * 300), name="acrobot",
                 env_id="Acrobot-v1", solved=-100.0)
    intervals = aggregate(read_runs([tmp_path]), ["return"])
    assert [(i.label, i.runs, i.tasks) for i in intervals] == [("acrobot", 2, 1), ("cartpole", 2, 1)]
    assert [i.iqm for i in intervals] == pytest.approx([0.75, 0.75])  # IQM of 1.0 and 0.5
    assert run_cli("plot", tmp_path, "--aggregate", "-o", tmp_path / "iqm.svg") == 0
    assert (tmp_path / "iqm.svg").read_text().startswith("<?xml")


def test_benchmark_curve_files_are_one_curve_per_method_over_their_tasks(tmp_path):
    for task, threshold in (("cartpole", 475.0), ("acrobot", -100.0)):
        for method in ("a3c", "ppo"):
            for seed in (1, 2, 3):
                curve = {"task": task, "env_id": task.title(), "method": method, "seed": seed,
                         "threshold": threshold, "budget": 1000, "commit": "abc1234",
                         "env_steps": [100, 500, 1000], "wall_s": [1.0, 2.0, 3.0],
                         "mean_return": [threshold - 400 + seed, threshold, threshold + seed]}
                (tmp_path / f"{task}-{method}-seed{seed}.json").write_text(json.dumps(curve))
    runs = read_runs([tmp_path])
    assert [(c.task, c.label, c.seeds) for c in curves(runs, ["return"], ["steps"])] == [
        ("Acrobot", "a3c-replay", 3), ("Acrobot", "SB3 PPO", 3), ("Cartpole", "a3c-replay", 3),
        ("Cartpole", "SB3 PPO", 3)]
    assert [(i.label, i.runs, i.tasks) for i in aggregate(runs, ["return"])] == [
        ("a3c-replay", 6, 2), ("SB3 PPO", 6, 2)]
    assert plot([tmp_path], tmp_path / "c.png") == f"{tmp_path / 'c.png'}: 12 runs, 2 curves, 2 tasks"


# ---------------------------------------------------------------------------- bad input
def test_a_path_with_no_runs_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert_one_line_error(run_cli("plot", tmp_path / "empty"), capsys.readouterr().err, "no runs here")
    assert_one_line_error(run_cli("plot", tmp_path / "missing"), capsys.readouterr().err, "no such file")


def test_an_unknown_metric_is_one_line(tmp_path, capsys):
    fake_run(tmp_path / "run", 1, episodes_of([1, 2]))
    code = run_cli("plot", tmp_path / "run", "--metric", "loss")
    assert_one_line_error(code, capsys.readouterr().err, "--metric loss", "charts/episodic_return")
    assert not (tmp_path / "curves.png").exists()


def test_a_figure_of_an_unknown_format_is_refused_before_any_run_is_read(tmp_path, capsys):
    assert_one_line_error(run_cli("plot", tmp_path / "missing", "-o", tmp_path / "c.jpg"),
                          capsys.readouterr().err, "-o", ".png")


def test_a_task_without_solved_return_cannot_be_aggregated(tmp_path):
    fake_run(tmp_path / "run", 1, episodes_of([1, 2]), solved=None)
    with pytest.raises(PlotError, match="solved_return"):
        aggregate(read_runs([tmp_path]), ["return"])


# ------------------------------------------------------------------------ a3c train --seeds
def test_train_seeds_writes_a_folder_per_seed_that_plot_draws_as_one_curve(tmp_path, capsys):
    code = run_cli("train", "cartpole", "--seeds", 1, 2, "total_timesteps=2000", "logging.progress=false",
                   f"logging.run_root={tmp_path}")
    assert code == 0, capsys.readouterr().err
    (parent,) = tmp_path.iterdir()
    assert parent.name.startswith("cartpole-") and sorted(p.name for p in parent.iterdir()) == ["seed-1", "seed-2"]
    assert [yaml.safe_load((parent / f"seed-{s}" / "config.yaml").read_text())["seed"] for s in (1, 2)] == [1, 2]
    out = capsys.readouterr().out
    assert "seed 1: done:" in out and "seed 2: done:" in out
    runs = read_runs([parent])
    assert [(c.label, c.seeds) for c in curves(runs, ["return"], ["steps"])] == [("cartpole", 2)]


def test_ctrl_c_stops_the_current_seed_and_starts_no_other(tmp_path, capsys, monkeypatch):
    from a3c.api import A3C

    started = []

    def interrupted(agent, run_dir=None, **_):
        started.append(run_dir)
        raise KeyboardInterrupt

    monkeypatch.setattr(A3C, "learn", interrupted)
    code = run_cli("train", "cartpole", "--seeds", 1, 2, 3, "logging.progress=false", f"logging.run_root={tmp_path}")
    assert code == 130 and [p.name for p in started] == ["seed-1"]
    assert "seeds 2 3 not started" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # no run was written: the parent folder is gone too


@pytest.mark.parametrize("argv, fragment", [
    (["cartpole", "--seeds", 1, 1], "each once"),
    (["cartpole", "seed=4", "--seeds", 1, 2], "drop the seed override"),
    (["--resume", "runs/x", "--seeds", 1, 2], "--seeds"),
])
def test_bad_seeds_are_one_line_before_anything_is_written(argv, fragment, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_cli("train", *argv) == 2
    # ConfigError's form: a header line, then the one problem
    header, problem = capsys.readouterr().err.strip().splitlines()
    assert header == "error: invalid config (1 problem):" and fragment in problem
    assert not list(tmp_path.iterdir())
