"""The small CNN of the MinAtar paper as a Stable-Baselines3 features extractor, so that
SB3 PPO can be compared with this trainer on the same network (scripts/bench_train.py).

Young and Tian 2019 (arXiv:1903.03176): one 3x3 convolution of 16 filters, stride 1, on
the 10x10xC grid, then a dense layer of 128, ReLU after each: the torso that
a3c/models/torsos.py gives images smaller than 36x36. Pass `net_arch=[]` with it, so that
the policy and value heads sit on its 128 features, shared, as this trainer's do.

    PPO("MlpPolicy", env, policy_kwargs=dict(features_extractor_class=MinAtarCNN, net_arch=[]))
"""
from __future__ import annotations

import gymnasium as gym
import torch
import torch.nn as nn
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor


class MinAtarCNN(BaseFeaturesExtractor):
    """[N, H, W, C] grids (channels last, as MinAtar returns them) -> [N, 128]."""

    def __init__(self, observation_space: gym.spaces.Box, features_dim: int = 128):
        super().__init__(observation_space, features_dim)
        channels = observation_space.shape[-1]
        self.conv = nn.Sequential(nn.Conv2d(channels, 16, 3, stride=1), nn.ReLU(), nn.Flatten())
        with torch.no_grad():  # size the dense layer from a dummy forward pass
            flat = self.conv(torch.zeros(1, channels, *observation_space.shape[:2])).shape[1]
        self.linear = nn.Sequential(nn.Linear(flat, features_dim), nn.ReLU())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(self.conv(obs.float().permute(0, 3, 1, 2)))
