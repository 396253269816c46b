"""Time to a trained policy on the classic suite: this trainer's shipped configs against
Stable-Baselines3 PPO with the RL Zoo's hyperparameters, side by side in one run.

Every method trains every task for the same budget (the config's total_timesteps), with
no early stop, one run at a time, torch on one thread in the trainer's process. For each
run it records the wall seconds from launch (building the agent; imports excluded) until
the mean return of the last 100 episodes first reaches the task's threshold, the env
steps at that moment, and the mean of the last 100 episodes at the end of the budget
(a run that solves and then collapses ends below the threshold), and the lowest last-100
mean after that first time. For this trainer it also records throughput, the learner's
busy fraction and the sample reuse, with the shipped config and with reuse switched off.

--stability asks whether a solved policy stays solved: CartPole, Acrobot and LunarLander,
3 seeds each, trained for 10 times their budgets (so that the learning rate's linear
decay is still near its start long after the first solve), reporting the lowest last-100
mean after first reaching the threshold.

    python scripts/bench_train.py                           # the suite (about 45 min on 2 cores)
    python scripts/bench_train.py --tasks acrobot --only a3c ppo
    python scripts/bench_train.py --ablation --seeds 1 2 3  # each part switched off
    python scripts/bench_train.py --tasks cartpole acrobot --only a3c a3c-threads
    python scripts/bench_train.py --tasks pendulum lunarlander --only a3c-defaults ppo
    python scripts/bench_train.py --tasks lunarlander-long --only no-prox a3c ppo --seeds 1  # 50 min
    python scripts/bench_train.py --stability               # about 2 hours on 2 cores
    python scripts/bench_train.py --stability --tasks cartpole acrobot --only a3c ppo  # SB3 too: hours
    python scripts/bench_train.py --stability --tasks cartpole --only constant-lr ppo-constant-lr
    python scripts/bench_train.py --tasks breakout invaders --only a3c ppo ppo-cnn  # hours
    python scripts/bench_train.py --tasks invaders --only a3c --marks 50 79  # when it passes SB3's finals
    python scripts/bench_train.py --tasks novel --only a3c a3c-no-lstm recurrent-ppo
    python scripts/bench_train.py --tasks hopper walker --only a3c ppo  # hours
    python scripts/bench_train.py --tasks tictactoe --seeds 1 2 3  # self-play: until no loss to random
    python scripts/bench_train.py --tasks walker hopper --only a3c epochs-2-replay-1-bound-0.1 --seeds 1 2 3
    python scripts/bench_train.py --tasks walker --only ppo a3c --seeds 1 --minutes 10
    python scripts/bench_train.py --tasks walker --only a3c --budget-scale 2.5 --minutes 10  # as long as SB3
    python scripts/bench_train.py --tasks ant cheetah --only ppo a3c --seeds 1 2 3 --minutes 10
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from machine import exit_on_sigterm, machine, time_limit  # scripts/machine.py

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 100


@dataclass(frozen=True)
class Task:
    env_id: str
    config: str | None  # None: no shipped config, the dataclass defaults (only env.id set)
    threshold: float | None  # None: the config's solved_return (a family's other tasks name their own)
    seeds: tuple[int, ...]
    budget: int | None = None  # None: the config's total_timesteps
    requires: str | None = None  # module the environment needs, or the task is skipped
    extra: str = "bench"  # the extra of pyproject.toml that installs it
    ppo: dict | None = None  # SB3's hyperparameters (None: the RL Zoo's PPO ones for env_id), and
    # then SB3 steps the config's environment (its env section: imports, wrappers), not env_id's
    suite: bool = True  # run when --tasks is not given
    family: bool = False  # the config serves a family of tasks: env_id replaces its env.id

    def __post_init__(self):
        if self.threshold is None:
            object.__setattr__(self, "threshold", solved_return(self.config))


def solved_return(config: str) -> float:
    """The bar a shipped config names (its solved_return), read from the file."""
    import yaml

    return float(yaml.safe_load((ROOT / config).read_text())["solved_return"])


TASKS = {
    "cartpole": Task("CartPole-v1", "configs/cartpole.yaml", None, (1, 2, 3, 4, 5)),
    "acrobot": Task("Acrobot-v1", "configs/acrobot.yaml", None, (1, 2, 3)),
    "pendulum": Task("Pendulum-v1", "configs/pendulum.yaml", None, (1, 2, 3)),
    # A task no config was tuned on: what a user gets who sets only env.id.
    "lunarlander": Task("LunarLander-v3", None, solved_return("configs/lunarlander.yaml"), (1, 2, 3), 1_000_000,
                        requires="Box2D"),
    # configs/lunarlander.yaml (SB3 PPO's recipe at a constant rate, with the clip centred on
    # an average of the policy) at its own budget (2 M steps, twice the zoo's), SB3 PPO beside
    # it for as long; no-prox is the recipe alone. Run only when named.
    "lunarlander-long": Task("LunarLander-v3", "configs/lunarlander.yaml", None, (1, 2, 3), requires="Box2D",
                             suite=False),
}
# MinAtar (Young and Tian 2019, arXiv:1903.03176): 10x10xC grids, no frame skip (a frame
# is an env step), sticky actions 0.1, the minimal action set (-v1). The RL Zoo has no
# MinAtar entry: SB3 PPO gets the zoo's Atari hyperparameters (hyperparams/ppo.yml,
# `atari`) without its AtariWrapper and frame stack, which are for 210x160 RGB frames (a
# MinAtar grid has no frames to skip or pool, its rewards are +1 already, and its trail
# channels show motion, so the paper stacks no frames either), and with MlpPolicy, or the
# paper's CNN (method ppo-cnn), in place of CnnPolicy, whose NatureCNN needs 36x36 images.
MINATAR_PPO = {"n_envs": 8, "n_steps": 128, "n_epochs": 4, "batch_size": 256,
               "learning_rate": "lin_2.5e-4", "clip_range": "lin_0.1", "vf_coef": 0.5,
               "ent_coef": 0.01, "policy": "MlpPolicy"}
# SB3 PPO; ppo-cnn: with the MinAtar paper's CNN (MinAtar only); recurrent-ppo: sb3-contrib's
# RecurrentPPO (tasks whose SB3 hyperparameters name an LSTM policy); ppo-constant-lr: SB3 PPO
# with the zoo's linear schedules (lin_X: the learning rate and clip range on CartPole) held
# at their start values, beside this trainer's constant-lr variant at ten times the budget.
PPO_METHODS = ("ppo", "ppo-cnn", "recurrent-ppo", "ppo-constant-lr")
# Thresholds: the return the paper's DQN ends its 5 M frames at (average over its final
# 100 episodes, 30 runs, best step size: about 10 on Breakout, 45 on Space Invaders).
# Hours per run: the MinAtar tasks run only when named (--tasks breakout invaders).
MINATAR = {"requires": "minatar", "extra": "minatar", "ppo": MINATAR_PPO, "suite": False}
TASKS["breakout"] = Task("MinAtar/Breakout-v1", "configs/minatar_breakout.yaml", None, (1, 2, 3), **MINATAR)
TASKS["invaders"] = Task("MinAtar/SpaceInvaders-v1", "configs/minatar_space_invaders.yaml", None, (1, 2, 3),
                         **MINATAR)
# CartPole without its velocities (RL Zoo's CartPoleNoVel-v1, here CartPole-v1 through the
# config's KeepObservation wrapper) against sb3-contrib's RecurrentPPO with the RL Zoo's
# hyperparameters for it (hyperparams/ppo_lstm.yml; VecNormalize on observations only), at
# the config's budget like every method (6x the zoo's 1e5 steps, over which its learning
# rate and clip decay more slowly).
# 450: the threshold of the config's learning test. Run only when named (--tasks novel).
RECURRENT_PPO = {"n_envs": 8, "n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98,
                 "n_epochs": 20, "ent_coef": 0.0, "learning_rate": "lin_0.001", "clip_range": "lin_0.2",
                 "normalize": {"norm_obs": True, "norm_reward": False}, "policy": "MlpLstmPolicy",
                 "policy_kwargs": {"ortho_init": False, "activation_fn": "ReLU", "lstm_hidden_size": 64,
                                   "enable_critic_lstm": True, "net_arch": {"pi": [64], "vf": [64]}}}
TASKS["novel"] = Task("CartPoleNoVel", "configs/cartpole_novel.yaml", None, (1, 2, 3), ppo=RECURRENT_PPO,
                      suite=False)
# MuJoCo locomotion (configs/mujoco.yaml serves the family) against SB3 PPO with the RL
# Zoo's tuned hyperparameters (hyperparams/ppo.yml, Hopper-v3 and Walker2d-v3, the -v5
# tasks' previous versions). Thresholds: Hopper's slow learning test; Walker2d's the same.
# Reported besides: the last-100 mean at 1, 3, 6 and 10 minutes from launch, and the mean
# of 10 deterministic evaluation episodes at the end (the zoo's published PPO figures at
# 1 M steps: Hopper 2410, Walker2d 3479). Hours per seed: run only when named.
# Every zoo MuJoCo entry: one environment under VecNormalize, an MLP policy.
ZOO_NORMALIZED = {"normalize": True, "n_envs": 1, "policy": "MlpPolicy"}
ZOO_MUJOCO = {**ZOO_NORMALIZED, "batch_size": 32, "n_steps": 512}
HOPPER_PPO = {**ZOO_MUJOCO, "gamma": 0.999, "learning_rate": 9.80828e-05, "ent_coef": 0.00229519,
              "clip_range": 0.2, "n_epochs": 5, "gae_lambda": 0.99, "max_grad_norm": 0.7,
              "vf_coef": 0.835671, "policy_kwargs": {"log_std_init": -2, "ortho_init": False,
                                                     "activation_fn": "ReLU",
                                                     "net_arch": {"pi": [256, 256], "vf": [256, 256]}}}
WALKER_PPO = {**ZOO_MUJOCO, "gamma": 0.99, "learning_rate": 5.05041e-05, "ent_coef": 0.000585045,
              "clip_range": 0.1, "n_epochs": 20, "gae_lambda": 0.95, "max_grad_norm": 1,
              "vf_coef": 0.871923}
# Ant: the zoo's Ant-v4 entry, SB3's PPO defaults under VecNormalize (its published PPO figure,
# Ant-v3 at 1 M steps: 1327). Threshold 2000: staying up earns 1 per step, so 1000 would not
# say the ant walks.
ANT_PPO = ZOO_NORMALIZED
# HalfCheetah: the zoo's tuned HalfCheetah-v4 entry (published PPO figure, HalfCheetah-v3 at
# 1 M steps: 5820). It never ends an episode early: threshold 3000, a cheetah that runs.
CHEETAH_PPO = {**ZOO_MUJOCO, "batch_size": 64, "gamma": 0.98, "learning_rate": 2.0633e-05,
               "ent_coef": 0.000401762, "clip_range": 0.1, "n_epochs": 20, "gae_lambda": 0.92,
               "max_grad_norm": 0.8, "vf_coef": 0.58096,
               "policy_kwargs": {"log_std_init": -2, "ortho_init": False, "activation_fn": "ReLU",
                                 "net_arch": {"pi": [256, 256], "vf": [256, 256]}}}
MUJOCO = {"budget": 1_000_000, "requires": "mujoco", "extra": "mujoco", "suite": False, "family": True}
TASKS["hopper"] = Task("Hopper-v5", "configs/mujoco.yaml", None, (1, 2, 3), ppo=HOPPER_PPO, **MUJOCO)
TASKS["walker"] = Task("Walker2d-v5", "configs/mujoco.yaml", 1000.0, (1, 2, 3), ppo=WALKER_PPO, **MUJOCO)
TASKS["ant"] = Task("Ant-v5", "configs/mujoco.yaml", 2000.0, (1, 2, 3), ppo=ANT_PPO, **MUJOCO)
TASKS["cheetah"] = Task("HalfCheetah-v5", "configs/mujoco.yaml", 3000.0, (1, 2, 3), ppo=CHEETAH_PPO, **MUJOCO)
MINUTES = (1, 3, 6, 10)  # the family tasks' wall-clock checkpoints
EVAL_EPISODES = 10

# This trainer's variants: the shipped config, and the same with one pass over each
# fragment (IMPALA's diet), and with that single pass topped up from the replay buffer.
A3C_VARIANTS = {
    "a3c": {},
    "a3c-noreuse": {"learners__epochs": 1, "learners__minibatches": 1},
    "a3c-replay": {"learners__epochs": 1, "learners__minibatches": 1, "replay__ratio": 3.0},
}
# Run only when asked for: actors as threads instead of processes, a Gaussian policy's
# log-std read from the head per state, and the dataclass defaults in place of the
# shipped config (what a config that sets only env.id gets), and the loss as it was before
# the floors that keep a solved policy solved (learners.advantage_std_floor, value_scale_floor),
# the config without its LSTM core, two learner processes in place of one thread, and the
# learner thread on a GPU (where CUDA is visible).
DEFAULTS = "a3c-defaults"
OPTIONAL = {"a3c-threads": {"actors__mode": "thread"},
            "a3c-state-std": {"model__state_dependent_std": True}, DEFAULTS: {},
            "a3c-no-floors": {"learners__advantage_std_floor": 0.0, "learners__value_scale_floor": 0.0},
            "a3c-no-lstm": {"model__lstm": 0},  # what the recurrent core costs and brings
            "a3c-2-learner-procs": {"learners__mode": "process", "learners__num": 2},
            "a3c-cuda": {"learners__device": "cuda"}}
# The shipped config with one of its parts switched off or changed (--ablation): each
# normalization, the clip, the learning-rate decay, V-trace's lambda below 1, and each floor.
ABLATIONS = {
    "no-obs-norm": {"model__normalize_obs": False},
    "no-popart": {"model__normalize_value": False},
    "no-adv-norm": {"learners__normalize_advantages": False},
    "no-clip": {"learners__clip_coef": None},
    "constant-lr": {"optim__lr_schedule": "constant"},
    "lambda-0.95": {"vtrace__td_lambda": 0.95},
    "no-adv-floor": {"learners__advantage_std_floor": 0.0},
    "no-value-floor": {"learners__value_scale_floor": 0.0},
}
# Hypotheses for the falls of a solved policy at 10x the budget, each one change
# (`--stability --tasks cartpole --only a3c own-value-torso ...`): value-loss noise
# reaching the policy through the shared torso; noise scaled up by advantage
# normalization; a horizon too short to see the cart's slow drift; the policy's entropy
# running out; and against the noise of the updates, a smaller advantage floor or
# larger minibatches (2 per pass: twice CartPole's size, 4 times Acrobot's and Pendulum's);
# Adam's step on a gradient spike after a long calm, about 3 learning rates per parameter with
# beta2 0.999 (beta1's 0.1 of the spike over the root of beta2's 0.001 of its square), 1 with 0.99,
# and never more than 1 with equal betas (Dohare et al. 2023, "Overcoming policy collapse").
# The ablation no-obs-norm serves too: observation statistics narrowing to a solved policy's states.
STABILITY_VARIANTS = {
    "own-value-torso": {"model__shared_torso": False},
    "adv-floor-1": {"learners__advantage_std_floor": 1.0},
    "gamma-0.999": {"learners__gamma": 0.999},
    # The same horizon with the value-scale floor kept at its size (1 % of targets near 100,
    # 0.1 % of targets near 1 000), which gamma 0.999 alone multiplies by ten.
    "gamma-0.999-floor-0.001": {"learners__gamma": 0.999, "learners__value_scale_floor": 0.001},
    "ent-0.01": {"learners__ent_coef": 0.01},
    "adv-floor-0.03": {"learners__advantage_std_floor": 0.03},
    "minibatches-2": {"learners__minibatches": 2},
    "adam-beta2-0.99": {"optim__betas": [0.9, 0.99]},  # the default since these runs
    "adam-beta2-0.999": {"optim__betas": [0.9, 0.999]},  # the default before them
    # further the way that helped: the first step on a spike at most 0.45 learning rates
    "adam-beta2-0.95": {"optim__betas": [0.9, 0.95]},
    "adam-betas-equal": {"optim__betas": [0.99, 0.99]},
    # Adam's step is about one learning rate whatever the gradient's size, so a solved policy's
    # noise moves it as fast as learning did. Its gradients per parameter (a norm of 0.02 over
    # CartPole's 4 675 parameters: about 2.5e-4) fall below an eps of 1e-3, and its steps shrink
    # to a quarter; a learning policy's (a norm of 0.4: 6e-3) hardly do.
    "adam-eps-1e-3": {"optim__eps": 1e-3},
    # Stale data: a queue of one batch, so that the learner trains on fresher fragments
    # (CartPole's policy lag: 15 versions, against 23 with the shipped queue of two).
    "queue-32": {"actors__queue_capacity": 32},
    # A tighter trust region: each sample moves the policy's probability of its action by
    # at most 10 % from the acting policy's, so the rare actions of a near-certain policy,
    # whose probabilities move fastest, stop sooner.
    "clip-0.1": {"learners__clip_coef": 0.1},
    # Layer normalization in the torso (it sped up MuJoCo locomotion): pre-activations kept
    # at one scale however long the network trains. It fell far deeper (66-75 on 2 seeds).
    "layer-norm": {"model__layer_norm": True},
    # Steps a third as long: LunarLander's defaults take 32 gradient steps of 1e-3 per batch,
    # and it falls while the rate is still high. It solved later on one seed of 2 and fell
    # deeper on the other (to -21.7).
    "lr-3e-4": {"optim__lr": 3e-4},
    # Twice the env steps per update, with a queue of two batches as the defaults have.
    "batch-64": {"learners__batch_size": 64, "actors__queue_capacity": 128},
    # One minibatch per pass: each gradient step on the whole batch of 512 env steps.
    "minibatches-1": {"learners__minibatches": 1},
    # The policy's steps half as long, its critic's as before.
    "policy-lr-5e-4": {"optim__lr": 5e-4, "optim__value_lr": 1e-3},
    # The zoo's horizon and trace lambda (gamma 0.999, gae_lambda 0.98), with the value-scale
    # floor kept at its size as in gamma-0.999-floor-0.001.
    "zoo-horizon": {"learners__gamma": 0.999, "vtrace__td_lambda": 0.98, "learners__value_scale_floor": 0.001},
    # The zoo's CartPole horizon and trace lambda (gamma 0.98, gae_lambda 0.8): advantages
    # that sum about 5 TD errors, not a whole 8-step fragment's, as SB3 PPO's on CartPole do.
    # At a constant rate it held 2 seeds of 5 with three times the shipped share of failures.
    "cartpole-zoo-horizon": {"learners__gamma": 0.98, "vtrace__td_lambda": 0.8},
    # Fragments twice as long, as many env steps per batch and queue: half the bootstraps.
    "unroll-32": {"actors__unroll_length": 32, "learners__batch_size": 16, "actors__queue_capacity": 32},
    # Fragments four times as long, as many env steps per batch and queue: advantages
    # that sum 32 steps of rewards on average before they bootstrap, not 8 (SB3 PPO's GAE
    # on LunarLander, lambda 0.98 and gamma 0.999 over 1 024-step rollouts, sums about 48).
    "unroll-64": {"actors__unroll_length": 64, "learners__batch_size": 8, "actors__queue_capacity": 16},
    "ent-0.02": {"learners__ent_coef": 0.02},
    # Minibatches of single steps drawn from all the batch's fragments, as SB3 PPO's are
    # drawn from all over its rollout, in place of whole fragments.
    "step-minibatches": {"learners__minibatch_split": "steps"},
    # Synchronous actors: each batch acted by the policy its update starts from (a lag of 0
    # at its first gradient step), as SB3 PPO's rollouts, in place of actors that do not wait.
    "sync": {"actors__sync": True},
    # An update ends once a minibatch's policy is 1.5 x target_kl in approx KL from its start,
    # as SB3's: on the charted runs, falls of CartPole and LunarLander came after single
    # updates with 10-15 times the median KL. 0.01 held CartPole on 5 seeds of 5 at 5 M, but
    # the slow test (1 M, alone) fell with it on 2 seeds of 3; 0.02 held 2 of 5, and
    # LunarLander's recipe on seed 3 fell with it. No config ships it.
    "target-kl-0.02": {"learners__target_kl": 0.02},
    "target-kl-0.01": {"learners__target_kl": 0.01},
    "no-target-kl": {"learners__target_kl": None},
    # PPO-EWMA: the clip centred on an average of the learner's policy over about 20 or 100
    # of its steps, not on the acting policy, so that the trust region bounds how far the
    # policy drifts over many updates, not only within one.
    "prox-0.95": {"learners__proximal_decay": 0.95},
    "prox-0.99": {"learners__proximal_decay": 0.99},  # configs/cartpole.yaml's since these runs
    # LunarLander's updates are 1 024 gradient steps: 0.999 (configs/lunarlander.yaml's since
    # these runs) trails about one update, 0.998 about half of one.
    "prox-0.999": {"learners__proximal_decay": 0.999},
    "prox-0.998": {"learners__proximal_decay": 0.998},
    "no-prox": {"learners__proximal_decay": None},  # configs/cartpole.yaml and lunarlander.yaml before them
    # V-trace's targets computed once per batch and kept for every pass, as SB3 PPO keeps
    # its advantages and returns for all its epochs.
    "fixed-targets": {"learners__fixed_targets": True},
    # SB3 PPO's rollout on LunarLander: 16 k env steps per update (here 256 fragments of 64
    # steps, with zoo-settings' fragments), in 256 minibatches of 64 steps per pass.
    "zoo-rollout": {"learners__batch_size": 256, "actors__queue_capacity": 256, "learners__minibatches": 256},
    # The same rollout as SB3 acts it: each of the 16 environments 1 024 steps in a row,
    # so that the targets bootstrap at a rollout's end, not every 64 steps.
    "zoo-rollout-1024": {"actors__unroll_length": 1024, "learners__batch_size": 16, "actors__queue_capacity": 16,
                         "learners__minibatches": 256},
    # Torsos of 128 units, twice the defaults' width, for a policy whose return is still
    # uneven as it first lands.
    "hidden-128": {"model__hidden_sizes": [128, 128]},
    # The defaults' normalizations put back into SB3's recipe: running observation
    # statistics and PopArt's value scale (with the recipe's value-scale floor, 0.001).
    "obs-norm-popart": {"model__normalize_obs": True, "model__normalize_value": True},
    # The defaults' horizon put back into SB3's recipe: gamma 0.99 and V-trace's lambda of 1.
    "default-horizon": {"learners__gamma": 0.99, "vtrace__td_lambda": 1.0},
    # The defaults' one torso for policy and value put back into SB3's recipe.
    "shared-torso": {"model__shared_torso": True},
    # The defaults' rate (1e-3, at the recipe's constant schedule) put back into SB3's recipe.
    "default-lr": {"optim__lr": 1e-3},
    # The defaults' actors that do not wait for the learner put back into SB3's recipe (with
    # its queue of one batch): actors fill the next batches while the learner trains, so
    # data is acted by a policy one or more whole updates old.
    "async": {"actors__sync": False},
    # The defaults' updates put back into SB3's recipe: 512 env steps each, in fragments of
    # 16 steps (a bootstrap every 16), in 8 minibatches of 64 steps per pass.
    "default-update": {"actors__unroll_length": 16, "learners__batch_size": 32, "actors__queue_capacity": 32,
                       "learners__minibatches": 8},
    # The defaults' entropy bonus (none) put back into SB3's recipe.
    "no-ent": {"learners__ent_coef": 0.0},
}
# LunarLander at a constant rate (the bar), with one of the changes above each; each fell
# below 200 (docs/notes/2026-12-02-ten-times-the-budget.md), own-value-torso least
# (183-195 on 3 seeds). ent-0.01, the zoo's: a policy kept from near-certainty has no rare
# actions whose probabilities swing (at a constant rate the learner keeps 18 % of its
# samples outside the clip).
# gamma-0.999, the zoo's: at 0.99 the +100 for coming to rest, hundreds of steps ahead of
# a lander that hovers, is worth little more than hovering. minibatches-2: four times the
# samples per gradient step (256 env steps of the defaults' batches of 512). no-obs-norm:
# observation statistics narrowing to a solved lander's states, so that a rough descent's
# velocities map far out. own-value-torso: the value's errors, a crash's -100 against a
# landing's +100, kept out of the policy's features (SB3's networks are separate).
# no-adv-norm: advantages in value scales, as PopArt gives them, not rescaled per
# minibatch of 4 fragments.
# Then own-value-torso with a second change: minibatches-2, which on seed 1 had the next
# smallest share of episodes below 200 and the highest final, and policy-lr-3e-4
# (SLOW_POLICY, the change alone): the policy's steps a third as long while its own critic
# keeps the shipped rate (lr-3e-4 slowed the critic too, and solved later on one seed of
# 2). Each had its lowest mean within 170 k steps of the first hit on 3 seeds
# (policy-lr-3e-4 held seed 1), but reached 200 five to ten times later than the defaults.
# Then own-value-torso and minibatches-2 with a third change, against the dip as the mean
# first crosses 200 (tried for 3 M steps on seed 1, `--budget-scale 3`): ent-0.01, the zoo's
# bonus, keeping a policy still learning to land from near-certainty; lambda-0.95, less
# variance in the advantages; clip-0.1, a tighter trust region; no-popart, raw-scale value
# targets as SB3 has; batch-64, twice the env steps per update. Only ent-0.01 held seed 1
# there; over 10 M steps it held 2 seeds of 5, and the other 3 had their lowest point
# right after their first hit.
# Then, against that dip, on seeds 3 and 5 (on which ent-0.01 fell twice), for 3 M steps:
# minibatches-1, each step on the whole batch; policy-lr-5e-4, shorter policy steps;
# zoo-horizon, the zoo's gamma and lambda; unroll-32, half the bootstraps from a critic
# still learning; ent-0.01 on the defaults' eight minibatches, which a separate torso alone
# solved with in fewer steps; and ent-0.02, a larger bonus. Then, on top of ent-0.02, what
# SB3 PPO (which holds there) does otherwise or a wider net might: hidden-128, no-obs-norm,
# queue-32 (fresher data), batch-64-minibatches-4 (larger updates), adam-beta2-0.999.
# Then on top of ent-0.02: layer-norm, which let a constant rate hold Walker2d-v5; unroll-64,
# advantages that sum more rewards before they bootstrap, alone and with zoo-horizon. And
# zoo-settings, SB3's settings together in place of those changes (in 8 minibatches, and
# 2). Then step-minibatches, SB3's minibatches of steps drawn from all over the batch, on
# top of ent-0.02 (in 2 minibatches and in 8, and in 8 with queue-32 against the lag of a
# learner that cannot keep up) and of zoo-settings. Then sync, actors that wait for each
# update (data acted by the policy its update starts from, as SB3 PPO's), on top of
# ent-0.02 in 2 minibatches of fragments and in 8 of steps, and with zoo-rollout on top of
# zoo-settings and step-minibatches. Then fixed-targets, SB3's targets kept for every pass,
# on that and on ent-0.02 in 2 minibatches, and zoo-rollout-1024, SB3's rollout acted 1 024
# steps in a row, with fixed-targets (and two seeds without): SB3 PPO's LunarLander recipe,
# which held 6 runs of 7 (the seventh's lowest, 199.8, came at its first crossing), shipped
# as configs/lunarlander.yaml (its slow test held 3 seeds of 3 more). Then, one each put
# back into that recipe, the defaults' normalizations (obs-norm-popart: 1 of 2 fell),
# horizon (default-horizon: 2 of 2 held, landing twice as late), shared torso
# (shared-torso: 1 of 2 landed in 2 M steps, late), rate (default-lr: 4 of 4 landed
# sooner, 3 held for 2 M steps), no bonus (no-ent: 2 of 2 landed sooner and dipped to
# 198.8-198.9 as they first crossed), Adam's beta2 (adam-beta2-0.99: 2 of 2 held), actors
# that do not wait (async: 2.5 updates of 16 k env steps behind; 1 of 2 landed, at
# 1.97 M) and updates of 512 env steps (default-update: 0 of 2 landed in 2 M). Then the
# clip centred on an average of the policy (prox-0.999), against the one fall of the
# recipe's 20 M run: 3 seeds of 3 held 20 M steps once past their first crossing, landing
# later; configs/lunarlander.yaml since. The results are in docs/notes/2026-12-02-ten-times-the-budget.md ("Ten
# times the budget").
SLOW_POLICY = {"optim__lr": 3e-4, "optim__value_lr": 1e-3}


def _changes(*names: str) -> dict:
    """The changes of the named variants, later names winning."""
    known = {**ABLATIONS, **STABILITY_VARIANTS, "policy-lr-3e-4": SLOW_POLICY}
    changes = {}
    for name in names:
        changes |= known[name]
    return changes


def _constant_rate(*names: str) -> dict:
    """The defaults at a constant rate, with the changes of the named variants."""
    return _changes("constant-lr", *names)


STABILITY_VARIANTS |= {
    # Twice the env steps per update in minibatches of the same size: as many gradient
    # steps per env step as two minibatches of the shipped batch (SB3 PPO's updates on
    # LunarLander take 16 k env steps).
    "batch-64-minibatches-4": _changes("batch-64") | {"learners__minibatches": 4},
    # configs/cartpole_novel.yaml with configs/cartpole.yaml's pair against late falls: the
    # average of the policy and Adam's beta2 of 0.99 (`--tasks novel`).
    "prox-0.99-adam-beta2-0.99": _changes("prox-0.99", "adam-beta2-0.99"),
    # Every setting of the zoo's LunarLander PPO that this trainer has, at once: separate
    # networks, raw observations and value targets, gamma 0.999 and lambda 0.98, the bonus
    # of 0.01, Adam at 3e-4 with beta2 0.999, and, in the defaults' 8 minibatches of a batch
    # of 8 fragments of 64 steps, minibatches of 64 env steps: 32 gradient steps per 512
    # env steps as SB3's 1 024 per 16 k. What stays this trainer's: actors that do not wait
    # for the learner, V-trace's targets, and minibatches of whole fragments (here one
    # each; SB3 draws its 64 steps from all over its rollout). zoo-horizon's value-scale
    # floor does nothing without PopArt.
    "zoo-settings": _changes("own-value-torso", "no-obs-norm", "no-popart", "zoo-horizon", "ent-0.01",
                             "lr-3e-4", "adam-beta2-0.999", "unroll-64"),
}

# CartPole at a constant rate (3 seeds of 5 held, two dipped to 439 and 449; in a later
# sitting 2 of 5, with falls to 177, 392 and 401), against its dips: sync, each batch acted
# by the policy its update starts from (a policy lag of 3.5 versions against 23), and
# lr-3e-4, steps a third as long. Both fell deeper than the first sitting's dips: sync to
# 117 and 204 on seeds 1-2, lr-3e-4 to 112 on seed 3 (it held seed 4).
STABILITY_VARIANTS |= {"constant-lr-" + "-".join(names): _constant_rate(*names) for names in (
    ("sync",), ("lr-3e-4",), ("target-kl-0.02",), ("target-kl-0.01",), ("no-target-kl",),
    ("prox-0.95",), ("prox-0.99",), ("no-prox",),
    ("ent-0.01",), ("gamma-0.999",), ("minibatches-2",), ("no-obs-norm",), ("own-value-torso",), ("no-adv-norm",),
    ("cartpole-zoo-horizon",),
    ("own-value-torso", "minibatches-2"), ("own-value-torso", "policy-lr-3e-4"),
    *(("own-value-torso", "minibatches-2", name) for name in
      ("ent-0.01", "lambda-0.95", "clip-0.1", "no-popart", "batch-64")),
    ("own-value-torso", "ent-0.01"), ("own-value-torso", "ent-0.01", "minibatches-1"),
    ("own-value-torso", "minibatches-2", "ent-0.02"),
    *(("own-value-torso", "minibatches-2", "ent-0.02", name) for name in
      ("hidden-128", "no-obs-norm", "queue-32", "adam-beta2-0.999")),
    ("own-value-torso", "ent-0.02", "batch-64-minibatches-4"),
    *(("own-value-torso", "minibatches-2", "ent-0.02", *names) for names in
      (("layer-norm",), ("unroll-64",), ("zoo-horizon", "unroll-64"))),
    ("zoo-settings",), ("zoo-settings", "minibatches-2"),
    ("own-value-torso", "minibatches-2", "ent-0.02", "step-minibatches"),
    ("own-value-torso", "ent-0.02", "step-minibatches"), ("zoo-settings", "step-minibatches"),
    ("own-value-torso", "ent-0.02", "step-minibatches", "queue-32"),
    ("own-value-torso", "minibatches-2", "ent-0.02", "sync"),
    ("own-value-torso", "ent-0.02", "step-minibatches", "sync"),
    ("zoo-settings", "step-minibatches", "sync", "zoo-rollout"),
    ("zoo-settings", "step-minibatches", "sync", "zoo-rollout", "fixed-targets"),
    ("zoo-settings", "step-minibatches", "sync", "zoo-rollout-1024"),
    ("zoo-settings", "step-minibatches", "sync", "zoo-rollout-1024", "fixed-targets"),
    *(("zoo-settings", "step-minibatches", "sync", "zoo-rollout-1024", "fixed-targets", name) for name in
      ("obs-norm-popart", "default-horizon", "shared-torso", "default-lr", "async", "default-update", "no-ent",
       "adam-beta2-0.99", "prox-0.999")),
    ("own-value-torso", "minibatches-2", "ent-0.02", "fixed-targets"),
    *(("own-value-torso", "minibatches-2", "ent-0.01", name) for name in
      ("policy-lr-5e-4", "zoo-horizon", "unroll-32")))}
# What configs/mujoco.yaml may lack on locomotion (`--tasks walker hopper --only a3c ...`).
# "Replay" here: a learner that finds no fresh batch trains on replayed ones instead of
# waiting, up to `ratio` replayed per fresh. The variants were measured on top of the
# config as it was before two passes, replay, the bound penalty, an initial std of 0.61
# and layer normalization became its settings, so each starts from that config
# (FOUR_PASSES) to keep the notes' commands (docs/notes/2026-11-27-mujoco.md) reproducing its figures.
NO_LAYER_NORM = {"model__layer_norm": False}
FOUR_PASSES = {"learners__epochs": 4, "replay__ratio": 0.0, "learners__bound_coef": 0.0,
               "model__log_std_init": 0.0, **NO_LAYER_NORM}
MUJOCO_VARIANTS = {name: {**FOUR_PASSES, **overrides} for name, overrides in {
    # configs/mujoco.yaml before two passes, replay and the bound penalty
    "four-passes": {},
    # fewer passes, so that the learners keep up with the actors and the data stays fresh
    "epochs-2": {"learners__epochs": 2},
    "epochs-2-replay-1": {"learners__epochs": 2, "replay__ratio": 1.0},
    # the same, and the Gaussian's means held inside the action bounds by a penalty
    "epochs-2-replay-1-bound-0.1": {"learners__epochs": 2, "replay__ratio": 1.0, "learners__bound_coef": 0.1},
    "epochs-1-replay-3": {"learners__epochs": 1, "replay__ratio": 3.0},
    # traces four times as long, as many steps per batch and queue: fewer advantages end in
    # a bootstrap a step or two away
    "unroll-64": {"actors__unroll_length": 64, "learners__batch_size": 8, "actors__queue_capacity": 16},
    # the ablation's trace lambda of 0.95 and the classic tasks' Adam beta2, as they ran on Walker2d-v5
    "four-passes-lambda-0.95": ABLATIONS["lambda-0.95"],
    "four-passes-adam-beta2-0.99": STABILITY_VARIANTS["adam-beta2-0.99"],
    # minibatches of 128 env steps: half the gradient steps per batch for the same passes
    "minibatches-4": {"learners__minibatches": 4},
    # twice the reuse in as many gradient steps per batch as the shipped config
    "epochs-8-minibatches-4": {"learners__epochs": 8, "learners__minibatches": 4},
    "minibatches-4-replay-1": {"learners__minibatches": 4, "replay__ratio": 1.0},
    # advantages always scaled to unit std (no floor), as SB3 PPO does
    "adv-floor-0": {"learners__advantage_std_floor": 0.0},
    # SB3's recipe of many small steps: as far per batch in lr x steps as the zoo's Walker2d
    # settings (10 passes of 16 minibatches of 32 env steps at 1e-4; the zoo: 20 x 16 at
    # 5e-5), from a queue of one batch so that the slower learners meet data no staler
    "small-steps": {"learners__epochs": 10, "learners__minibatches": 16, "optim__lr": 1e-4,
                    "actors__queue_capacity": 32},
    # SLOW_POLICY (optim.lr=3e-4 for both learned more slowly): fewer samples outside
    # the clip, the critic as quick
    "policy-lr-3e-4": SLOW_POLICY,
    # the critic's steps three times as long, the policy's as before
    "value-lr-3e-3": {"optim__value_lr": 3e-3},
}.items()}
# On top of configs/mujoco.yaml as it was before layer normalization (two passes, replay,
# the bound penalty, std 0.61; `no-layer-norm`): the actions' initial std, which the zoo
# sets to e^-2 on Hopper and HalfCheetah and leaves at SB3's 1 on Walker2d and Ant
# (`--tasks cheetah --only a3c log-std-init--1 ...`). 0 (std 1) reruns the config as it
# was before -0.5 became its setting. And SLOW_POLICY on the same config: the one change
# that beat the four-pass config on every Walker2d-v5 seed it ran (it left Hopper-v5
# standing still on one seed of three then).
FAMILY_VARIANTS = {**{f"log-std-init-{log_std:g}": {"model__log_std_init": log_std, **NO_LAYER_NORM}
                      for log_std in (0.0, -1.0, -2.0)},
                   "shipped-policy-lr-3e-4": {**SLOW_POLICY, **NO_LAYER_NORM},
                   "no-layer-norm": NO_LAYER_NORM}
VARIANTS = {**A3C_VARIANTS, **OPTIONAL, **ABLATIONS, **STABILITY_VARIANTS, **MUJOCO_VARIANTS,
            **FAMILY_VARIANTS}
# --stability: whether a solved policy stays solved, on the tasks that solve well before
# the end of their budgets.
STABILITY_TASKS = ["cartpole", "acrobot", "lunarlander"]


# Learner charts whose mean over a run is reported beside its returns.
CHARTS = {"policy_lag/mean": "policy_lag", "losses/clip_fraction": "clip_fraction",
          "losses/approx_kl": "approx_kl", "losses/explained_variance": "explained_variance"}
PARTS = {"actor_env_s": "actors: envs.step", "actor_policy_s": "actors: policy work",
         "actor_queue_s": "actors: waiting in put_many", "actor_sync_s": "actors: waiting for an update",
         "learner_update_s": "learner: update", "learner_queue_s": "learner: waiting in get_many"}


@dataclass
class Result:
    """One run: when the last-100 mean first reached the threshold, and how it ended."""
    threshold: float
    start: float = field(default_factory=time.perf_counter)
    window: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    hit: tuple[float, int] | None = None  # (wall seconds from launch, env steps)
    lowest: float = float("nan")  # the lowest last-100 mean from the first hit on
    lowest_at: int = 0  # the env steps then
    lowest_std: float = float("nan")  # the std of the 100 returns of that mean
    after: int = 0  # episodes that ended after the first hit
    below: int = 0  # of those, the ones whose return was below the threshold
    time_limit: int | None = None  # the task's episode step limit (None: none)
    timed_out: int = 0  # of the ones below, those that ran to the time limit
    wall: float = 0.0
    steps: int = 0
    extra: dict = field(default_factory=dict)
    curve: list = field(default_factory=list)  # (wall s, env steps, last-100 mean) after every episode
    evaluation: float = float("nan")  # mean return of deterministic episodes at the end (family tasks)
    cores: dict = field(default_factory=dict)  # cores busy per part of this trainer

    def episode(self, step: int, ret: float, length: int | None = None) -> None:
        self.window.append(ret)
        if self.hit is not None:
            self.after += 1
            self.below += ret < self.threshold
            self.timed_out += ret < self.threshold and self.time_limit is not None and length == self.time_limit
        if len(self.window) < WINDOW:
            return
        mean, now = float(np.mean(self.window)), time.perf_counter() - self.start
        self.curve.append((now, step, mean))
        if self.hit is None and mean >= self.threshold:
            self.hit, self.lowest = (now, step), float("inf")
        if self.hit is not None and mean < self.lowest:
            # A tenth of the std is the standard error of the mean of these 100 episodes:
            # a lowest point that far below the threshold can be the window's noise alone.
            self.lowest, self.lowest_at, self.lowest_std = mean, step, float(np.std(self.window))

    def finish(self, steps: int) -> Result:
        self.wall, self.steps = time.perf_counter() - self.start, steps
        return self

    def reached(self, value: float) -> tuple[float, int] | None:
        """(wall seconds from launch, env steps) when the last-100 mean first reached value."""
        return next(((t, steps) for t, steps, mean in self.curve if mean >= value), None)

    def at(self, seconds: float) -> float:
        """The last-100 mean `seconds` from launch (nan before the first 100 episodes). A
        run that had ended by then counts with its final mean: the policy a user has then."""
        if seconds > self.wall:
            return self.final
        return next((mean for t, _, mean in reversed(self.curve) if t <= seconds), float("nan"))

    @property
    def final(self) -> float:
        return float(np.mean(self.window)) if len(self.window) == WINDOW else float("nan")

    @property
    def solved(self) -> bool:
        return self.final >= self.threshold

    @property
    def below_share(self) -> float:
        """The share of the episodes after the first hit whose return was below the
        threshold: steadier than the lowest mean, which one cluster of falls sets."""
        return self.below / self.after if self.after else float("nan")

    @property
    def timed_out_share(self) -> float:
        """Of those episodes, the share that ran to the time limit rather than ending (on
        LunarLander: a lander that hovers rather than one that crashes or lands badly)."""
        return self.timed_out / self.below if self.below else float("nan")


def episode_limit(env_id: str) -> int | None:
    """The step limit of env_id's episodes, as registered (None: none, or not registered)."""
    import gymnasium as gym

    try:
        return gym.spec(env_id).max_episode_steps
    except gym.error.Error:  # registered by a config's imports (MinAtar, Atari)
        return None


