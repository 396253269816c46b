"""Registers `TestOnImport-v0` when imported, as packages such as minigrid do; the tests
remove it again, so that each sees the module not yet imported."""
import gymnasium as gym

ID = "TestOnImport-v0"

gym.register(ID, entry_point="envs_for_tests:Corridor", max_episode_steps=10)
