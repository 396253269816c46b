"""a3c: asynchronous actor-learner RL (A3C with V-trace correction) on the replay queue."""
from importlib import import_module

__all__ = ["A3C", "Config", "ConfigError", "evaluate", "load_config"]
_HOME = {"A3C": ".api", "evaluate": ".api", "Config": ".config", "ConfigError": ".config",
         "load_config": ".config"}


def __getattr__(name: str):
    # Imported on first use, so that `a3c.cli` starts (and can name a missing extra)
    # without importing torch.
    if name in _HOME:
        return getattr(import_module(_HOME[name], __name__), name)
    raise AttributeError(f"module 'a3c' has no attribute {name!r}")