# Fields a tuned config may set otherwise that are not what a3c-tuned compares.
NOT_TUNED = ("name", "seed", "total_timesteps", "logging.", "checkpoint.", "eval.")


def tuned_overrides(path: str, task: Task) -> dict:
    """The overrides (A3C's `section__field` keywords) that turn the task's shipped config
    into the config at `path`, except NOT_TUNED; printed."""
    from operator import attrgetter

    from a3c.config import load_config
    from a3c.config.schema import leaves

    tuned, shipped = load_config(path), load_config(ROOT / task.config)
    overrides = {key.replace(".", "__"): attrgetter(key)(tuned) for key, _, _ in leaves()
                 if not key.startswith(NOT_TUNED) and attrgetter(key)(tuned) != attrgetter(key)(shipped)}
    print(f"a3c-tuned: {task.config} with " + ", ".join(f"{k.replace('__', '.')}={v}" for k, v in overrides.items()))
    return overrides


def run_a3c(task: Task, seed: int, budget: int, overrides: dict, defaults: bool = False,
            seconds: float | None = None) -> Result:
    from a3c import A3C
    from a3c.metrics import MemorySink

    class Episodes(MemorySink):
        def scalar(self, tag, value, step):
            if tag == "charts/episodic_return":  # its length comes next
                self.ret = value
            elif tag == "charts/episode_length":
                result.episode(step, self.ret, int(value))
            elif tag in CHARTS:
                charts.setdefault(tag, []).append(value)

    charts: dict[str, list[float]] = {}
    result = Result(task.threshold, time_limit=episode_limit(task.env_id))
    config = {"env": {"id": task.env_id}} if defaults or task.config is None else ROOT / task.config
    if task.family:
        overrides = {"env__id": task.env_id, **overrides}
    agent = A3C(config, seed=seed, logging__progress=False, checkpoint__interval_s=0,
                logging__run_root="/tmp/a3c-bench-runs", **overrides)
    with time_limit(seconds):
        agent.learn(budget, sink=Episodes())
    result.finish(agent.num_timesteps)
    if task.family:  # after the clock stopped
        from a3c.api import evaluate

        result.evaluation = float(evaluate(agent.model, agent.config, EVAL_EPISODES).mean())
    c = agent.counters
    fresh = max(c["queue_gets"], 1)
    epochs = overrides.get("learners__epochs", agent.config.learners.epochs)
    result.cores = {part: c[part] / result.wall for part in PARTS}
    result.extra = {"learner_busy": c["learner_update_s"] / result.wall,
                    "replay_ratio": c["replayed"] / fresh,
                    "reuse": epochs * (fresh + c["replayed"]) / fresh,
                    **{name: float(np.mean(charts[tag])) for tag, name in CHARTS.items() if tag in charts}}
    if agent.config.learners.target_kl is not None:  # the share of batches whose passes it ended
        batches = c["fresh_batches"] + c["replayed"] / agent.config.learners.batch_size
        result.extra["kl_stopped"] = c["kl_stops"] / max(batches, 1)
    return result


