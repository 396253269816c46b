"""Remote actors on a Ray cluster (actors.mode: ray), on one machine: a head and two worker
nodes of `ray.cluster_utils.Cluster`, every one on 127.0.0.1, started once for the module
(a cluster takes seconds to start). Fragments from several nodes reach the queue once
each, acted by the version they carry; a node removed mid-run costs a restart and the
fragments it held, and the run still ends with its checkpoint; SIGTERM leaves no process
of the run or of the Ray instance it started; bad input is one line before any run folder."""
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

import numpy as np
import pytest

# Ray takes this machine's address to be 127.0.0.1 instead of the address other machines
# would reach it at (read when ray is imported, here and in every process the cluster starts).
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray", reason='Ray is not installed: pip install -e ".[ray]"')

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from a3c import A3C, evaluate  # noqa: E402
from a3c.actors.loop import EPISODE_DTYPE, fragment_dtype  # noqa: E402
from a3c.config import load_config  # noqa: E402
from a3c.metrics import MemorySink  # noqa: E402
from a3c.actors.remote import Pump  # noqa: E402
from a3c.trainer import COUNTERS, TIMERS, Trainer  # noqa: E402
from replay import ArrayQueue, Closed, Counters  # noqa: E402

from conftest import A3C_CLI, assert_one_line_error, descendants, own_process_group, running  # noqa: E402
from waiting import wait_until  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CARTPOLE = ROOT / "configs" / "cartpole.yaml"
# Each node: one CPU (one actor), a small object store; only the loopback interface.
NODE = dict(num_cpus=1, object_store_memory=80 * 2**20, node_ip_address="127.0.0.1")
LOOPBACK = re.compile(r"127\.\d+\.\d+\.\d+|::1|::ffff:127\.\d+\.\d+\.\d+")
ANY = ("0.0.0.0", "::")  # an unbound local end, or an unconnected remote one (port 0)


# ------------------------------------------------------------------------ the cluster
@pytest.fixture(scope="module")
def cluster():
    """A head and two worker nodes, one CPU each, with this process connected."""
    from ray._private import ray_constants

    # Imported before this module set the variable, ray would take this machine's address.
    assert not ray_constants.ENABLE_RAY_CLUSTER, \
        "ray was imported before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set"
    sigterm, sessions = signal.getsignal(signal.SIGTERM), set()
    made = Cluster(initialize_head=True, head_node_args=dict(NODE, include_dashboard=False))
    try:
        for _ in range(2):
            made.add_node(**NODE)
        made.wait_for_nodes()
        # The remote actors of the tests make this module's environments and policies.
        ray.init(address=made.address, logging_level="warning",
                 runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).parent)}})
        signal.signal(signal.SIGTERM, sigterm)  # ray.init's handler would outlive the module
        sessions = ray_sessions([os.getpid(), *descendants(os.getpid())])
        yield made
    finally:
        ray.shutdown()
        made.shutdown()
    wait_until(lambda: not processes_of(sessions), timeout=20, what="the cluster's processes to end")


def test_every_node_and_every_socket_of_the_cluster_is_on_the_loopback_interface(cluster):
    nodes = ray.nodes()
    assert len(nodes) == 3
    assert {node["NodeManagerAddress"] for node in nodes} == {"127.0.0.1"}
    assert_loopback_only([os.getpid(), *descendants(os.getpid())])


# ------------------------------------------------------------ fragments, versions, nodes
class StampedCounter(gym.Env):
    """Observation [env, episode, step]: `env` is the seed of the environment's first reset
    (different for every environment of every actor), then the reset count and the steps
    taken in the episode; every episode terminates after 7 steps. A fragment is named by
    its first observation, and each one starts where the one before it ended."""

    observation_space = gym.spaces.Box(0.0, 1e9, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.env, self.episode, self.step_count = None, -1, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if self.env is None:
            self.env = seed
        self.episode, self.step_count = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action):
        self.step_count += 1
        return self._obs(), 1.0, self.step_count == 7, False, {}

    def _obs(self):
        return np.array([self.env, self.episode, self.step_count], np.float32)


class TagPolicy(torch.nn.Module):
    """A policy whose log-probability is its one weight, the tag: a fragment's `logp` shows
    which published weights acted."""

    def __init__(self):
        super().__init__()
        self.tag = torch.nn.Parameter(torch.zeros(()))

    def act(self, obs, deterministic=False):
        n = len(obs)
        return torch.zeros(n, dtype=torch.int64), self.tag.detach().expand(n).clone(), torch.zeros(n)


