"""The wrappers configs name as `a3c.wrappers:Name` (a3c.envs.wrappers), under that name."""
from .envs.wrappers import KeepObservation

__all__ = ["KeepObservation"]
