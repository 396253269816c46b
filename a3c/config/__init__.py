"""Run configuration: what a run is, as typed fields with one-line help, and nothing else.

    schema.py   the sections and their fields (types, defaults, help, allowed values)
    rules.py    validation: types, ranges, unknown keys and cross-field rules, all at once
    load.py     YAML files and shipped configs by name, dotted overrides, saving
    reference.py  the config described for people: `a3c config`, docs/configuration.md

Loading a config imports no environment, torch or queue: what a config names outside
itself (environments, devices) is checked by a3c.envs.preflight when a run starts.
"""
from .load import apply_overrides, config_path, config_to_dict, load_config, save_config, shipped_configs
from .reference import config_table, describe
from .schema import (ActorsConfig, CheckpointConfig, Config, ConfigError, EnvConfig, EvalConfig, LearnersConfig,
                     LoggingConfig, ModelConfig, OptimConfig, RayConfig, ReplayConfig, SelfPlayConfig, VTraceConfig,
                     field_help)

__all__ = ["ActorsConfig", "CheckpointConfig", "Config", "ConfigError", "EnvConfig", "EvalConfig", "LearnersConfig",
           "LoggingConfig", "ModelConfig", "OptimConfig", "RayConfig", "ReplayConfig", "SelfPlayConfig",
           "VTraceConfig", "apply_overrides", "config_path", "config_table", "config_to_dict", "describe", "field_help",
           "load_config", "save_config", "shipped_configs"]