# Tic-tac-toe (configs/tictactoe.yaml, PettingZoo's tictactoe_v3): self-play, judged by the
# run's own evaluator (selfplay.eval_games games against a uniformly random player, the policy
# taking each seat in turn), not by returns, which self-play makes zero-sum. Recorded: the wall
# seconds from launch, and the env (agent) steps, until an evaluation first has no loss.
# Run only when named (--tasks tictactoe); --only does not apply.
SELFPLAY = {"tictactoe": ("configs/tictactoe.yaml", (1, 2, 3))}


def run_selfplay(config: str, seed: int) -> tuple[tuple[float, int] | None, float, int]:
    """(wall s and steps at the first evaluation without a loss, or None; wall s; steps)."""
    from a3c import A3C
    from a3c.metrics import MemorySink

    hit = None

    class Evaluations(MemorySink):  # the trainer charts each evaluation as it ends
        def scalar(self, tag, value, step):
            nonlocal hit
            if tag == "selfplay/loss_rate" and value == 0 and hit is None:
                hit = (time.perf_counter() - start, step)

    start = time.perf_counter()
    agent = A3C(ROOT / config, seed=seed, logging__progress=False, checkpoint__interval_s=0,
                logging__run_root="/tmp/a3c-bench-runs")
    agent.learn(sink=Evaluations())
    return hit, time.perf_counter() - start, agent.num_timesteps


