"""Videos of a policy playing (`a3c eval RUN --video out.mp4`), as RL Zoo's `record_video`.

The episodes are those `evaluate` plays, through the same loop (`play`); each frame
is rendered by the environment (`render_mode="rgb_array"`) and encoded with PyAV as it
comes, into H.264 in an MP4 file. PyAV is the `video` extra: `pip install -e ".[video]"`.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

from ..config import Config
from ..files import write_atomically
from .play import play
from .sources import EnvError, make_env

__all__ = ["VideoError", "record_video"]


class VideoError(RuntimeError):
    """The video cannot be recorded: a file name it cannot write, or an environment that
    cannot render frames."""


def record_video(model: torch.nn.Module, cfg: Config, path: str | os.PathLike, episodes: int = 1,
                 seed: int = 0, deterministic: bool = True,
                 env: Callable[..., gym.Env] | None = None) -> np.ndarray:
    """Play `episodes` episodes as `evaluate` does (in the config's environment or the one
    `env` makes), write them one after the other to the MP4 file `path`, at the
    environment's `render_fps` (30 if it has none), and return their returns. The file
    appears under its name only once it is complete."""
    path = Path(path)
    if path.suffix.lower() != ".mp4":
        raise VideoError(f"--video {path}: the video is written as MP4; give a name ending in .mp4")
    import av  # the 'video' extra; imported first, so that its absence is told before any work

    made = _rendering_env(cfg, env)
    # A frame per agent step: where each step plays several of the environment's frames
    # (Atari's frame skip), the video plays at the matching fraction of its frame rate.
    fps = Fraction(made.metadata.get("render_fps") or 30) / _frames_per_step(made)
    fps = fps.limit_denominator(1001)
    returns = np.empty(0)

    def write(file) -> None:
        nonlocal returns
        with av.open(file, mode="w", format="mp4") as container:
            stream = None

            def add_frame(env: gym.Env) -> None:
                nonlocal stream
                frame = _frame(env, cfg)
                if stream is None:  # the first frame gives the size
                    stream = container.add_stream("libx264", rate=fps)
                    stream.height, stream.width = frame.shape[:2]
                    stream.pix_fmt = "yuv420p"  # what every player decodes
                container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))

            returns = play(model, made, episodes, seed, deterministic, on_state=add_frame)
            if stream is not None:
                container.mux(stream.encode())  # flush the frames the encoder still holds

    try:
        write_atomically(path, write)
    finally:
        made.close()
    return returns


def _rendering_env(cfg: Config, env_factory: Callable[..., gym.Env] | None) -> gym.Env:
    """The environment made to render RGB arrays, or a VideoError saying it cannot."""
    with warnings.catch_warnings():
        # gymnasium's warning about a render mode the env lacks; the error below says it in one line
        warnings.filterwarnings("ignore", message=".*not in the possible render_modes")
        try:
            env = make_env(cfg.env, render_mode="rgb_array", env_factory=env_factory)
        except EnvError as error:
            if isinstance(error.__cause__, TypeError) and "render_mode" in str(error.__cause__):
                raise VideoError(f"env.id {cfg.env.id!r} takes no render_mode argument, and a video "
                                 f"needs its frames: {_HOW_TO_RENDER}") from None
            raise
    modes = list((env.metadata or {}).get("render_modes") or ())
    if "rgb_array" not in modes:
        env.close()
        raise VideoError(f"env.id {cfg.env.id!r} cannot render rgb_array frames for a video (its "
                         f"render modes: {modes}); {_HOW_TO_RENDER}")
    return env


_HOW_TO_RENDER = ("accept render_mode in the constructor, list 'rgb_array' in metadata['render_modes'], "
                  "and return an [H, W, 3] uint8 frame from render() when render_mode is 'rgb_array'")


def _frames_per_step(env: gym.Env) -> int:
    """The environment's frames an agent step spans: the product of the frame skips of
    its wrappers (`frame_skip`, as AtariPreprocessing's; `_skip`, as
    MaxAndSkipObservation's) and the registered environment's own fixed `frameskip`."""
    frames = 1
    while isinstance(env, gym.Wrapper):
        for name in ("frame_skip", "_skip"):
            skip = vars(env).get(name)
            if isinstance(skip, int) and skip > 1:
                frames *= skip
        env = env.env
    spec = env.spec
    skip = spec.kwargs.get("frameskip", 1) if spec is not None else 1
    return frames * (skip if isinstance(skip, int) and skip > 1 else 1)


def _frame(env: gym.Env, cfg: Config) -> np.ndarray:
    """The env's current frame as [H, W, 3] uint8 with even H and W (which yuv420p needs)."""
    try:
        frame = env.render()
    except gym.error.DependencyNotInstalled as error:  # e.g. pygame for the classic-control tasks
        raise VideoError(f"env.id {cfg.env.id!r} cannot render frames: {error}") from None
    frame = np.asarray(frame) if frame is not None else None
    if frame is None or frame.ndim != 3 or frame.shape[2] not in (3, 4):
        shape = None if frame is None else frame.shape
        raise VideoError(f"env.id {cfg.env.id!r} rendered {shape} in rgb_array mode, "
                         "not an [H, W, 3] image")
    height, width = frame.shape[0] // 2 * 2, frame.shape[1] // 2 * 2  # drop an odd last row/column
    return np.ascontiguousarray(frame[:height, :width, :3], dtype=np.uint8)
