"""Command line: `a3c train CONFIG [key=value ...]`, `a3c train --resume RUN_DIR`,
`a3c eval RUN_DIR --episodes N [--video out.mp4]`."""
from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from .signals import resend_if_lost

# What each optional module comes with: `pip install -e ".[train]"` and so on.
_EXTRAS = {"torch": "train", "gymnasium": "train", "yaml": "train", "tensorboard": "train",
           "tqdm": "train", "ale_py": "atari", "cv2": "atari", "av": "video", "ray": "ray"}


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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="a3c", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train from a config file, or resume a run")
    train.add_argument("config", nargs="?", help="a YAML config, e.g. configs/cartpole.yaml")
    train.add_argument("overrides", nargs="*", help="dotted overrides, e.g. optim.lr=3e-4 actors.num=4")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its last checkpoint")
    evaluate = commands.add_parser("eval", help="play a trained run's greedy policy")
    evaluate.add_argument("run_dir", help="a run folder (runs/<name>-<time>) or a checkpoint file")
    evaluate.add_argument("--episodes", type=_count(1), default=10)
    evaluate.add_argument("--seed", type=_count(0), default=0)
    evaluate.add_argument("--stochastic", action="store_true", help="sample instead of the greedy action")
    evaluate.add_argument("--video", metavar="FILE.mp4",
                          help="also record the episodes to an MP4 file (needs the 'video' extra)")
    return parser


def _train(args) -> None:
    import tensorboard  # noqa: F401  (what the run's charts need, checked before any worker starts)
    import tqdm  # noqa: F401

    from .api import new_run_dir
    from .checkpoint import latest_checkpoint, load_checkpoint
    from .config import ConfigError, load_config, save_config
    from .runner import Trainer, build_default_model, check_compatible, check_learner_settings, load_state

    if args.resume:
        run_dir = Path(args.resume)
        if run_dir.is_file():  # the run's checkpoint file named in place of its folder
            if run_dir != latest_checkpoint(run_dir.parent):
                raise ConfigError([f"--resume {run_dir}: a run resumes from its folder (which holds "
                                   "config.yaml and checkpoint.pt); give the run folder"])
            run_dir = run_dir.parent
        if args.config and "=" not in args.config:
            raise ConfigError([f"{args.config}: a resumed run trains on with its own config.yaml; "
                               "give only overrides (key=value), or start a new run without --resume"])
        overrides = ([args.config] if args.config else []) + args.overrides
        cfg = load_config(run_dir / "config.yaml", overrides)
        state = load_checkpoint(latest_checkpoint(run_dir))
        check_compatible(cfg, state)  # before config.yaml is rewritten below
    else:
        if not args.config:
            raise ConfigError(["a config file is needed: a3c train configs/cartpole.yaml"])
        cfg = load_config(args.config, args.overrides)
        run_dir, state = None, None
    # Before any folder, or a resumed run's config.yaml, is written: environment errors,
    # settings this model cannot take, and a checkpoint whose weights do not fit it.
    model = build_default_model(cfg)
    check_learner_settings(cfg, model)
    if state is not None:
        load_state(state, model)
        state = {**state, "model": None}  # the model holds its weights now
    if cfg.actors.mode == "ray":
        from .remote import check_cluster

        check_cluster(cfg.ray)  # Ray installed, its cluster reachable: before any folder too
    run_dir = run_dir or new_run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    print(f"run folder: {run_dir}  (tensorboard --logdir {run_dir.parent})", file=sys.stderr)
    trainer = Trainer(cfg, run_dir, model, state)
    try:
        counters = trainer.train()
    except KeyboardInterrupt:
        checkpoint = latest_checkpoint(run_dir)
        if trainer.saved:
            where = f"checkpoint written to {checkpoint}"
        elif checkpoint.exists():  # a resumed run's, or one written on the way, before the stop
            where = f"no final checkpoint; {checkpoint} is the last one written"
        else:
            where = "no checkpoint written"
        print(f"\ninterrupted; {where}", file=sys.stderr)
        raise SystemExit(130) from None
    mean = trainer.monitor.mean_recent_return()
    print(f"done: {counters['env_steps']} steps, {counters['updates']} updates, "
          f"mean return of the last {len(trainer.monitor.recent_returns)} episodes {mean:.1f}")


def _eval(args) -> None:
    from .api import A3C, evaluate
    from .video import record_video

    agent = A3C.load(args.run_dir)
    if args.video:
        # rgb_array frames are drawn off screen; SDL's dummy display keeps pygame (the
        # classic-control tasks) from probing for a real one, which prints an "error:" line
        # on a machine without one.
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        returns = record_video(agent.model, agent.config, args.video, args.episodes, args.seed,
                               deterministic=not args.stochastic)
        print(f"video written to {args.video}", file=sys.stderr)
    else:
        returns = evaluate(agent.model, agent.config, args.episodes, args.seed,
                           deterministic=not args.stochastic)
    print(f"{len(returns)} episodes: mean return {returns.mean():.2f} +- {returns.std():.2f} "
          f"(min {returns.min():.2f}, max {returns.max():.2f})")


def stop_on_sigterm() -> None:
    """SIGTERM stops a run the way Ctrl-C does: workers stop, a checkpoint is written. A
    stop whose KeyboardInterrupt Python drops (raised inside a hook of an actor's fork) is
    sent again, as SIGTERM: a run started in the background ignores SIGINT."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    resend_if_lost(signal.SIGTERM, lambda e: isinstance(e, KeyboardInterrupt))


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    stop_on_sigterm()
    try:
        from replay import SharedMemoryFull

        from .checkpoint import CheckpointError
        from .config import ConfigError
        from .envs import EnvError
        from .remote import ClusterError
        from .video import VideoError

        try:
            {"train": _train, "eval": _eval}[args.command](args)
        except (ConfigError, CheckpointError, EnvError, VideoError, ClusterError) as error:
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
