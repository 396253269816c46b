"""Configs in and out: YAML files and shipped configs by name, dotted overrides, saving."""
from __future__ import annotations

import copy
import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ..files import write_atomically
from .rules import validate
from .schema import Config, ConfigError

__all__ = ["apply_overrides", "config_path", "config_to_dict", "load_config", "save_config", "shipped_configs"]


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads exponent floats without a dot (3e-4) as floats, like YAML 1.2."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
                   |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


# -------------------------------------------------------------------------------------- overrides
def _set(data: dict[str, Any], key: str, value: Any, problems: list[str]) -> None:
    parts = key.split(".")
    if not all(parts):
        problems.append(f"override {key!r}: malformed dotted key")
        return
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            problems.append(f"override {key!r}: {'.'.join(parts[:i + 1])} is {child!r}, not a section")
            return
        node = child
    node[parts[-1]] = value


def _apply(data: Mapping[str, Any], items: Mapping[str, Any], problems: list[str]) -> dict[str, Any]:
    out = copy.deepcopy(dict(data))
    for key, value in items.items():
        _set(out, key, copy.deepcopy(value), problems)
    return out


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the config dict ``data`` with ``{"dotted.key": value}`` overrides set (values as given)."""
    problems: list[str] = []
    out = _apply(data, overrides, problems)
    if problems:
        raise ConfigError(problems)
    return out


def _parse_overrides(overrides: Sequence[str], problems: list[str]) -> dict[str, Any]:
    items: dict[str, Any] = {}
    for text in overrides:
        key, sep, raw = str(text).partition("=")
        if not sep or not key.strip():
            problems.append(f"override {text!r}: expected dotted.key=value")
            continue
        try:
            items[key.strip()] = _yaml(raw)
        except yaml.YAMLError as e:
            problems.append(f"override {text!r}: value is not valid YAML ({getattr(e, 'problem', e)})")
    return items


# ----------------------------------------------------------------------------------------- public
def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([f"{path}: config file not found"]) from None
    except OSError as e:
        raise ConfigError([f"{path}: cannot read config file ({e.strerror or e})"]) from None
    try:
        data = _yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = "; ".join(x for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
        raise ConfigError([f"{where}: YAML syntax error: {what}"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: top level has type {type(data).__name__}; "
                           f"expected a mapping of sections"])
    return data


# Where the shipped configs lie: inside the installed package (a wheel), or beside it in
# a clone of the repository (an editable install, or the source tree itself).
_SHIPPED = (Path(__file__).resolve().parents[1] / "configs", Path(__file__).resolve().parents[2] / "configs")
_NAME = re.compile(r"[a-z][a-z0-9_]*")


def shipped_configs() -> dict[str, Path]:
    """The configs that come with the package, by name: {"cartpole": .../cartpole.yaml, ...}."""
    folder = next((f for f in _SHIPPED if f.is_dir()), None)
    return {} if folder is None else {path.stem: path for path in sorted(folder.glob("*.yaml"))}


def config_path(source: str | os.PathLike) -> Path:
    """The YAML file a config source names: a shipped config's name, or a path."""
    shipped = shipped_configs()
    if isinstance(source, str) and source in shipped:
        return shipped[source]
    if isinstance(source, str) and _NAME.fullmatch(source) and not Path(source).exists():
        raise ConfigError([f"{source!r} is neither a shipped config nor a file; shipped configs: "
                           f"{', '.join(shipped)}"])
    return Path(source)


def load_config(source: str | os.PathLike | Mapping[str, Any] | Config,
                overrides: Sequence[str] | Mapping[str, Any] = ()) -> Config:
    """Load and validate a config from a YAML path, a shipped config's name (`cartpole`:
    see `shipped_configs`), a dict or a Config, applying overrides.

    ``overrides`` is a sequence of ``dotted.key=value`` strings (values parsed as YAML) or a mapping
    ``{"dotted.key": value}``. Raises ConfigError listing every problem.
    """
    name = None
    if isinstance(source, Config):
        data = config_to_dict(source)
    elif isinstance(source, Mapping):
        data = copy.deepcopy(dict(source))
    elif isinstance(source, (str, os.PathLike)):
        name = str(source)
        data = _read_yaml(config_path(source))
    else:
        raise ConfigError([f"config source: {type(source).__name__} given; "
                           f"expected a path, a dict or a Config"])
    problems: list[str] = []
    items = dict(overrides) if isinstance(overrides, Mapping) else _parse_overrides(
        [overrides] if isinstance(overrides, str) else overrides, problems)
    return _named_after_env(validate(_apply(data, items, problems), problems, name), items)


def _named_after_env(cfg: Config, overrides: Mapping[str, Any]) -> Config:
    """`cfg` named after its environment where the overrides change the environment and
    not the name: a run of a user's environment from a shipped config is not named after
    the config's (`a3c train cartpole env.id=Acrobot-v1` makes runs/Acrobot-v1-...)."""
    if "name" in overrides or not {"env", "env.id", "env.entry_point", "env.factory"} & set(overrides):
        return cfg
    # env.id names the entry point or factory where no id is given (config.rules).
    name = re.sub(r"[^\w.+-]+", "-", cfg.env.id.rpartition(":")[2].rpartition("/")[2]).strip(".-")
    return dataclasses.replace(cfg, name=name) if name else cfg


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict of the config (YAML-safe)."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """Write the config as YAML, atomically."""
    text = yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=None)
    write_atomically(path, lambda file: file.write(text.encode("utf-8")))
