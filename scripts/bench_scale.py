"""Ray actors on one machine: what they cost against process actors, and what the pump
moves against `ray.get` alone. Side by side in one run.

1. CartPole (configs/cartpole.yaml, its 2 actors of 8 environments), actors.mode process
   and ray in turn, seed by seed: the wall seconds from launch until the mean return of the
   last 100 episodes reaches 475, and env steps/s (the median of the monitor's perf/sps,
   written every second). Ray actors join one Ray instance started before the runs, as a
   cluster would be, so a run's time holds starting its actors but not starting Ray.
   Bar: Ray actors step >= 75% of the env steps/s of process actors.
2. The pump on Atari-sized fragments (16 steps of 4x84x84 uint8, 0.48 MB each): 2 remote
   actors of 8 environments that return the same ready-made fragments as fast as they can
   (a call: 1 or 4 fragments of each environment, 3.8 or 15 MB), through the pump into an
   ArrayQueue that a thread drains as a learner would (batches of 32 read in the queue's
   slots, no copy out; tensors are not made); against a loop of ray.wait and ray.get alone
   on the same actors, with as many calls in flight (2); and that loop again with one copy
   of each result into a buffer (the least a consumer of the data does; the pump makes
   one, into the queue); and the pump into a
   stand-in for the queue that keeps nothing (its own cost, no copy). Rounds alternate;
   medians of the rounds. With --pin, also with the actors on one core and the trainer on
   the other, as on a cluster, where the actors' cores are not the trainer's.
   Bar: the pump moves >= 90% of the MB/s of ray.get alone.
3. Learners against their count: gradient steps per second of 1, 2, ... learners
   (--learners), as threads and as processes (learners.mode) and, where CUDA is visible,
   as threads training a copy of the model on the GPU (learners.device cuda), on the shipped CartPole and
   MinAtar Breakout configs' models and batches, fed by a thread that keeps the queue full
   of ready-made fragments (no actors: the learners alone). Medians of rounds that
   alternate the settings; the speed-up is over one learner of the same mode.
4. Actors against their count (--actor-counts, e.g. 1 2 4 8 14): whole runs of a task's
   shipped config (--actor-task, Pong by default) with that many process actors, the
   learner thread on the CPU and, where CUDA is visible, on the GPU; each stopped after
   --actor-seconds as Ctrl-C stops it. Env steps/s and gradient steps/s (medians of
   the monitor's per-second values, the first 5 s left out) and where the time goes (the
   cores each part keeps busy: perf/cores_*). Run only when counts are given.

    python scripts/bench_scale.py                       # about 11 minutes on 2 cores
    python scripts/bench_scale.py --seeds 1 2 3 4 5 --pin
    python scripts/bench_scale.py --skip cartpole pump --learners 1 2 4
    python scripts/bench_scale.py --skip cartpole pump learners --actor-counts 1 2 4 8 14
"""
from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections import deque
from pathlib import Path

# One machine: Ray takes it to be 127.0.0.1, not the address other machines would reach.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
from machine import exit_on_sigterm, machine, time_limit  # noqa: E402  (scripts/machine.py)

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE, THRESHOLD, WINDOW = ROOT / "configs" / "cartpole.yaml", 475.0, 100
RAY_BAR, PUMP_BAR = 0.75, 0.90


# ------------------------------------------------------------------------- learners
LEARNER_CONFIGS = {"cartpole": ROOT / "configs" / "cartpole.yaml",
                   "minatar_breakout": ROOT / "configs" / "minatar_breakout.yaml",
                   "pong": ROOT / "configs" / "pong.yaml"}


