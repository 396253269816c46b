"""Command line: `a3c train CONFIG [--seeds S ...] [key=value ...]`, `a3c train --resume RUN_DIR`,
`a3c eval RUN_DIR --episodes N [--video out.mp4]`, `a3c config CONFIG [key=value ...]`,
`a3c plot RUN_OR_PARENT ... [-o curves.png] [--aggregate]`,
`a3c export RUN_DIR [--format onnx|torchscript] [--best] [-o FILE]`,
`a3c tune CONFIG --space SPACE.yaml --trials N [key=value ...]`.

Each command parses its arguments and calls the Python API (a3c.api), the one pipeline
a run goes through; what is here is only what a terminal needs: the run folder's name,
the line a run ends with, one-line errors and the extra to install for a missing module."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

from .procs import stop_on_sigterm


# What each optional module comes with: `pip install -e ".[train]"` and so on.
_EXTRAS = {"torch": "train", "gymnasium": "train", "yaml": "train", "tensorboard": "train",
           "tqdm": "train", "ale_py": "atari", "cv2": "atari", "av": "video", "ray": "ray",
           "matplotlib": "plot", "optuna": "tune", "onnx": "export", "onnxscript": "export"}


def _count(least: int):
    """An argparse type: an int of at least `least`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is less than {least}")
        return value
    return parse


class _Seeds(argparse.Action):
    """--seeds 1 2 3 [key=value ...]: argparse would take the overrides after the seeds
    for more seeds; they are overrides, told apart by their '='."""

    def __call__(self, parser, namespace, values, option_string=None):
        namespace.overrides = [*(namespace.overrides or []), *(v for v in values if "=" in v)]
        try:
            namespace.seeds = [_count(0)(v) for v in values if "=" not in v]
        except argparse.ArgumentTypeError as error:
            parser.error(f"argument --seeds: {error}")


_ENV_HELP = ("a function or class that makes the environment, as A3C(config, env=...) takes it; "
             "a run trained with one needs it again")


def _factory(args):
    """The environment factory `--env` names, or None."""
    from .envs import load_object
    from .envs.sources import EnvError

    if args.env is None:
        return None
    try:
        return load_object(args.env)
    except EnvError as error:
        raise EnvError(f"--env: {error}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="a3c", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train from a config, or resume a run")
    train.add_argument("config", nargs="?", help="a shipped config's name (cartpole, acrobot, ...) or a "
                                                 "YAML file")
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=3e-4 actors.num=4")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    train.add_argument("--env", metavar="MODULE:NAME", help=_ENV_HELP)
    train.add_argument("--seeds", nargs="+", action=_Seeds, metavar="S",
                       help="one run per seed, one after another (each run already keeps every core busy), "
                            "in one folder: runs/<name>-<time>/seed-S; key=value after them are overrides")
    evaluate = commands.add_parser("eval", help="play a trained run's greedy policy")
    evaluate.add_argument("run_dir", help="a run folder (runs/<name>-<time>) or a checkpoint file")
    evaluate.add_argument("--episodes", type=_count(1), default=10, help="episodes to play (default: 10)")
    evaluate.add_argument("--seed", type=_count(0), default=0,
                          help="the first episode's seed; the i-th plays seed + i (default: 0)")
    evaluate.add_argument("--stochastic", action="store_true", help="sample instead of the greedy action")
    evaluate.add_argument("--best", action="store_true",
                          help="play the run's best.pt, the weights of its best evaluation while training")
    evaluate.add_argument("--video", metavar="FILE.mp4",
                          help="also record the episodes to an MP4 file (needs the 'video' extra)")
    evaluate.add_argument("--env", metavar="MODULE:NAME", help=_ENV_HELP)
    show = commands.add_parser("config", help="print a config as a run would use it, each field with its help")
    show.add_argument("config", help="a shipped config's name (cartpole, acrobot, ...) or a YAML file")
    show.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=3e-4 actors.num=4")
    plot = commands.add_parser("plot", help="draw runs' learning curves, the mean over seeds with a 95%% "
                                            "confidence band, or their aggregate (needs the 'plot' extra)")
    plot.add_argument("paths", nargs="+", metavar="RUN_OR_PARENT",
                      help="run folders, or folders that hold them (runs whose configs differ only in seed "
                           "are one curve, named after the config), or scripts/bench_train.py --curves files")
    plot.add_argument("-o", "--output", metavar="FILE",
                      help="the figure: .png, .svg or .pdf (default: curves.png; aggregate.png with --aggregate)")
    plot.add_argument("--aggregate", action="store_true",
                      help="each curve's interquartile mean over tasks and seeds of its runs' final values, "
                           "normalized per task from its runs' start (0) to solved_return (1), with a 95%% "
                           "stratified bootstrap interval")
    plot.add_argument("--x", choices=("steps", "time"),
                      help="against env steps or seconds of training only (default: both)")
    plot.add_argument("--metric", nargs="+",
                      help="return (mean of the last 100 training episodes), eval (evaluation returns) or a "
                           "TensorBoard tag the runs wrote (default: return, and eval where runs have it)")
    export = commands.add_parser("export", help="write a run's policy as ONNX or TorchScript, to run "
                                                "without this project (needs the 'export' extra)")
    export.add_argument("run_dir", help="a run folder (runs/<name>-<time>) or a checkpoint file")
    export.add_argument("--format", default="onnx", help="onnx (default) or torchscript")
    export.add_argument("--best", action="store_true", help="the run's best.pt instead of its last checkpoint")
    export.add_argument("-o", "--output", metavar="FILE",
                        help="where to write (default: beside the checkpoint, checkpoint.onnx or "
                             "checkpoint.torchscript.pt; best.* with --best)")
    export.add_argument("--env", metavar="MODULE:NAME", help=_ENV_HELP)
    tune = commands.add_parser("tune", help="search a config's hyperparameters with Optuna, one run per "
                                            "trial (needs the 'tune' extra)")
    tune.add_argument("config", help="a shipped config's name (cartpole, acrobot, ...) or a YAML file")
    tune.add_argument("overrides", nargs="*", help="dotted overrides, e.g. total_timesteps=100000")
    tune.add_argument("--space", required=True, metavar="SPACE.yaml",
                      help="config fields and their ranges, e.g. optim.lr: {type: log_float, low: 1.0e-4, "
                           "high: 1.0e-2}; types: float, log_float, int, categorical (with choices: [...])")
    tune.add_argument("--trials", required=True, type=_count(1),
                      help="trials the study holds when done (complete or pruned); a study that has some "
                           "goes on from them")
    tune.add_argument("--storage", metavar="URL",
                      help="where the study lives (default: sqlite:///<run_root>/tune-<name>.db); an RDB URL "
                           "such as postgresql://user@host/db shares it between machines")
    tune.add_argument("--study", metavar="NAME", help="the study's name (default: the config's name)")
    tune.add_argument("-o", "--output", metavar="FILE.yaml",
                      help="the best trial's config (default: <run_root>/tune-<name>-best.yaml)")
    tune.add_argument("--seed", type=_count(0), default=0, help="the sampler's seed (default: 0)")
    tune.add_argument("--objective", choices=["final", "mean"], default="final",
                      help="a trial's value: its last evaluation's mean return (final, the default), or the "
                           "mean of its evaluations' means (mean: rewards a config that learns sooner); a study "
                           "keeps the one it began with")
    tune.add_argument("--env", metavar="MODULE:NAME", help=_ENV_HELP)
    return parser


