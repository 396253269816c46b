"""`a3c tune` (a3c/tune.py): an Optuna study of runs, pruned on their evaluation curves,
kept in an SQLite file that a stopped study goes on from, and its best config."""
import os
import signal
import subprocess
from pathlib import Path

import pytest

from a3c import A3C, ConfigError, load_config
from a3c.tune import _TrialSink, load_space, tune

from conftest import A3C_CLI, descendants, own_process_group, running, segments_of
from waiting import wait_until

optuna = pytest.importorskip("optuna", reason='needs the tune extra: pip install -e ".[tune]"')

SPACE = Path(__file__).resolve().parent / "data" / "tune_space.yaml"
# Trials of a few seconds each: 3 evaluations of 2 episodes.
SHORT = ["total_timesteps=3000", "eval.interval_steps=1000", "eval.episodes=2", "logging.progress=false"]


def finished(storage: str, name: str) -> dict[int, dict]:
    """The params of each finished (complete or pruned) trial of a study, by number."""
    study = optuna.load_study(study_name=name, storage=storage)
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return {t.number: t.params for t in study.trials if t.state in states}


def test_a_pruned_study_of_4_trials_finishes_and_its_best_config_trains(tmp_path):
    lines = []
    best = tune("cartpole", SPACE, 4, [*SHORT, f"logging.run_root={tmp_path}"], on_trial=lines.append)
    storage = f"sqlite:///{tmp_path / 'tune-cartpole.db'}"
    study = optuna.load_study(study_name="cartpole", storage=storage)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert best.trials == len(finished(storage, "cartpole")) == 4 and len(lines) == 4
    assert best.value == max(t.value for t in complete) and best.number == study.best_trial.number
    # Each trial reported its evaluation curve, which the pruner judged.
    assert all(len(t.intermediate_values) >= 1 for t in study.trials)
    written = load_config(best.path)
    assert written.optim.lr == pytest.approx(best.params["optim.lr"])
    assert written.learners.epochs == best.params["learners.epochs"]
    agent = A3C(best.path, logging__progress=False, logging__run_root=str(tmp_path / "again")).learn(500)
    assert agent.num_timesteps >= 500


def test_ctrl_c_stops_a_study_which_then_goes_on_without_repeating_finished_trials(tmp_path):
    args = [*A3C_CLI, "tune", "cartpole", "--space", str(SPACE), "--trials", "4", *SHORT,
            f"logging.run_root={tmp_path}"]
    storage = f"sqlite:///{tmp_path / 'tune-cartpole.db'}"
    with own_process_group(args, stderr=subprocess.PIPE, text=True) as proc:
        lines = []

        def two_finished():
            assert proc.poll() is None, proc.stderr.read()
            lines.append(proc.stderr.readline())
            return sum(line.startswith("trial ") for line in lines) >= 2

        wait_until(two_finished, 120, "two finished trials")
        workers = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        rest = proc.communicate(timeout=60)[1]
        assert proc.returncode == 130, rest
        assert "the same command goes on" in rest and "Traceback" not in rest, rest
    wait_until(lambda: not any(running(pid) for pid in workers), 10, "the workers' end")  # orphans: reaped by init
    assert not segments_of([proc.pid, *workers])
    before = finished(storage, "cartpole")
    assert 2 <= len(before) < 4
    again = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    after = finished(storage, "cartpole")
    assert len(after) == 4 and all(after[n] == params for n, params in before.items())
    ran_again = [line for line in again.stderr.splitlines() if line.startswith("trial ")]
    assert len(ran_again) == 4 - len(before)  # only the trials still to run
    assert "best of 4 trials" in again.stdout


def test_every_problem_of_a_search_space_is_named_before_any_trial(tmp_path):
    space = {"optim.lr": {"type": "log_float", "low": 0.0, "high": 1e-3},
             "learners.epochs": {"type": "int", "low": 4, "high": 2},
             "optim.lrr": {"type": "float", "low": 0.1, "high": 0.2},
             "actors.num": {"type": "normal"},
             "actors.unroll_length": {"type": "categorical", "choices": [8, -1]}}
    with pytest.raises(ConfigError) as error:
        load_space(space, load_config("cartpole"))
    problems = error.value.problems
    assert len(problems) == 5, problems
    for fragment in ("log_float needs low > 0", "needs numbers low < high", "optim.lrr", "type: float | log_float",
                     "actors.unroll_length"):
        assert any(fragment in p for p in problems), (fragment, problems)
    with pytest.raises(ConfigError):
        tune("cartpole", space, 2, [f"logging.run_root={tmp_path}"])
    assert not list(tmp_path.iterdir())  # no study, no trial


class RecordedTrial:
    """The part of an Optuna trial a run's sink uses: what it was told, never pruned."""

    def __init__(self):
        self.reported = []

    def report(self, value, step):
        self.reported.append((step, value))

    def should_prune(self):
        return False


@pytest.mark.parametrize("objective, reported, value", [
    ("final", [10.0, 30.0, 20.0], 20.0),  # each evaluation's mean; the last
    ("mean", [10.0, 20.0, 20.0], 20.0),   # the mean of the evaluation means so far
])
def test_a_trials_value_is_its_last_evaluation_or_the_mean_of_all_of_them(objective, reported, value, tmp_path):
    trial = RecordedTrial()
    sink = _TrialSink(trial, objective)
    sink.open(tmp_path)
    try:
        for step, mean in ((1000, 10.0), (2000, 30.0), (3000, 20.0)):
            sink.scalar("eval/mean_return", mean, step)
            sink.scalar("train/episode_return", -1.0, step)  # other charts are not the trial's
    finally:
        sink.close()
    assert trial.reported == list(zip((1000, 2000, 3000), reported))
    assert sink.value == value


def test_a_study_goes_on_only_with_the_objective_it_began_with(tmp_path):
    storage = f"sqlite:///{tmp_path / 'tune-cartpole.db'}"
    optuna.create_study(study_name="cartpole", storage=storage, direction="maximize").set_user_attr(
        "objective", "mean")
    with pytest.raises(ConfigError, match="was begun with --objective mean"):
        tune("cartpole", SPACE, 2, [*SHORT, f"logging.run_root={tmp_path}"], objective="final")
    assert not optuna.load_study(study_name="cartpole", storage=storage).trials
    assert [path.name for path in tmp_path.iterdir()] == ["tune-cartpole.db"]  # no trial ran