def learner_updates_per_s(task: str, mode: str, num: int, seconds: float, warmup: float = 2.0) -> float:
    """Gradient steps per second of `num` learners of `mode` (thread, process, or cuda:
    threads on a GPU copy) on `task`'s config, fed ready-made fragments as fast as they
    take them."""
    import torch
    from a3c.actors.loop import fragment_dtype
    from a3c.config import load_config
    from a3c.learners.updater import step_queue
    from a3c.learners.workers import DeviceCopy, start_learners
    from a3c.learners.optim import build_optimizer
    from a3c.procs import learner_context as _learner_context
    from a3c.trainer import COUNTERS, TIMERS, build_default_model
    from replay import ArrayQueue, Closed, Counters

    on_gpu = mode == "cuda"
    cfg = load_config(LEARNER_CONFIGS[task], [f"learners.mode={'thread' if on_gpu else mode}",
                                              f"learners.num={num}", f"learners.device={'cuda' if on_gpu else 'cpu'}"])
    torch.set_num_threads(1)
    model = build_default_model(cfg)  # for the config's environment, as a run builds it
    model.share_memory()
    optimizer = build_optimizer(model, cfg.optim)
    action_space = model.action_space
    dtype = fragment_dtype(model.observation_space, action_space, cfg.actors.unroll_length)
    ready = np.zeros(cfg.learners.batch_size, dtype)
    rng = np.random.default_rng(0)
    ready["obs"] = rng.random(ready["obs"].shape) < 0.1 if dtype["obs"].base == bool else rng.normal(
        size=ready["obs"].shape)
    ready["action"] = rng.integers(0, action_space.n, ready["action"].shape)
    ready["logp"] = -np.log(action_space.n)
    ready["reward"] = rng.normal(size=ready["reward"].shape)
    fragments, steps = ArrayQueue(cfg.actors.queue_capacity, dtype), step_queue()
    counters = Counters(COUNTERS, TIMERS)

    def feed():
        try:
            while True:
                fragments.put_many(ready)  # releases the GIL while it waits for room
        except Closed:
            pass

    # Learner processes start as a run's do (a3c.procs.learner_context); then the feeder starts.
    learners = start_learners(cfg, model, optimizer, fragments, counters, steps, None,
                              _learner_context(),
                              DeviceCopy(cfg, model, optimizer) if on_gpu else None)
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        time.sleep(warmup)
        before, start = counters["updates"], time.perf_counter()
        time.sleep(seconds)
        return (counters["updates"] - before) / (time.perf_counter() - start)
    finally:
        learners.stop.set()
        fragments.close()
        for worker in learners.workers:
            worker.join()
        feeder.join()
        for handle in (counters, steps):
            handle.close()


def learner_rounds(args) -> None:
    import torch

    modes = ("thread", "process", *(["cuda"] if torch.cuda.is_available() else []))
    settings = [(task, mode, num) for task in args.learner_tasks for mode in modes for num in args.learners]
    print(f"\n== learners against their count, fed ready-made fragments (no actors); "
          f"{args.seconds:g} s per measurement, {args.rounds} rounds", flush=True)
    runs: dict[tuple, list[float]] = {setting: [] for setting in settings}
    for _ in range(args.rounds):
        for setting in settings:  # alternating, so that drifts in the machine's speed spread out
            runs[setting].append(learner_updates_per_s(*setting, args.seconds))
    print(f"\n{'task':17} {'mode':8} {'learners':>8} {'updates/s':>9} {'speed-up':>8}   (medians)")
    for task, mode, num in settings:
        rate = statistics.median(runs[(task, mode, num)])
        base = statistics.median(runs[(task, mode, args.learners[0])])
        print(f"{task:17} {mode:8} {num:8d} {rate:9.0f} {rate / base:8.2f}")


# --------------------------------------------------------------------------- actors
PARTS = ("actor_env", "actor_policy", "actor_queue", "learner_queue", "learner_update")