def _train(args) -> None:
    import tensorboard  # noqa: F401  (what the run's charts need, checked before any worker starts)
    import tqdm  # noqa: F401

    from .api import A3C
    from .config import ConfigError, load_config

    if args.resume:
        if args.seeds:
            raise ConfigError(["--seeds: a resumed run trains on with its own seed; resume each seed's "
                               "folder on its own"])
        if args.config and "=" not in args.config:
            raise ConfigError([f"{args.config}: a resumed run trains on with its own config.yaml; "
                               "give only overrides (key=value), or start a new run without --resume"])
        agent = A3C.resume(args.resume, ([args.config] if args.config else []) + args.overrides,
                           env=_factory(args))
    else:
        if not args.config:
            raise ConfigError(["a config is needed: a3c train cartpole (a shipped config's name) or "
                               "a3c train my_config.yaml"])
        if args.seeds:
            return _train_seeds(args)
        agent = A3C(load_config(args.config, args.overrides), env=_factory(args))
    _learn(agent)
    print(_ending(agent))


def _train_seeds(args) -> None:
    """One run per seed, one after another; Ctrl-C stops the current one and starts no other."""
    from .seeds import seed_runs

    with contextlib.closing(seed_runs(args.config, args.seeds, args.overrides, env=_factory(args))) as runs:
        for i, (agent, run_dir) in enumerate(runs):
            rest = args.seeds[i + 1:]
            _learn(agent, run_dir, f"; seed{'s' if len(rest) > 1 else ''} {' '.join(map(str, rest))} not started"
                   if rest else "")
            print(f"seed {agent.config.seed}: {_ending(agent)}")
    print(f"draw the seeds' curves: a3c plot {agent.run_dir.parent}", file=sys.stderr)


