"""`a3c tune`: hyperparameter search with Optuna over any config fields.

    a3c tune CONFIG --space SPACE.yaml --trials N [--objective final|mean] [key=value ...]

SPACE.yaml maps dotted config fields to their ranges:

    optim.lr: {type: log_float, low: 1.0e-4, high: 3.0e-3}
    learners.ent_coef: {type: float, low: 0.0, high: 0.02}
    learners.epochs: {type: int, low: 1, high: 8}
    actors.unroll_length: {type: categorical, choices: [8, 16, 32]}

Each trial is one run of the config with the trial's values, one after another (a run
keeps every core busy), with evaluation while training on (the `eval` section; its
interval is set to a tenth of the budget when the config has none). TPE samples the
values; a median pruner stops a trial whose evaluation curve falls below the median of
the earlier trials' at the same env step. A trial's value (`--objective`, OBJECTIVES) is
its last evaluation's mean return, the policy a user would have at the end of its budget,
or the mean of all its evaluations' means, which rewards a config that gets there sooner.

The study lives in an SQLite file by default (`<run_root>/tune-<name>.db`): Ctrl-C stops
the trial in progress (it leaves no process or shared memory, as any run), and the same
command later goes on, running only the trials still to be done; several `a3c tune`
processes on one machine can share the file. On several machines, give every one
`--storage` an RDB URL (e.g. `postgresql://user@host/db`), Optuna's own way to share a
study: each trial is already a run that fills its machine, so a scheduler above it (Ray
Tune) would add a cluster to manage and nothing a trial needs.

The best trial's resolved config is written as a YAML file ready for `a3c train`.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .config import Config, ConfigError, load_config, save_config

__all__ = ["OBJECTIVES", "Param", "TuneResult", "load_space", "tune"]

_TYPES = ("float", "log_float", "int", "categorical")
# What a trial's value is, by --objective. A study keeps the one it was started with.
OBJECTIVES = {
    "final": "the last evaluation's mean return: the policy at the end of the budget",
    "mean": "the mean of the evaluations' mean returns: about the area under the evaluation curve, "
            "which rewards a config that learns sooner",
}


@dataclass(frozen=True)
class Param:
    """One dimension of a search space: a config field and its range."""

    key: str
    type: str
    low: float | None = None
    high: float | None = None
    choices: tuple | None = None

    def suggest(self, trial) -> Any:
        if self.type == "categorical":
            return trial.suggest_categorical(self.key, list(self.choices))
        if self.type == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high))
        return trial.suggest_float(self.key, float(self.low), float(self.high), log=self.type == "log_float")


def _param(key: str, spec: Any) -> tuple[Param | None, list[str]]:
    """The Param a space entry describes, or the problems with it."""
    where = f"{key}:"
    if not isinstance(spec, Mapping) or spec.get("type") not in _TYPES:
        return None, [f"{where} give a mapping with type: {' | '.join(_TYPES)}, e.g. "
                      f"{{type: log_float, low: 1.0e-4, high: 1.0e-2}}"]
    kind = spec["type"]
    allowed = {"type", "choices"} if kind == "categorical" else {"type", "low", "high"}
    problems = [f"{where} unknown entry {k!r} for type {kind}; allowed: {', '.join(sorted(allowed))}"
                for k in spec if k not in allowed]
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            return None, problems + [f"{where} categorical needs choices: [a, b, ...]"]
        return Param(key, kind, choices=tuple(choices)), problems
    low, high = spec.get("low"), spec.get("high")
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high))
    if not numbers or not low < high:
        return None, problems + [f"{where} {kind} needs numbers low < high, got low={low!r} high={high!r}"]
    if kind == "int" and not all(float(v).is_integer() for v in (low, high)):
        return None, problems + [f"{where} int needs whole low and high, got {low!r} and {high!r}"]
    if kind == "log_float" and low <= 0:
        return None, problems + [f"{where} log_float needs low > 0, got {low!r}"]
    return Param(key, kind, low, high), problems


def load_space(space: str | Path | Mapping, config: Config) -> list[Param]:
    """The search space of a YAML file (or a mapping), every entry checked at once: its
    form, and that the config takes each field at both ends of its range (ConfigError)."""
    if not isinstance(space, Mapping):
        import yaml

        path = Path(space)
        if not path.is_file():
            raise ConfigError([f"--space {path}: no such file; write a YAML mapping of config fields to "
                               f"ranges (see a3c tune --help)"])
        try:
            space = yaml.safe_load(path.read_text())
        except yaml.YAMLError as error:
            raise ConfigError([f"--space {path}: not YAML: {str(error).splitlines()[0]}"]) from None
        if not isinstance(space, Mapping) or not space:
            raise ConfigError([f"--space {path}: give a mapping of config fields to ranges, e.g. "
                               f"optim.lr: {{type: log_float, low: 1.0e-4, high: 1.0e-2}}"])
    params, problems = [], []
    for key, spec in space.items():
        param, found = _param(str(key), spec)
        problems += found
        if param is None:
            continue
        ends = param.choices if param.type == "categorical" else (param.low, param.high)
        for value in ends:  # the config's own checks: an unknown field, a value it refuses
            try:
                load_config(config, {param.key: int(value) if param.type == "int" else value})
            except ConfigError as error:
                problems += [f"{key}: {problem}" for problem in error.problems]
                break
        else:
            params.append(param)
    if problems:
        raise ConfigError(problems)
    return params


@dataclass
class TuneResult:
    """The best trial: its number, value, the values it chose and its resolved config."""

    number: int
    value: float
    params: dict[str, Any]
    config: Config
    path: Path  # where its config was written
    trials: int  # trials finished in the study (complete or pruned)


class _TrialSink:
    """The run's charts go to TensorBoard as ever; after each evaluation the trial's value
    so far (`objective`) goes to the trial, which the pruner may then stop
    (optuna.TrialPruned, raised in the trainer's main thread, which shuts the run down as
    on any error)."""

    def __init__(self, trial, objective: str = "final"):
        self.trial, self.objective, self.means = trial, objective, []
        self._board = None

    @property
    def value(self) -> float:
        """The trial's value from the evaluations so far; nan before the first."""
        if not self.means:
            return math.nan
        return self.means[-1] if self.objective == "final" else sum(self.means) / len(self.means)

    def open(self, run_dir: Path) -> None:
        from .metrics import TensorBoardSink

        self._board = TensorBoardSink(str(run_dir))

    def scalar(self, tag: str, value: float, step: int) -> None:
        self._board.scalar(tag, value, step)
        if tag == "eval/mean_return":
            import optuna

            self.means.append(value)
            self.trial.report(self.value, step)
            if self.trial.should_prune():
                raise optuna.TrialPruned(f"evaluation mean {value:.4g} at step {step}")

    def text(self, tag: str, text: str) -> None:
        self._board.text(tag, text)

    def flush(self) -> None:
        self._board.flush()

    def close(self) -> None:
        if self._board is not None:
            self._board.close()