def actor_run(task: str, num: int, device: str, seconds: float, warmup: float = 5.0) -> dict:
    """One run of `task`'s shipped config with `num` process actors and the learner on
    `device`, stopped after `seconds` as Ctrl-C stops it (a KeyboardInterrupt, here from
    SIGALRM: no timer thread, so the actors fork as an `a3c train` run's do): medians of
    the monitor's per-second env steps/s, gradient steps/s and busy cores of each part."""
    from a3c import A3C
    from a3c.metrics import MemorySink

    sink = MemorySink()
    agent = A3C(LEARNER_CONFIGS[task], actors__num=num, learners__device=device, total_timesteps=10**10,
                logging__progress=False, logging__interval_s=1.0, checkpoint__interval_s=0,
                logging__run_root="/tmp/a3c-bench-runs")
    with time_limit(seconds):
        agent.learn(sink=sink)

    def median(tag: str) -> float:
        values = [v for _, v in sink.scalars.get(tag, [])[int(warmup):-1]]  # not the warm-up, not the last
        return statistics.median(values) if values else float("nan")

    return {"sps": median("perf/sps"), "ups": median("perf/updates_per_s"),
            **{part: median(f"perf/cores_{part}") for part in PARTS}}


def actor_rounds(args) -> None:
    import torch

    devices = ("cpu", *(["cuda"] if torch.cuda.is_available() else []))
    print(f"\n== actors against their count: {args.actor_task}'s shipped config, process actors, "
          f"runs of {args.actor_seconds:g} s", flush=True)
    print(f"{'device':6} {'actors':>6} {'steps/s':>8} {'updates/s':>9}   cores busy: "
          + " ".join(f"{p:>14}" for p in PARTS), flush=True)
    for device in devices:
        for num in args.actor_counts:
            r = actor_run(args.actor_task, num, device, args.actor_seconds)
            print(f"{device:6} {num:6d} {r['sps']:8.0f} {r['ups']:9.1f}               "
                  + " ".join(f"{r[p]:14.2f}" for p in PARTS), flush=True)


# ------------------------------------------------------------------------- CartPole
def cartpole(mode: str, seed: int) -> dict:
    """One run to the threshold: wall seconds to it, env steps then, median perf/sps."""
    from a3c import A3C
    from a3c.metrics import MemorySink

    window: deque = deque(maxlen=WINDOW)
    found: dict = {}
    start = time.perf_counter()

    class Sink(MemorySink):
        def scalar(self, tag, value, step):
            super().scalar(tag, value, step)
            if tag == "charts/episodic_return":
                window.append(value)
                if "hit" not in found and len(window) == WINDOW and np.mean(window) >= THRESHOLD:
                    found["hit"] = (time.perf_counter() - start, step)

    sink = Sink()
    agent = A3C(CARTPOLE, seed=seed, actors__mode=mode, target_return=THRESHOLD,
                logging__progress=False, logging__interval_s=1.0, checkpoint__interval_s=0,
                logging__run_root="/tmp/a3c-bench-runs")
    agent.learn(sink=sink)
    sps = [value for _, value in sink.scalars.get("perf/sps", [])[1:-1]]  # not the first and last
    wall, steps = found.get("hit", (float("nan"), agent.num_timesteps))
    return {"wall": wall, "steps": steps, "sps": statistics.median(sps) if sps else float("nan"),
            "restarts": agent.counters["actor_restarts"]}


# ---------------------------------------------------------------------------- the pump
E, T = 8, 16  # environments per actor; steps per fragment


class ReadyFragments:
    """A remote actor with RemoteActor's constructor and `sample`, that returns the same
    ready-made fragments every call (fragments_per_call of each of envs_per_actor
    environments): the cost of producing them is left out. `cpus`: the cores it runs on
    (None: any)."""

    cpus: set[int] | None = None

    def __init__(self, cfg, model, dtype, seed, env_factory=None):
        import ray

        if self.cpus is not None:
            os.sched_setaffinity(0, self.cpus)
        rng = np.random.default_rng(seed)
        self.out = np.zeros(cfg.ray.fragments_per_call * cfg.actors.envs_per_actor, dtype)
        self.out["obs"] = rng.integers(0, 256, self.out["obs"].shape, np.uint8)
        self.node_id = ray.get_runtime_context().get_node_id()

    def sample(self, version, weights):
        from a3c.actors.loop import EPISODE_DTYPE
        from a3c.actors.remote import Sample

        return Sample(self.out, np.zeros(0, EPISODE_DTYPE), 0.0, 0.0, self.node_id)