def zoo_hyperparams(env_id: str) -> dict:
    """RL Zoo's PPO hyperparameters for env_id, as keyword arguments."""
    import rl_zoo3
    import yaml

    path = Path(rl_zoo3.__file__).parent / "hyperparams" / "ppo.yml"
    return dict(yaml.safe_load(path.read_text())[env_id])


def run_ppo(task: Task, seed: int, budget: int, method: str = "ppo", seconds: float | None = None) -> Result:
    """SB3 PPO: `ppo` with the task's hyperparameters; `ppo-cnn` the same with the
    MinAtar paper's CNN as its features extractor (scripts/minatar_cnn.py); `recurrent-ppo`
    sb3-contrib's RecurrentPPO; `ppo-constant-lr` `ppo` with its linear schedules held at
    their start values."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    torch.set_num_threads(1)

    class Episodes(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:  # Monitor's raw return, also under VecNormalize
                    result.episode(self.num_timesteps, info["episode"]["r"], info["episode"]["l"])
            return True

    def schedule(value):
        if isinstance(value, str) and value.startswith("lin_"):
            start = float(value[4:])
            return start if method == "ppo-constant-lr" else lambda progress: progress * start
        return value

    hp = dict(task.ppo) if task.ppo else zoo_hyperparams(task.env_id)
    hp.pop("n_timesteps", None)  # the budget is the same for every method
    if "policy_kwargs" in hp and not task.ppo:
        raise SystemExit(f"{task.env_id}: the zoo's policy_kwargs are not translated here")
    n_envs, normalize, policy = hp.pop("n_envs", 1), hp.pop("normalize", False), hp.pop("policy")
    if (method == "recurrent-ppo") != policy.endswith("LstmPolicy"):
        raise SystemExit(f"{task.env_id}: its SB3 policy is {policy}; use --only "
                         + ("recurrent-ppo" if policy.endswith("LstmPolicy") else "ppo"))
    if "policy_kwargs" in hp:
        kwargs = dict(hp["policy_kwargs"])
        if "activation_fn" in kwargs:
            kwargs["activation_fn"] = getattr(torch.nn, kwargs["activation_fn"])
        hp["policy_kwargs"] = kwargs
    if method == "ppo-cnn":
        from minatar_cnn import MinAtarCNN  # scripts/minatar_cnn.py

        # The heads on the CNN's 128 features, shared, as this trainer's are.
        hp["policy_kwargs"] = {"features_extractor_class": MinAtarCNN, "net_arch": []}
    if method == "recurrent-ppo":
        from sb3_contrib import RecurrentPPO as PPO  # noqa: N814
    result = Result(task.threshold, time_limit=episode_limit(task.env_id))
    if task.ppo:  # the environment the config makes, with its imports and wrappers
        from a3c.config import load_config
        from a3c.envs import make_env

        cfg = load_config(ROOT / task.config, [f"env.id={task.env_id}"] if task.family else []).env
        env = make_vec_env(lambda: make_env(cfg), n_envs=n_envs, seed=seed)
    else:
        env = make_vec_env(task.env_id, n_envs=n_envs, seed=seed)
    if normalize:
        options = normalize if isinstance(normalize, dict) else {}  # e.g. norm_reward: false
        env = VecNormalize(env, gamma=hp.get("gamma", 0.99), **options)
    model = PPO(policy, env, seed=seed, device="cpu", **{k: schedule(v) for k, v in hp.items()})
    with time_limit(seconds):
        model.learn(budget, callback=Episodes())
    result.finish(model.num_timesteps)
    if task.family:  # deterministic episodes, observations normalized as in training
        from stable_baselines3.common.evaluation import evaluate_policy

        if normalize:
            env.training, env.norm_reward = False, False
        result.evaluation = float(evaluate_policy(model, env, n_eval_episodes=EVAL_EPISODES)[0])
    return result


def budget_of(task: Task) -> int:
    from a3c.config import load_config

    return task.budget or load_config(ROOT / task.config).total_timesteps


def write_curve(folder: Path, name: str, task: Task, method: str, seed: int, budget: int,
                result: Result) -> None:
    """--curves: one run's learning curve as JSON, for `a3c plot`: the last-100
    mean against env steps and wall seconds from launch, a point at most every 1 % of the
    budget (and the last one), with what the run was."""
    import json
    import subprocess

    points, last = [], None
    for i, (seconds, steps, mean) in enumerate(result.curve):
        if last is None or steps - last >= budget / 100 or i == len(result.curve) - 1:
            points.append((seconds, steps, mean))
            last = steps
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=10, check=False).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown"
    final = result.final
    curve = {"task": name, "env_id": task.env_id, "method": method, "seed": seed,
             "threshold": task.threshold, "budget": budget, "commit": commit,
             "env_steps": [steps for _, steps, _ in points],
             "wall_s": [round(seconds, 3) for seconds, _, _ in points],
             "mean_return": [round(mean, 3) for _, _, mean in points],
             "final": None if np.isnan(final) else final, "steps": result.steps, "wall": result.wall}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}-{method}-seed{seed}.json").write_text(json.dumps(curve) + "\n")


def fmt_hit(hit: tuple[float, int] | None) -> str:
    """(wall s, env steps) when a run reached a mean, or never."""
    return f"{hit[0]:6.1f} s {hit[1]:8d} steps" if hit else f"{'never':>6}   {'':8}      "


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", choices=[*TASKS, *SELFPLAY],
                        help="default: the tasks with a shipped config "
                             f"({' '.join(STABILITY_TASKS)} with --stability)")
    parser.add_argument("--seeds", type=int, nargs="+",
                        help="default: 5 for CartPole, 3 otherwise (3 for all with --stability)")
    parser.add_argument("--only", nargs="+", choices=[*VARIANTS, *PPO_METHODS],
                        help=f"default: {' '.join([*A3C_VARIANTS, 'ppo'])} (a3c with --stability)")
    parser.add_argument("--ablation", action="store_true",
                        help=f"run a3c and its ablations instead: {' '.join(ABLATIONS)}")
    parser.add_argument("--stability", action="store_true",
                        help="does a solved policy stay solved: a3c on the tasks above for "
                             "--budget-scale (10) times their budgets, 3 seeds each")
    parser.add_argument("--budget-scale", type=float,
                        help="train for this many times each task's budget (default: 1; 10 with --stability)")
    parser.add_argument("--minutes", type=float,
                        help="stop every run this many minutes after launch, short of its budget if need be "
                             "(the MuJoCo tasks' wall-clock checkpoints; SB3 PPO takes half an hour for Walker2d's 1 M steps)")
    parser.add_argument("--marks", type=float, nargs="+",
                        help="time these last-100 means in this trainer's runs (e.g. SB3's final "
                             "returns from an earlier run), each run stopped once it reaches the highest")
    parser.add_argument("--tuned", metavar="YAML",
                        help="also run a3c-tuned: the task's config with the fields that this config (a3c "
                             "tune's best, say) sets otherwise, budget, run and evaluation settings aside")
    parser.add_argument("--curves", metavar="DIR",
                        help="write each run's learning curve to DIR as JSON (a3c plot draws them)")
    args = parser.parse_args()
    exit_on_sigterm()
    if args.tuned:
        args.only = [*(args.only or ["a3c"]), "a3c-tuned"]
    args.tasks = args.tasks or (STABILITY_TASKS if args.stability
                                else [name for name, task in TASKS.items() if task.config and task.suite])
    selfplay = [name for name in args.tasks if name in SELFPLAY]  # judged by evaluations, not returns
    args.tasks = [name for name in args.tasks if name not in SELFPLAY]
    args.only = args.only or (["a3c"] if args.stability else
                              ["a3c", *ABLATIONS] if args.ablation else [*A3C_VARIANTS, "ppo"])
    scale = args.budget_scale or (10.0 if args.stability else 1.0)
    if args.stability and not args.seeds:
        args.seeds = [1, 2, 3]
    sb3 = [m for m in args.only if m in PPO_METHODS]
    zoo = ("rl_zoo3",) if any(not TASKS[name].ppo for name in args.tasks) else ()  # reads its ppo.yml
    contrib = ("sb3_contrib",) if "recurrent-ppo" in sb3 else ()
    if sb3 and not all(importlib.util.find_spec(m) for m in ("stable_baselines3", *zoo, *contrib)):
        print(f"{' '.join(sb3)}: stable-baselines3, sb3-contrib or rl_zoo3 is not installed "
              "(pip install -e '.[bench]'), skipped")
        args.only = [m for m in args.only if m not in PPO_METHODS]
    if "a3c-cuda" in args.only:
        import torch

        if not torch.cuda.is_available():
            print("a3c-cuda: no CUDA device is visible, skipped")
            args.only.remove("a3c-cuda")
    stop = {"target_return": max(args.marks)} if args.marks else {}  # this trainer's runs
    seconds = 60 * args.minutes if args.minutes else None
    print(machine("numpy", "torch", "gymnasium", "stable-baselines3", "sb3-contrib", "rl_zoo3"))
    table: dict[tuple[str, str], list[Result]] = {}
    for name in selfplay:
        config, seeds = SELFPLAY[name]
        print(f"\n== {name}: wall time until an evaluation of the self-play policy has no loss", flush=True)
        hits = []
        for seed in args.seeds or seeds:
            hit, wall, steps = run_selfplay(config, seed)
            hits.append(hit)
            print(f"a3c          seed {seed}: first evaluation without a loss at {fmt_hit(hit)}; "
                  f"{steps} steps in {wall:.1f} s", flush=True)
        reached = [h for h in hits if h]
        print(f"{name}: reached on {len(reached)}/{len(hits)} seeds" + (
            f", median {statistics.median(h[0] for h in reached):.1f} s, "
            f"{statistics.median(h[1] for h in reached):.0f} steps" if reached else ""), flush=True)
    if not args.tasks:
        return
    for name in args.tasks:
        task, budget = TASKS[name], int(budget_of(TASKS[name]) * scale)
        if task.requires and not importlib.util.find_spec(task.requires):
            print(f"\n{task.env_id}: {task.requires} is not installed "
                  f"(pip install -e '.[{task.extra}]'), skipped")
            continue
        print(f"\n== {task.env_id}: threshold {task.threshold:g}, budget {budget} steps", flush=True)
        for method in args.only:
            variant = tuned_overrides(args.tuned, task) if method == "a3c-tuned" else VARIANTS.get(method)
            for seed in args.seeds or task.seeds:  # one run at a time: runs must not share the cores
                r = (run_ppo(task, seed, budget, method, seconds) if method in PPO_METHODS
                     else run_a3c(task, seed, budget, {**variant, **stop},
                                  defaults=method == DEFAULTS, seconds=seconds))
                table.setdefault((name, method), []).append(r)
                if args.curves:
                    write_curve(Path(args.curves), name, task, method, seed, budget, r)
                extra = "".join(f", {k} {v:.3g}" for k, v in r.extra.items())
                if task.family:
                    extra += "; at " + ", ".join(f"{m} min {r.at(60 * m):.0f}" for m in MINUTES) + \
                             f"; deterministic eval {r.evaluation:.0f}"
                print(f"{method:12} seed {seed}: reached at {fmt_hit(r.hit)}; lowest after {r.lowest:7.1f} (step {r.lowest_at}; "
                      f"episodes below the threshold after {r.below_share:.2%}, "
                      f"of them at the time limit {r.timed_out_share:.0%}; std of its 100 returns {r.lowest_std:.1f}); "
                      f"final {r.final:7.1f} ({'solved' if r.solved else 'NOT solved'}); "
                      f"{r.steps / r.wall:6.0f} steps/s{extra}", flush=True)
                if args.marks and method not in PPO_METHODS:
                    print(f"{method:12} seed {seed}: " + "; ".join(
                        f"{mark:g}: {fmt_hit(r.reached(mark)).strip()}" for mark in args.marks), flush=True)
    print("\nmedians per task and method (wall and steps to the threshold over the seeds that reached it)")
    print(f"{'task':9} {'method':12} {'reached':>7} {'ends solved':>11} {'wall s':>7} {'steps':>8} "
          f"{'final':>7} {'steps/s':>8} {'busy':>5} {'replay':>6} {'reuse':>5}")
    for (name, method), rows in table.items():
        hits = [r.hit for r in rows if r.hit]
        med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
        extra = [med([r.extra[k] for r in rows]) if rows[0].extra else float("nan")
                 for k in ("learner_busy", "replay_ratio", "reuse")]
        print(f"{name:9} {method:12} {len(hits):>4}/{len(rows)} {sum(r.solved for r in rows):>8}/{len(rows)} "
              f"{med([h[0] for h in hits]):7.1f} {med([h[1] for h in hits]):8.0f} "
              f"{med([r.final for r in rows]):7.1f} {med([r.steps / r.wall for r in rows]):8.0f} "
              f"{extra[0]:5.2f} {extra[1]:6.2f} {extra[2]:5.1f}")
    family = [(key, rows) for key, rows in table.items() if TASKS[key[0]].family]
    if family:
        print("\nthe last-100 mean at each wall-clock checkpoint from launch (a run that had ended: its "
              f"final mean), and the deterministic evaluation ({EVAL_EPISODES} episodes) at the end of "
              "the budget, medians over seeds")
        print(f"{'task':9} {'method':12} " + " ".join(f"{f'{m} min':>7}" for m in MINUTES) + f" {'eval':>7}")
        for (name, method), rows in family:
            print(f"{name:9} {method:12} " + " ".join(
                f"{statistics.median(r.at(60 * m) for r in rows):7.0f}" for m in MINUTES)
                + f" {statistics.median(r.evaluation for r in rows):7.0f}")
    if scale != 1:
        print(f"\nholding the threshold, {scale:g}x the budgets: the lowest last-100 mean from the "
              "first time it reached the threshold to the end (held: never below the threshold again)")
        print(f"{'task':11} {'method':14} {'reached':>7} {'held':>5}  {'lowest, per seed':28} "
              f"{'final, per seed':28} episodes below after, per seed")
        per_seed = lambda xs: " ".join(f"{x:8.1f}" for x in xs)  # noqa: E731
        for (name, method), rows in table.items():
            reached, held = sum(bool(r.hit) for r in rows), sum(r.lowest >= r.threshold for r in rows)
            print(f"{name:11} {method:14} {reached:>5}/{len(rows)} {held:>3}/{len(rows)}  "
                  f"{per_seed(r.lowest for r in rows):28} {per_seed(r.final for r in rows):28} "
                  + " ".join(f"{r.below_share:8.2%}" for r in rows))
    for (name, method), rows in table.items():
        if rows[0].cores:
            print(f"{name} {method}: cores busy, median over seeds: " + ", ".join(
                f"{label} {statistics.median(r.cores[part] for r in rows):.2f}"
                for part, label in PARTS.items()))
    for (name, method), rows in table.items():
        for baseline in PPO_METHODS:
            ppo = table.get((name, baseline))
            if method not in ("a3c", DEFAULTS) or not ppo:
                continue
            if all(r.hit for r in rows + ppo):
                ratio = statistics.median(r.hit[0] for r in rows) / statistics.median(r.hit[0] for r in ppo)
                print(f"{name}: {method} wall to threshold / SB3 {baseline}'s = {ratio:.2f}")
            if TASKS[name].ppo:  # MinAtar: when this trainer reaches the return PPO ends its budget at
                target = statistics.median(r.final for r in ppo)
                wall = statistics.median(r.wall for r in ppo)
                times = [t for t, _ in filter(None, (r.reached(target) for r in rows))]
                print(f"{name}: {method} reaches SB3 {baseline}'s median final return {target:.1f} on "
                      f"{len(times)}/{len(rows)} seeds" + (
                          f", median {statistics.median(times):.0f} s against {baseline}'s {wall:.0f} s "
                          f"for its budget: {statistics.median(times) / wall:.2f} of its wall time"
                          if times else ""))


if __name__ == "__main__":
    main()
