"""Ape-X DQN on CartPole-v1 with replay.PrioritizedReplayBuffer: a standalone example.

Actor processes step their own environments with an epsilon-greedy copy of a small
Q-network, each environment with a fixed epsilon of its own as in Ape-X (Horgan et al.
2018, https://arxiv.org/abs/1803.00933), and `add_many` n-step transitions into one
prioritized replay buffer in shared memory. The learner (the main process) samples
batches, trains a double DQN with a target network, writes |TD error| back as the new
priorities, and publishes its weights to the actors through shared memory. Actors may
run at most `slack` env steps ahead of `steps_per_update` steps per learner update, so
the replay ratio, and with it the learning curve, does not depend on the machine.

    python scripts/example_apex_dqn.py --steps 200000 --actors 2 --seed 1

Needs torch and gymnasium (pip install -e ".[train]"). Linux (fork, /dev/shm).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import inspect
import multiprocessing as mp
import re
import time
from collections import deque

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from replay import ArrayQueue, Counters, Empty, Full, PrioritizedReplayBuffer

# One n-step transition; discount is gamma**k for a bootstrapped k-step return, 0 at termination.
TRANSITION = np.dtype([("obs", "f4", (4,)), ("action", "i8"), ("reward", "f4"),
                       ("next_obs", "f4", (4,)), ("discount", "f4")])


@dataclasses.dataclass
class Args:
    steps: int = 200_000          # env steps budget (all actors together)
    actors: int = 2               # actor processes
    seed: int = 1                 # seeds torch, the environments and the buffer's sampler
    envs_per_actor: int = 4       # environments stepped by each actor, one batched forward
    target_return: float = 400.0  # stop once the mean return of the last 100 episodes reaches it
    buffer_size: int = 100_000    # replay capacity in transitions
    batch_size: int = 128         # transitions per learner update
    learning_starts: int = 2_000  # env steps before the first update
    steps_per_update: int = 4     # env steps per learner update (the replay ratio)
    slack: int = 1_000            # env steps the actors may run ahead of that ratio
    n_step: int = 3               # n-step returns, computed by the actors
    gamma: float = 0.99           # discount
    lr: float = 1e-3              # Adam learning rate
    alpha: float = 0.6            # priority exponent
    beta: float = 0.4             # importance-sampling exponent, annealed to 1 over the budget
    target_period: int = 500      # updates between copies into the target network
    publish_period: int = 10      # updates between weight publications to the actors
    eps_base: float = 0.1         # env i of N acts with eps_base ** (1 + eps_alpha * i / (N-1)) (Ape-X: 0.4)
    eps_alpha: float = 7.0        # spread of the epsilons (Ape-X: 7); every env's returns count
    verbose: bool = True          # print a progress line every 10 s


def q_network() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2))


def n_step_transition(pending: deque, next_obs, terminated: bool, gamma: float) -> tuple:
    """The transition of the oldest pending (obs, action, reward): its discounted n-step return."""
    obs, action, _ = pending[0]
    ret = sum(gamma ** k * r for k, (_, _, r) in enumerate(pending))
    return obs, action, ret, next_obs, 0.0 if terminated else gamma ** len(pending)


def act(rank: int, args: Args, buffer, shared_net, counters, episodes, stop) -> None:
    """One actor process: step `envs_per_actor` envs, add transitions, report episode returns."""
    try:
        torch.set_num_threads(1)
        n, total = args.envs_per_actor, args.actors * args.envs_per_actor
        ids = np.arange(rank * n, (rank + 1) * n)  # this actor's environments among all of them
        eps = args.eps_base ** (1 + args.eps_alpha * ids / max(total - 1, 1))
        rng = np.random.default_rng([args.seed, rank])
        envs = [gym.make("CartPole-v1") for _ in range(n)]
        obs = np.stack([env.reset(seed=args.seed * 1000 + int(i))[0] for env, i in zip(envs, ids)])
        pending = [deque() for _ in range(n)]  # per env, the last n_step (obs, action, reward)
        returns, net, version = np.zeros(n), q_network(), -1
        while not stop.is_set():
            # wait for the learner: keep the replay ratio (env steps per update)
            if counters["env_steps"] >= (args.learning_starts + args.slack
                                         + counters["updates"] * args.steps_per_update):
                time.sleep(0.001)
                continue
            if counters["version"] != version:  # new weights published: copy them
                version = counters["version"]
                net.load_state_dict(shared_net.state_dict())
            with torch.no_grad():
                greedy = net(torch.from_numpy(obs)).argmax(1).numpy()
            actions = np.where(rng.random(n) < eps, rng.integers(2, size=n), greedy)
            batch = []
            for i, env in enumerate(envs):
                next_obs, reward, terminated, truncated, _ = env.step(int(actions[i]))
                pending[i].append((obs[i].copy(), actions[i], reward))
                returns[i] += reward
                if terminated or truncated:  # flush the episode; a time limit still bootstraps
                    while pending[i]:
                        batch.append(n_step_transition(pending[i], next_obs, terminated, args.gamma))
                        pending[i].popleft()
                    try:
                        episodes.put_nowait(returns[i])
                    except Full:
                        pass  # the learner is not reading any more
                    returns[i] = 0.0
                    next_obs, _ = env.reset()
                elif len(pending[i]) == args.n_step:
                    batch.append(n_step_transition(pending[i], next_obs, False, args.gamma))
                    pending[i].popleft()
                obs[i] = next_obs
            if batch:
                buffer.add_many(np.array(batch, TRANSITION))
            counters.add("env_steps", n)
    except KeyboardInterrupt:
        pass  # Ctrl-C reaches every process of the group; the learner cleans up


def train(args: Args) -> tuple[float, int]:
    """Train until the target return or the step budget; return (mean of the last 100 episode
    returns, env steps used). Leaves no process or shared memory behind, also on Ctrl-C."""
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # before forking: the actors and the learner share the cores
    ctx = mp.get_context("fork")
    buffer = PrioritizedReplayBuffer(args.buffer_size, TRANSITION, alpha=args.alpha, seed=args.seed)
    counters = Counters(["env_steps", "updates", "version"])
    episodes = ArrayQueue(4096, np.float64)  # episode returns, from the actors
    q_net = q_network()
    target_net, shared_net = copy.deepcopy(q_net), copy.deepcopy(q_net).share_memory()
    optimizer = torch.optim.Adam(q_net.parameters(), lr=args.lr)
    stop = ctx.Event()
    actors = [ctx.Process(target=act, args=(rank, args, buffer, shared_net, counters, episodes, stop),
                          daemon=True) for rank in range(args.actors)]
    last100, updates, steps, start = deque(maxlen=100), 0, 0, time.perf_counter()
    next_log = start + 10
    try:
        for p in actors:
            p.start()
        if args.verbose:
            print(f"{args.actors} actors x {args.envs_per_actor} envs started", flush=True)
        while True:
            try:
                last100.extend(episodes.get_many(4096, block=False))
            except Empty:
                pass
            steps = counters["env_steps"]
            mean = float(np.mean(last100)) if last100 else 0.0
            if (len(last100) == 100 and mean >= args.target_return) or steps >= args.steps:
                break
            if args.verbose and time.perf_counter() > next_log:
                next_log += 10
                print(f"{steps:7d} steps {updates:6d} updates  mean return (last 100) {mean:6.1f}",
                      flush=True)
            if steps < args.learning_starts + updates * args.steps_per_update:  # wait for the actors
                if not all(p.is_alive() for p in actors):
                    raise RuntimeError("an actor process exited")
                time.sleep(0.0005)
                continue

            # Double DQN on a prioritized batch, weighted by importance sampling
            beta = args.beta + (1.0 - args.beta) * min(1.0, steps / args.steps)
            sample = buffer.sample(args.batch_size, beta=beta)
            b = {k: torch.from_numpy(np.ascontiguousarray(sample.records[k])) for k in TRANSITION.names}
            q = q_net(b["obs"]).gather(1, b["action"][:, None]).squeeze(1)
            with torch.no_grad():
                next_action = q_net(b["next_obs"]).argmax(1, keepdim=True)
                next_q = target_net(b["next_obs"]).gather(1, next_action).squeeze(1)
                target = b["reward"] + b["discount"] * next_q
            td = target - q
            weights = torch.from_numpy(np.asarray(sample.weights, np.float32))
            loss = (weights * nn.functional.smooth_l1_loss(q, target, reduction="none")).mean()
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(q_net.parameters(), 10.0)
            optimizer.step()
            # |TD error| clipped to 1 as in Schaul et al. (the Huber loss's gradient is at most 1):
            # new records enter at the highest priority, 1, not at a rare early spike
            buffer.update_priorities(sample.indices, td.detach().abs().clamp(1e-3, 1.0).numpy())

            updates += 1
            counters.add("updates")
            if updates % args.target_period == 0:
                target_net.load_state_dict(q_net.state_dict())
            if updates % args.publish_period == 0:
                with torch.no_grad():  # an actor may copy mid-write: a mix of two versions is harmless
                    for shared, own in zip(shared_net.parameters(), q_net.parameters()):
                        shared.copy_(own)
                counters.add("version")
    finally:
        stop.set()
        for p in actors:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
        for resource in (buffer, counters, episodes):
            resource.close()
    if args.verbose:
        print(f"{steps} env steps, {updates} updates, {time.perf_counter() - start:.1f} s: "
              f"mean return of the last {len(last100)} episodes {mean:.1f}")
    return mean, steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    helps = dict(re.findall(r"^    (\w+): .*?# (.*)$", inspect.getsource(Args), re.M))  # the comments
    for field in dataclasses.fields(Args):
        if field.type != "bool":
            parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default),
                                default=field.default, help=f"{helps[field.name]} (default {field.default})")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    ns = vars(parser.parse_args(argv))
    args = Args(verbose=not ns.pop("quiet"), **ns)
    try:
        mean, _ = train(args)
    except KeyboardInterrupt:
        print("interrupted")
        return 130
    return 0 if mean >= args.target_return else 1


if __name__ == "__main__":
    raise SystemExit(main())