def _trial_config(config: Config, params: Sequence[Param], trial, root: Path) -> Config:
    values = {p.key: p.suggest(trial) for p in params}
    cfg = load_config(config, values)
    run_root = root / f"trial-{trial.number:04d}"
    evaluation = cfg.eval
    if not evaluation.interval_steps:  # the pruner and the trial's value need evaluations
        evaluation = replace(evaluation, interval_steps=max(1, cfg.total_timesteps // 10))
    logging = replace(cfg.logging, run_root=str(run_root), progress=False)
    return replace(cfg, eval=evaluation, logging=logging)


def tune(config: str | Path | Mapping | Config, space: str | Path | Mapping, trials: int,
         overrides: Sequence[str] | Mapping[str, Any] = (), storage: str | None = None,
         study_name: str | None = None, output: str | Path | None = None, seed: int = 0,
         env: Callable | None = None, on_trial: Callable[[str], None] | None = None,
         objective: str = "final") -> TuneResult:
    """Run the trials of a study still to be done until `trials` have finished (complete or
    pruned), then write the best trial's config to `output` (default
    `<run_root>/tune-<name>-best.yaml`) and return it. Everything a study needs (the
    config, the space, the objective) is checked before any trial starts."""
    import optuna

    from .api import A3C

    if objective not in OBJECTIVES:
        raise ConfigError([f"objective {objective!r}: choose one of {', '.join(OBJECTIVES)}"])
    base = load_config(config, overrides)
    params = load_space(space, base)
    name = study_name or base.name
    root = Path(base.logging.run_root) / f"tune-{name}"
    if storage is None:
        root.parent.mkdir(parents=True, exist_ok=True)
        storage = f"sqlite:///{root.parent / f'tune-{name}.db'}"
    # Each trial is reported by `on_trial`, and an error ends the study with it: Optuna's own
    # warnings would print a failed trial's traceback, Ctrl-C's included.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(
        study_name=name, storage=storage, direction="maximize", load_if_exists=True,
        sampler=optuna.samplers.TPESampler(seed=seed),
        # The first trials run whole, to give the median something to stand on; each trial's
        # first evaluation is never judged.
        pruner=optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=1))
    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    # Values of two objectives are not comparable: a study keeps the one it began with
    # (studies from before the choice existed took the last evaluation).
    began = study.user_attrs.get("objective", "final" if study.trials else None)
    if began is None:
        study.set_user_attr("objective", objective)
    elif began != objective:
        raise ConfigError([f"--objective {objective}: study {name!r} ({storage}) was begun with "
                           f"--objective {began}; give that to go on with it, or --study NAME for a new one"])

    def run_trial(trial) -> float:
        cfg = _trial_config(base, params, trial, root)
        sink = _TrialSink(trial, objective)
        try:
            A3C(cfg, env=env).learn(sink=sink, on_start=sink.open)
        finally:
            sink.close()
        if math.isnan(sink.value):
            raise RuntimeError(f"trial {trial.number} ended without an evaluation")
        return sink.value

    def report(study, trial) -> None:
        if on_trial is not None:
            value = "pruned" if trial.state == optuna.trial.TrialState.PRUNED else f"{trial.value:.6g}"
            on_trial(f"trial {trial.number}: {value}  {trial.params}")

    done = sum(t.state in finished for t in study.trials)
    if done < trials:
        study.optimize(run_trial, n_trials=trials - done, catch=(),
                       callbacks=[optuna.study.MaxTrialsCallback(trials, states=finished), report])
    best = study.best_trial  # ValueError when none completed
    best_config = load_config(base, best.params)
    path = Path(output) if output is not None else root.parent / f"tune-{name}-best.yaml"
    save_config(best_config, path)
    return TuneResult(best.number, best.value, dict(best.params), best_config, path,
                      sum(t.state in finished for t in study.trials))