def test_fragments_from_several_nodes_arrive_once_with_the_version_that_acted(cluster):
    E, T, actors = 2, 5, 3
    cfg = load_config({
        "env": {"id": "stamped-counter", "factory": "test_ray:StampedCounter"},
        "actors": {"mode": "ray", "num": actors, "envs_per_actor": E, "unroll_length": T,
                   "queue_capacity": 32},
        "learners": {"batch_size": 4, "minibatches": 1},
        "ray": {"fragments_per_call": 3, "calls_in_flight": 2, "weights_interval_updates": 1},
    })
    model = TagPolicy()
    dtype = fragment_dtype(StampedCounter.observation_space, StampedCounter.action_space, T)
    fragments, episodes = ArrayQueue(32, dtype), ArrayQueue(4096, EPISODE_DTYPE)
    counters = Counters(COUNTERS, TIMERS)
    pump = Pump(cfg, model, fragments, episodes, counters, env_factory=StampedCounter)
    # The test plays the learner: new weights, then their version, as a learner counts an
    # update after making it. The lock keeps a publication from falling in between, so that
    # every fragment's version names its weights exactly.
    lock = threading.Lock()
    publish = pump._publish

    def publish_whole(force=False):
        with lock:
            publish(force)

    pump._publish = publish_whole
    received = []

    def receive(seconds):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                received.append(fragments.get_many(32, timeout=0.02))
            except queue.Empty:
                assert pump.is_alive(), pump.error

    try:
        pump.start()
        wait_until(lambda: receive(0.1) or len(pump.nodes) == actors, timeout=60,
                   what="every actor's first call")
        for version in range(1, 21):
            receive(0.1)
            with lock:
                model.tag.data.fill_(version)
                counters.set("policy_version", version)
    finally:
        fragments.close()  # wakes the pump if it waits for room
        pump.stop()
        while True:
            try:
                received.append(fragments.get_many(32, block=False))  # what it had put
            except (Closed, queue.Empty):
                break
        assert pump.error is None, pump.error
        episodes.close()
        counters_now = counters.snapshot()
        counters.close()
    frags = np.concatenate(received)
    nodes = set(pump.nodes.values())
    print(f"\n{len(frags)} fragments from {actors} actors on {len(nodes)} nodes; versions "
          f"{frags['version'].min()}..{frags['version'].max()}")
    assert len(nodes) >= 2, "the actors all ran on one node"
    # Once: each environment's fragments chain, each starting where the one before ended.
    by_env = {}
    for frag in frags:
        by_env.setdefault(frag["obs"][0][0], []).append(frag)
    assert len(by_env) == actors * E
    for env, chain in by_env.items():
        chain.sort(key=lambda f: tuple(f["obs"][0][1:]))
        assert chain[0]["obs"][0][1:].tolist() == [0, 0], f"env {env}: the first fragment is missing"
        for before, after in zip(chain, chain[1:]):
            np.testing.assert_array_equal(after["obs"][0], before["last_obs"],
                                          err_msg=f"env {env}: a fragment is missing or repeated")
        versions = [int(f["version"][0]) for f in chain]
        assert versions == sorted(versions), f"env {env}: older weights after newer ones"
    # The version: one per fragment, and the one whose weights acted.
    assert (frags["version"] == frags["version"][:, :1]).all()
    np.testing.assert_array_equal(frags["logp"], frags["version"].astype(np.float32))
    assert frags["version"].max() >= 15, "the actors did not follow the published weights"
    # The counters count what arrived: T steps per fragment.
    assert counters_now["env_steps"] == T * len(frags)
    assert counters_now["queue_puts"] == len(frags)
    assert counters_now["episodes"] > 0 and counters_now["actor_env_s"] > 0


# ------------------------------------------------------------------------- learning
WINDOW = 100


# About 10-15 s a seed on 2 cores: one in the default run, the other two with -m slow.
@pytest.mark.learning
@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow),
                                  pytest.param(3, marks=pytest.mark.slow)])
def test_cartpole_with_ray_actors_reaches_475(cluster, seed, tmp_path):
    sink = MemorySink()
    solved = load_config(CARTPOLE).solved_return  # 475
    agent = A3C(CARTPOLE, seed=seed, actors__mode="ray", target_return=solved,
                logging__run_root=str(tmp_path), logging__progress=False, logging__interval_s=1.0,
                checkpoint__interval_s=0)
    started = time.monotonic()
    agent.learn(sink=sink)
    returns = [ret for _, ret in sink.scalars.get("charts/episodic_return", [])]
    window = deque(maxlen=WINDOW)
    reached = next((i for i, ret in enumerate(returns) if window.append(ret) or
                    (len(window) == WINDOW and sum(window) / WINDOW >= solved)), None)
    print(f"\ncartpole seed {seed}, ray actors: {agent.num_timesteps} env steps in "
          f"{time.monotonic() - started:.1f} s; last-{WINDOW} mean "
          f"{sum(window) / max(len(window), 1):.1f}")
    assert reached is not None, f"seed {seed}: the last-{WINDOW} mean return never reached {solved}"
    assert agent.counters["actor_restarts"] == 0
    assert {tag for tag in sink.scalars if tag.startswith("ray/")} >= {
        "ray/calls_in_flight", "ray/pump_mb_per_s", "ray/weights_age_s", "ray/weights_lag",
        "ray/fragments_lost"}


