"""Models: the actor-critic network the trainer builds for a pair of spaces.

    torsos.py        observations -> features (MLP, CNNs, several inputs)
    heads.py         features -> actions: one head per kind of action space
    actor_critic.py  torso (+ a recurrent core) + policy head + value head
    normalize.py     running statistics of observations and value targets (PopArt)
    weights.py       an actor's private copy of the policy, kept current
"""
from __future__ import annotations

import gymnasium as gym

from ..config import ModelConfig
from .actor_critic import ActorCritic

__all__ = ["ActorCritic", "build_model"]


def build_model(observation_space: gym.Space, action_space: gym.Space, cfg: ModelConfig,
                action_mask: bool = True) -> ActorCritic:
    """The actor-critic a config's `model` section describes, for these spaces;
    `action_mask`: whether a masked observation's mask masks the logits (env.action_mask
    is not none)."""
    return ActorCritic(observation_space, action_space, cfg.hidden_sizes, cfg.activation, cfg.cnn,
                       cfg.normalize_obs, cfg.normalize_value, cfg.state_dependent_std, cfg.cnn_arch,
                       cfg.lstm, cfg.shared_torso, cfg.log_std_init, cfg.layer_norm, action_mask,
                       cfg.precision)
