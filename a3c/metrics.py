"""Metrics: a small facade over TensorBoard, and the monitor thread that feeds it.

Tags live in fixed namespaces: charts/ (episodes), losses/, perf/, queue/, policy_lag/,
replay/, ray/ (remote actors: their calls, the pump's traffic, published weights), eval/
(evaluation while training, a3c.evaluator) and selfplay/ (games against a fixed opponent,
a3c.selfplay).
Tests swap TensorBoard for `MemorySink`.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from replay import ArrayQueue, Closed, Counters

__all__ = ["MemorySink", "Monitor", "Sink", "TensorBoardSink"]


class Sink(Protocol):
    def scalar(self, tag: str, value: float, step: int) -> None: ...
    def text(self, tag: str, text: str) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class TensorBoardSink:
    def __init__(self, log_dir: str):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir)

    def scalar(self, tag: str, value: float, step: int) -> None:
        self._writer.add_scalar(tag, value, step)

    def text(self, tag: str, text: str) -> None:
        self._writer.add_text(tag, text, 0)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class MemorySink:
    """Keeps every record in lists, for tests."""

    def __init__(self):
        self.scalars: dict[str, list[tuple[int, float]]] = {}
        self.texts: dict[str, str] = {}

    def scalar(self, tag, value, step):
        self.scalars.setdefault(tag, []).append((step, float(value)))

    def text(self, tag, text):
        self.texts[tag] = text

    def flush(self):
        pass

    def close(self):
        pass


class Monitor(threading.Thread):
    """Writes the counters, episodes and learner statistics every `interval_s`, and
    drives the progress bar. `recent_returns` holds the last 100 episode returns.
    `gauges`, when given, returns more scalars by tag, written with the rest (the Ray
    pump's ray/ tags). `seats`, the agents of a game of several (a3c.actors.agents), adds
    each agent's returns as charts/return_<agent>."""

    def __init__(self, sink: Sink, counters: Counters, fragments: ArrayQueue,
                 episodes: ArrayQueue, learner_stats: ArrayQueue, interval_s: float,
                 total_timesteps: int, progress: bool,
                 gauges: Callable[[], dict[str, float]] | None = None, seats: Sequence[str] = ()):
        super().__init__(name="a3c-monitor", daemon=True)
        self.sink, self.counters, self.fragments = sink, counters, fragments
        self.episodes, self.learner_stats = episodes, learner_stats
        self.gauges, self.seats = gauges, list(seats)
        self.interval_s = interval_s
        self.recent_returns: deque[float] = deque(maxlen=100)
        self._done = threading.Event()
        self._bar = None
        if progress:
            from tqdm import tqdm

            # initial: a resumed run's steps count as done before the bar, not in its first second
            self._bar = tqdm(total=total_timesteps, initial=int(counters["env_steps"]), unit="step",
                             unit_scale=True, dynamic_ncols=True, smoothing=0.1)
        self._last = (time.monotonic(), counters.snapshot())

    def run(self) -> None:
        next_write = time.monotonic() + self.interval_s
        while not self._done.wait(0.2):
            self.drain_episodes()
            self._progress()
            if time.monotonic() >= next_write:
                self.write()
                next_write += self.interval_s

    def stop(self) -> None:
        """Stop the thread and write the last values."""
        self._done.set()
        if self.is_alive():
            self.join()
        self.drain_episodes()
        self.write()
        if self._bar is not None:
            self._progress()
            self._bar.close()
        self.sink.flush()

    def drain_episodes(self) -> None:
        while True:
            try:
                done = self.episodes.get_many(1024, block=False)
            except (queue.Empty, Closed):
                return
            for ret, length, step, seat in done.tolist():
                self.sink.scalar("charts/episodic_return", ret, step)
                self.sink.scalar("charts/episode_length", length, step)
                if self.seats:
                    self.sink.scalar(f"charts/return_{self.seats[seat]}", ret, step)
                self.recent_returns.append(ret)

    def mean_recent_return(self) -> float:
        return float(np.mean(self.recent_returns)) if self.recent_returns else float("nan")

    def write(self) -> None:
        now, counts = time.monotonic(), self.counters.snapshot()
        then, before = self._last
        dt = max(now - then, 1e-9)
        step = counts["env_steps"]
        scalar = self.sink.scalar
        scalar("perf/sps", (step - before["env_steps"]) / dt, step)
        scalar("perf/updates_per_s", (counts["updates"] - before["updates"]) / dt, step)
        scalar("perf/updates", counts["updates"], step)
        scalar("perf/episodes", counts["episodes"], step)
        scalar("perf/actor_restarts", counts["actor_restarts"], step)
        scalar("perf/nonfinite_losses", counts["nonfinite_losses"], step)
        scalar("perf/kl_stops", counts["kl_stops"], step)
        queue_stats = self.fragments.stats()
        scalar("queue/depth", self.fragments.qsize(), step)
        scalar("queue/puts", counts["queue_puts"], step)
        scalar("queue/gets", counts["queue_gets"], step)
        scalar("queue/full_waits", queue_stats["full_waits"], step)
        scalar("queue/empty_waits", queue_stats["empty_waits"], step)
        scalar("queue/skipped", queue_stats["skipped"], step)
        scalar("queue/episodes_dropped", counts["episodes_dropped"], step)
        for name in self.counters.names:
            if name.endswith("_s"):  # seconds summed over workers -> cores busy on that part
                scalar(f"perf/cores_{name[:-2]}", (counts[name] - before[name]) / dt, step)
        for tag, value in (self.gauges() if self.gauges is not None else {}).items():
            scalar(tag, value, step)
        gets = counts["queue_gets"] - before["queue_gets"]
        if gets:  # replayed fragments per fresh fragment over the interval
            scalar("replay/ratio", (counts["replayed"] - before["replayed"]) / gets, step)
        steps = self._learner_steps()  # STEP_DTYPE records (a3c.learners.updater)
        if len(steps):
            for name in ("policy", "value", "entropy", "clip_fraction", "explained_variance", "grad_norm",
                         "approx_kl"):
                scalar(f"losses/{name}", float(steps[name].mean()), step)
            scalar("policy_lag/mean", float(steps["lag_mean"].mean()), step)
            scalar("policy_lag/max", int(steps["lag_max"].max()), step)
            scalar("charts/learning_rate", float(steps["lr"][-1]), step)
            replayed = steps["lag_mean"][steps["replayed"]]
            if len(replayed):  # in policy versions (updates) since the replayed data was acted
                scalar("replay/age_mean", float(replayed.mean()), step)
        self.sink.flush()
        self._last = (now, counts)

    def _learner_steps(self) -> np.ndarray:
        """The gradient steps the learners reported since the last write."""
        parts = []
        while True:
            try:
                parts.append(self.learner_stats.get_many(4096, block=False))
            except (queue.Empty, Closed):
                return np.concatenate(parts) if parts else np.zeros(0, self.learner_stats.dtype)

    def _progress(self) -> None:
        if self._bar is None:
            return
        steps = self.counters["env_steps"]
        self._bar.update(max(0, steps - self._bar.n))
        self._bar.set_postfix(ret=f"{self.mean_recent_return():.1f}",
                              updates=self.counters["updates"], refresh=False)