# ---------------------------------------------------------------------------- faults
class Stalling(StampedCounter):
    """An environment whose first step never returns."""

    def step(self, action):
        time.sleep(3600)


def test_a_call_that_never_returns_restarts_its_actor_and_then_fails_the_run_in_one_line(cluster):
    cfg = load_config({
        "env": {"id": "stalling", "factory": "test_ray:Stalling"},
        "actors": {"mode": "ray", "num": 1, "envs_per_actor": 1, "unroll_length": 2,
                   "max_restarts": 1},
        "learners": {"batch_size": 4, "minibatches": 1},
        "ray": {"fragments_per_call": 3, "calls_in_flight": 2, "call_timeout_s": 2.0},
    })
    dtype = fragment_dtype(Stalling.observation_space, Stalling.action_space, 2)
    fragments, episodes = ArrayQueue(8, dtype), ArrayQueue(64, EPISODE_DTYPE)
    counters = Counters(COUNTERS, TIMERS)
    pump = Pump(cfg, TagPolicy(), fragments, episodes, counters, env_factory=Stalling)
    try:
        pump.start()
        pump.join(60)
        assert not pump.is_alive(), "a call that never returns held the pump"
        restarts, lost = counters["actor_restarts"], counters["fragments_lost"]
    finally:
        pump.stop()
        fragments.close()
        episodes.close()
        counters.close()
    assert restarts == 1
    assert lost == 2 * 2 * 3  # both times, both calls out, 3 fragments of its one environment
    assert isinstance(pump.error, RuntimeError)
    message = str(pump.error)
    assert "\n" not in message
    assert "remote actor 0 failed 2 times" in message and "ray.call_timeout_s" in message
    assert "actors.max_restarts" in message


def test_a_worker_node_removed_mid_run_costs_a_restart_and_its_fragments_and_the_run_ends(
        cluster, tmp_path):
    """Then the run resumes from its checkpoint, and evaluates, as a local run does. The last
    test of the module that uses the cluster: it leaves the cluster a node short."""
    cfg = load_config(CARTPOLE, ["actors.mode=ray", "actors.num=2", "actors.envs_per_actor=4",
                                 "ray.fragments_per_call=2", "total_timesteps=20000",
                                 "logging.progress=false", "logging.interval_s=1",
                                 "checkpoint.interval_s=0", f"logging.run_root={tmp_path}"])
    trainer = Trainer(cfg, tmp_path / "run", sink=MemorySink())
    outcome = {}

    def train():
        try:
            outcome["counters"] = trainer.train()
        except BaseException as error:  # noqa: BLE001 (reported by the test)
            outcome["error"] = error

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    head = cluster.head_node.node_id
    workers = {node.node_id: node for node in cluster.worker_nodes}

    def an_actor_on_a_worker():
        pump = trainer._pump
        return pump is not None and trainer.counters["env_steps"] > 2000 and \
            any(node in workers for node in pump.nodes.values())

    wait_until(an_actor_on_a_worker, timeout=60, what="an actor on a worker node at work")
    victim = next(node for node in trainer._pump.nodes.values() if node in workers)
    assert victim != head
    steps_then = trainer.counters["env_steps"]
    cluster.remove_node(workers[victim])  # its raylet and every worker process on it: killed
    thread.join(120)
    assert not thread.is_alive(), "the run did not end after a node was removed"
    assert "error" not in outcome, outcome.get("error")
    counters = outcome["counters"]
    print(f"\nnode removed at {steps_then} steps; the run ended at {counters['env_steps']} with "
          f"{counters['actor_restarts']} restart(s) and {counters['fragments_lost']} fragments lost")
    assert counters["env_steps"] >= cfg.total_timesteps
    assert counters["actor_restarts"] >= 1
    assert counters["fragments_lost"] >= cfg.ray.fragments_per_call * cfg.actors.envs_per_actor
    assert trainer.saved and (tmp_path / "run" / "checkpoint.pt").is_file()
    assert victim not in trainer._pump.nodes.values()
    agent = A3C.load(tmp_path / "run")  # the checkpoint, as for a local run
    assert agent.num_timesteps == counters["env_steps"]
    agent.learn(2000, run_dir=tmp_path / "resumed", sink=MemorySink())
    assert agent.num_timesteps >= counters["env_steps"] + 2000
    assert evaluate(agent.model, agent.config, 1).shape == (1,)