def ready_fragments(cpus: set[int] | None) -> type:
    """ReadyFragments, running on `cpus`."""
    return type("ReadyFragments", (ReadyFragments,), {"cpus": cpus})


def atari_dtype():
    from a3c.actors.loop import fragment_dtype

    return fragment_dtype(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8), gym.spaces.Discrete(6), T)


def pump_config(actors: int, per_call: int):
    from a3c.config import load_config

    return load_config({"actors": {"mode": "ray", "num": actors, "envs_per_actor": E,
                                   "unroll_length": T, "queue_capacity": 64},
                        "ray": {"fragments_per_call": per_call, "calls_in_flight": 2}})


class Discard:
    """Takes the place of the queue to leave out the copy into it: put_many keeps nothing."""

    def __init__(self, dtype):
        self.dtype, self.puts = dtype, 0

    def put_many(self, items) -> int:
        self.puts += len(items)
        return len(items)


def pump_mb_per_s(actor: type, cfg, seconds: float, warmup: float,
                  discard: bool = False) -> tuple[float, float]:
    """MB/s of fragments through the pump into a queue a thread drains, and the share of
    the time the pump was busy (ray/pump_busy); over `seconds`, from `warmup` seconds after
    the first fragments arrived (starting actors is left out). With `discard`, into
    Discard instead: the pump's own cost, without the copies into and out of the queue."""
    import torch

    from a3c.actors.loop import EPISODE_DTYPE
    from a3c.actors.remote import Pump
    from a3c.trainer import COUNTERS, TIMERS
    from replay import ArrayQueue, Closed, Counters

    dtype = atari_dtype()
    fragments, episodes = ArrayQueue(cfg.actors.queue_capacity, dtype), ArrayQueue(64, EPISODE_DTYPE)
    counters = Counters(COUNTERS, TIMERS)
    pump = Pump(cfg, torch.nn.Linear(1, 1), Discard(dtype) if discard else fragments, episodes,
                counters, actor=actor)
    from a3c.learners.source import BatchSource

    class Transport(BatchSource):
        """Takes batches of 32 as a learner does (in place where a whole batch is ready,
        else copied out) and makes no tensors of them."""

        def _tensors(self, records):
            return None

    source = Transport(cfg, fragments, None, counters)

    def learner():
        while True:
            try:
                source.next()
            except Closed:
                return

    drain = threading.Thread(target=learner, daemon=True)
    try:
        pump.start()
        drain.start()
        deadline = time.monotonic() + 120
        while counters["queue_puts"] == 0:  # the actors have started
            assert pump.is_alive() and time.monotonic() < deadline, pump.error
            time.sleep(0.01)
        time.sleep(warmup)
        pump.gauges()  # its rates count from here
        before, started = counters["queue_puts"], time.perf_counter()
        time.sleep(seconds)
        moved = (counters["queue_puts"] - before) * dtype.itemsize
        elapsed = time.perf_counter() - started
        busy = pump.gauges()["ray/pump_busy"]
        assert pump.error is None, pump.error
    finally:
        fragments.close()
        pump.stop()
        drain.join(10)
        episodes.close()
        counters.close()
    return moved / elapsed / 1e6, busy


