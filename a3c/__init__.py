"""a3c: asynchronous actor-learner RL (A3C with V-trace correction) on the replay queue."""
from .api import A3C, evaluate
from .config import Config, ConfigError, load_config

__all__ = ["A3C", "Config", "ConfigError", "evaluate", "load_config"]