# ------------------------------------------------------------------------ the command line
def test_sigterm_during_a_ray_run_leaves_no_process_of_the_run_or_of_its_ray_instance(tmp_path):
    """Through the command line, which starts a Ray instance of its own (ray.address null)."""
    with own_process_group(
            [*A3C_CLI, "train", str(CARTPOLE), "actors.mode=ray", "actors.num=1",
             "total_timesteps=100000000", "logging.progress=false", "checkpoint.interval_s=0",
             f"logging.run_root={tmp_path}"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        def acting():
            assert proc.poll() is None, proc.communicate()[1]
            return any("RemoteActor.sample" in cmdline(pid) for pid in descendants(proc.pid))

        wait_until(acting, timeout=90, what="the remote actor to sample")
        time.sleep(0.5)
        pids = [proc.pid, *descendants(proc.pid)]
        sessions = ray_sessions(pids)
        assert sessions, "no Ray session among the run's processes"
        assert_loopback_only(pids)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "interrupted; checkpoint written to" in stderr
    wait_until(lambda: not [pid for pid in pids if running(pid)], timeout=10,
               what="the run's processes to end")
    assert not processes_of(sessions), "processes of the run's Ray instance are left"


def test_an_unreachable_ray_address_is_one_line_before_any_run_folder(tmp_path):
    result = subprocess.run(
        [*A3C_CLI, "train", str(CARTPOLE), "actors.mode=ray", "ray.address=127.0.0.1:1",
         f"logging.run_root={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert_one_line_error(result.returncode, result.stderr, "ray.address", "127.0.0.1:1",
                          "ray start --head --port=1")
    assert not list(tmp_path.iterdir())


def test_an_unreachable_ray_address_through_the_api_raises_before_any_run_folder(tmp_path):
    from a3c.actors.cluster import ClusterError

    agent = A3C(str(CARTPOLE), actors__mode="ray", ray__address="127.0.0.1:1",
                logging__run_root=str(tmp_path))
    with pytest.raises(ClusterError, match="127.0.0.1:1"):
        agent.learn()
    assert not list(tmp_path.iterdir())


def test_ray_mode_without_ray_installed_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['ray'] = None; from a3c.cli import main; "
            f"main(['train', {str(CARTPOLE)!r}, 'actors.mode=ray', 'logging.run_root={tmp_path}'])")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert_one_line_error(result.returncode, result.stderr, "needs Ray", "pip install",
                          "a3c-replay[ray]")
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- helpers
def cmdline(pid) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def ray_sessions(pids) -> set[str]:
    """The Ray sessions (session_<date>_<pid>) that `pids` belong to, from their command lines."""
    return {m for pid in pids for m in re.findall(r"session_[\d_-]+\d", cmdline(pid))}


def processes_of(sessions) -> list[int]:
    """Running processes whose command line names one of `sessions`."""
    if not sessions:
        return []
    return [int(pid) for pid in os.listdir("/proc") if pid.isdigit() and running(pid)
            and any(s in cmdline(pid) for s in sessions)]


def _address(hex_address: str) -> str:
    """An address of /proc/net/tcp{,6}: 8 hex digits (IPv4), or 32 (IPv6, in 32-bit words),
    each word in host (little-endian) byte order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        return ".".join(map(str, words))
    if words[:12] == b"\0" * 10 + b"\xff\xff":
        return "::ffff:" + ".".join(map(str, words[12:]))
    import ipaddress

    return str(ipaddress.IPv6Address(words))


def assert_loopback_only(pids) -> None:
    """Every TCP and UDP socket of `pids` is bound to the loopback interface (or to none), and
    every connected one talks to the loopback interface."""
    inodes = set()
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:  # gone meanwhile
            continue
        inodes |= {link[8:-1] for link in links if link.startswith("socket:[")}
    seen = 0
    for table in ("tcp", "tcp6", "udp", "udp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] not in inodes:
                continue
            seen += 1
            (local, local_port), (remote, remote_port) = (
                (_address(f.split(":")[0]), int(f.split(":")[1], 16)) for f in fields[1:3])
            assert LOOPBACK.fullmatch(local) or (local in ANY and local_port == 0), \
                f"a {table} socket is bound to {local}:{local_port} (state {fields[3]})"
            assert LOOPBACK.fullmatch(remote) or (remote in ANY and remote_port == 0), \
                f"a {table} socket talks to {remote}:{remote_port}"
    assert seen > 0, "no socket of the cluster was found"