def ray_get_mb_per_s(actor: type, cfg, seconds: float, warmup: float, copy: bool = False) -> float:
    """MB/s of ray.wait + ray.get alone on the same actors, as many calls in flight, timed
    as the pump is; with `copy`, each result is also copied into a buffer."""
    import ray
    import torch

    dtype = atari_dtype()
    remote = ray.remote(actor).options(num_cpus=cfg.ray.num_cpus, scheduling_strategy="SPREAD")
    handles = [remote.remote(cfg, torch.nn.Linear(1, 1), dtype, i) for i in range(cfg.actors.num)]
    pending = {h.sample.remote(0, [None]): h for h in handles for _ in range(cfg.ray.calls_in_flight)}
    buffer = np.zeros(cfg.ray.fragments_per_call * cfg.actors.envs_per_actor, dtype)
    moved, started, measuring = 0, None, False
    try:
        while True:
            now = time.perf_counter()
            if started is None and moved:  # the actors have started
                started = now
            if not measuring and started is not None and now - started >= warmup:
                moved, started, measuring = 0, now, True
            elif measuring and now - started >= seconds:
                return moved / (now - started) / 1e6
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.05)
            for ref in ready:
                handle = pending.pop(ref)
                fragments = ray.get(ref, timeout=10).fragments
                if copy:
                    buffer[:] = fragments
                moved += fragments.nbytes
                pending[handle.sample.remote(0, [None])] = handle
    finally:
        pending.clear()
        for handle in handles:
            ray.kill(handle)


def pump_rounds(name: str, actor: type, trainer_cpus: set[int] | None, cfg, args) -> dict:
    """The pump, the pump into Discard, ray.get alone, and ray.get and a copy, alternating;
    their medians."""
    everywhere = os.sched_getaffinity(0)
    if trainer_cpus is not None:  # this thread, and the pump and learner threads it starts
        os.sched_setaffinity(0, trainer_cpus)
    per_call = cfg.ray.fragments_per_call * cfg.actors.envs_per_actor
    print(f"-- {per_call} fragments per call ({per_call * atari_dtype().itemsize / 1e6:.1f} MB), {name}",
          flush=True)
    pump, busy, discarded, alone, copied = [], [], [], [], []
    try:
        for i in range(args.rounds):
            rate, share = pump_mb_per_s(actor, cfg, args.seconds, warmup=1.0)
            pump.append(rate)
            busy.append(share)
            discarded.append(pump_mb_per_s(actor, cfg, args.seconds, warmup=1.0, discard=True)[0])
            alone.append(ray_get_mb_per_s(actor, cfg, args.seconds, warmup=1.0))
            copied.append(ray_get_mb_per_s(actor, cfg, args.seconds, warmup=1.0, copy=True))
            print(f"round {i + 1}: pump {pump[-1]:6.0f} MB/s (busy {busy[-1]:.2f}), pump into Discard "
                  f"{discarded[-1]:6.0f}, ray.get alone {alone[-1]:6.0f}, ray.get and a copy "
                  f"{copied[-1]:6.0f}", flush=True)
    finally:
        os.sched_setaffinity(0, everywhere)
    med = statistics.median
    # Each round's pump against the ray.get right after it: paired, a load that comes and
    # goes moves both.
    paired = med(p / a for p, a in zip(pump, alone))
    return {"setting": f"{per_call} per call, {name}", "pump": med(pump), "busy": med(busy),
            "discarded": med(discarded), "alone": med(alone), "copied": med(copied), "paired": paired}