def _learn(agent, run_dir=None, not_run: str = "") -> None:
    """Train; on Ctrl-C, say which checkpoint was written (and `not_run`) and exit with 130."""
    from .checkpoint import latest_checkpoint

    try:
        agent.learn(run_dir=run_dir, on_start=lambda run_dir: print(
            f"run folder: {run_dir}  (tensorboard --logdir {run_dir.parent})", file=sys.stderr))
    except KeyboardInterrupt:
        checkpoint = None if agent.run_dir is None else latest_checkpoint(agent.run_dir)
        if checkpoint is None:
            where = "no run folder written"
        elif agent.final_checkpoint:
            where = f"checkpoint written to {checkpoint}"
        elif checkpoint.exists():  # a resumed run's, or one written on the way, before the stop
            where = f"no final checkpoint; {checkpoint} is the last one written"
        else:
            where = "no checkpoint written"
        print(f"\ninterrupted; {where}{not_run}", file=sys.stderr)
        raise SystemExit(130) from None


def _ending(agent) -> str:
    """The line a finished run ends with: how far it went, why it stopped, and its return."""
    import numpy as np

    counters, returns, cfg = agent.counters, agent.recent_returns, agent.config
    mean = float(np.mean(returns)) if returns else float("nan")
    # A run that ends before its budget has reached its target (the episodes drained as it
    # stops may have moved the mean since).
    why = "trained its total_timesteps" if counters["env_steps"] >= cfg.total_timesteps else \
        f"reached target_return {cfg.target_return:g}"
    return (f"done: {counters['env_steps']} steps, {counters['updates']} updates, "
            f"mean return of the last {len(returns)} episodes {mean:.6g} ({why})")


def _config(args) -> None:
    from .config import describe, load_config

    print(describe(load_config(args.config, args.overrides)), end="")


def _eval(args) -> None:
    from .api import A3C, evaluate
    from .envs.video import record_video

    agent = A3C.load(args.run_dir, env=_factory(args), best=args.best)
    if args.video:
        # rgb_array frames are drawn off screen; SDL's dummy display keeps pygame (the
        # classic-control tasks) from probing for a real one, which prints an "error:" line
        # on a machine without one.
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        returns = record_video(agent.model, agent.config, args.video, args.episodes, args.seed,
                               deterministic=not args.stochastic, env=agent.env_factory)
        print(f"video written to {args.video}", file=sys.stderr)
    else:
        returns = evaluate(agent.model, agent.config, args.episodes, args.seed,
                           deterministic=not args.stochastic, env=agent.env_factory)
    print(f"{len(returns)} episodes: mean return {returns.mean():.2f} +- {returns.std():.2f} "
          f"(min {returns.min():.2f}, max {returns.max():.2f})")


def _plot(args) -> None:
    from .plots import plot

    print(plot(args.paths, args.output, args.aggregate, args.x, args.metric))


def _export(args) -> None:
    from .export import export

    print(export(args.run_dir, args.output, args.format, best=args.best, env=_factory(args)))


def _tune(args) -> None:
    from .tune import tune

    try:
        best = tune(args.config, args.space, args.trials, args.overrides, args.storage, args.study,
                    args.output, args.seed, env=_factory(args),
                    on_trial=lambda line: print(line, file=sys.stderr, flush=True), objective=args.objective)
    except KeyboardInterrupt:
        print("\ninterrupted; the same command goes on with the trials still to run", file=sys.stderr)
        raise SystemExit(130) from None
    value = "evaluation mean" if args.objective == "final" else "mean of its evaluation means"
    print(f"best of {best.trials} trials: trial {best.number}, {value} {best.value:.6g}, {best.params}")
    print(f"its config: {best.path}  (a3c train {best.path})")


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    # key=value after an option (a3c tune cartpole --trials 4 total_timesteps=1e5) are
    # overrides too: argparse stops taking positionals at the first option.
    if rest and hasattr(args, "overrides") and all("=" in r and not r.startswith("-") for r in rest):
        args.overrides = [*(args.overrides or []), *rest]
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    stop_on_sigterm()
    try:
        from replay import SharedMemoryFull

        from .actors.cluster import ClusterError
        from .checkpoint import CheckpointError
        from .config import ConfigError
        from .envs import EnvError
        from .envs.video import VideoError
        from .export import ExportError
        from .plots import PlotError

        try:
            {"train": _train, "eval": _eval, "config": _config, "plot": _plot,
             "export": _export, "tune": _tune}[args.command](args)
        except (ConfigError, CheckpointError, EnvError, VideoError, ClusterError, PlotError,
                ExportError) as error:
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(2) from None
        except SharedMemoryFull as error:  # the queues and the replay buffer live there
            print(f"error: {error.strerror or error}; a run's segments are sized by actors.queue_capacity "
                  "fragments of actors.unroll_length steps and, with replay.ratio above 0, replay.window "
                  "fragments", file=sys.stderr)
            raise SystemExit(2) from None
    except ModuleNotFoundError as error:
        extra = _EXTRAS.get((error.name or "").partition(".")[0])
        if extra is None:
            raise
        print(f"error: a3c {args.command} needs {error.name!r}, which is not installed; install "
              f"the {extra!r} extra: pip install \"a3c-replay[{extra}]\" (from a clone: "
              f"pip install -e \".[{extra}]\")", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
