"""Environments: where they come from, what a run checks of them before it starts, how
their observations and actions are stored, and the episodes a policy plays in them.

    sources.py    a registered id, module:EnvId, env.imports, an entry point, a factory,
                  wrappers; make_env
    vector.py     the vector of environments an actor steps, Atari's from the ALE's C++
    preflight.py  the checks of environment, device and queue a run makes before it starts
    spaces.py     observations and actions in fragment records and as tensors
    masks.py      action masks, read where users put them, as one observation entry
    multiagent.py PettingZoo games as each agent's turns (env.multiagent)
    wrappers.py   wrappers a config can name (a3c.wrappers:KeepObservation)
    play.py       the episode loop of evaluate and video
    video.py      a3c eval --video
"""
from .sources import (EnvError, check_env_factory, env_action, factory_keywords, factory_name, import_env_module,
                      load_object, make_env, wrapper_spec)
from .vector import make_vector_env

__all__ = ["EnvError", "check_env_factory", "env_action", "factory_keywords", "factory_name", "import_env_module",
           "load_object", "make_env", "make_vector_env", "wrapper_spec"]