# ------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--rounds", type=int, default=5, help="pump / ray.get rounds, alternating")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured per round")
    parser.add_argument("--actors", type=int, default=2, help="remote actors for the pump rounds")
    parser.add_argument("--per-call", type=int, nargs="+", default=[1, 4],
                        help="fragments_per_call for the pump rounds (each: 8 fragments)")
    parser.add_argument("--pin", action="store_true",
                        help="also with the actors on one core and the trainer on the others")
    parser.add_argument("--learners", type=int, nargs="+", default=[1, 2],
                        help="learner counts for the learner rounds")
    parser.add_argument("--learner-tasks", nargs="+", choices=list(LEARNER_CONFIGS), default=list(LEARNER_CONFIGS))
    parser.add_argument("--skip", choices=["cartpole", "pump", "learners"], nargs="*", default=[])
    parser.add_argument("--actor-counts", type=int, nargs="+", default=[],
                        help="process actor counts for whole runs (none: no such runs)")
    parser.add_argument("--actor-task", choices=list(LEARNER_CONFIGS), default="pong")
    parser.add_argument("--actor-seconds", type=float, default=30.0, help="length of each of those runs")
    args = parser.parse_args()
    exit_on_sigterm()

    print(machine("numpy", "torch", "gymnasium", "ray"))
    if "learners" not in args.skip:  # before Ray starts: forking learner processes wants one thread
        learner_rounds(args)
    if args.actor_counts:
        actor_rounds(args)
    if "cartpole" in args.skip and "pump" in args.skip:
        return
    import ray

    # One Ray instance for every run, on 127.0.0.1, as a cluster already running would be.
    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False,
             num_cpus=max(os.cpu_count() or 1, 2), logging_level="warning")
    try:
        if "cartpole" not in args.skip:
            print(f"\n== CartPole-v1 to a last-{WINDOW} mean of {THRESHOLD:g} (configs/cartpole.yaml, "
                  "2 actors x 8 envs)", flush=True)
            runs: dict[str, list[dict]] = {"process": [], "ray": []}
            for seed in args.seeds:
                for mode in runs:  # one run at a time, alternating
                    r = cartpole(mode, seed)
                    runs[mode].append(r)
                    print(f"{mode:8} seed {seed}: reached at {r['wall']:5.1f} s, {r['steps']:6d} steps; "
                          f"{r['sps']:7.0f} steps/s (median perf/sps); restarts {r['restarts']}",
                          flush=True)
            med = {mode: {k: statistics.median(r[k] for r in rs) for k in ("wall", "steps", "sps")}
                   for mode, rs in runs.items()}
            print(f"\n{'actors':8} {'wall to 475 s':>13} {'steps then':>10} {'steps/s':>8}   (medians)")
            for mode, m in med.items():
                print(f"{mode:8} {m['wall']:13.1f} {m['steps']:10.0f} {m['sps']:8.0f}")
            ratio = med["ray"]["sps"] / med["process"]["sps"]
            print(f"ray / process: steps/s {ratio:.2f} (bar {RAY_BAR:.2f}: "
                  f"{'met' if ratio >= RAY_BAR else 'NOT met'}), wall to 475 "
                  f"{med['ray']['wall'] / med['process']['wall']:.2f}")
        if "pump" not in args.skip:
            size = atari_dtype().itemsize
            print(f"\n== the pump on Atari-sized fragments: {T} steps of 4x84x84 uint8, "
                  f"{size / 1e6:.2f} MB each; {args.actors} actors of {E} environments, 2 calls "
                  f"in flight each; {args.seconds:g} s per measurement, {args.rounds} rounds", flush=True)
            settings = {"every process on every core": (None, None)}
            cores = sorted(os.sched_getaffinity(0))
            if args.pin and len(cores) >= 2:
                settings[f"actors on core {cores[-1]}, the trainer on the rest"] = (
                    {cores[-1]}, set(cores[:-1]))
            rows = [pump_rounds(name, ready_fragments(actor_cpus), trainer_cpus,
                                pump_config(args.actors, per_call), args)
                    for per_call in args.per_call for name, (actor_cpus, trainer_cpus) in settings.items()]
            print(f"\nMB/s, medians; pump/get also as the median of each round's pump over its ray.get\n"
                  f"{'setting':40} {'pump':>6} {'busy':>5} {'Discard':>7} {'ray.get':>7} {'+ copy':>6} "
                  f"{'pump/get':>8} {'per round':>9} {'Discard/get':>11}")
            for r in rows:
                ratio = r["pump"] / r["alone"]
                print(f"{r['setting']:40} {r['pump']:6.0f} {r['busy']:5.2f} {r['discarded']:7.0f} "
                      f"{r['alone']:7.0f} {r['copied']:6.0f} {ratio:8.2f} {r['paired']:9.2f} "
                      f"{r['discarded'] / r['alone']:11.2f}"
                      f"{'' if ratio >= PUMP_BAR else '   (bar ' + format(PUMP_BAR, '.2f') + ': not met)'}")
        print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
