"""The config described for people, from the schema: a resolved config as YAML with each
field's help (`a3c config NAME`), as the table TensorBoard shows, and the field reference
docs/configuration.md.

    python -m a3c.config.reference > docs/configuration.md   # after a field changes
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import yaml

from .load import config_to_dict, load_config, shipped_configs
from .schema import Config, leaves, type_name

__all__ = ["config_table", "describe", "reference"]


def _flow(value: Any) -> str:
    """A value as one line of YAML."""
    return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).removesuffix("\n...\n").strip()


def _fields(cfg: Config) -> Iterator[tuple[str, dataclasses.Field, Any, Any]]:
    """(dotted key, field, type, value in `cfg`) of every leaf, in declaration order."""
    values = config_to_dict(cfg)
    for key, field, tp in leaves():
        value: Any = values
        for part in key.split("."):
            value = value[part]
        yield key, field, tp, value


def config_table(cfg: Config) -> str:
    """Markdown table ``| key | value |``, one row per dotted leaf (for TensorBoard's text plugin)."""
    rows = [f"| {key} | {_flow(value).replace('|', chr(92) + '|')} |" for key, _, _, value in _fields(cfg)]
    return "\n".join(["| key | value |", "|---|---|", *rows])


def _rules(meta: dict[str, Any]) -> str:
    """A field's allowed values, as its metadata states them."""
    parts = []
    if "choices" in meta:
        parts.append("one of " + ", ".join(meta["choices"]))
    for key, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        if key in meta:
            parts.append(f"{op} {meta[key]}")
    if "length" in meta:
        parts.append(f"{meta['length']} items")
    return "; ".join(parts)


def describe(cfg: Config) -> str:
    """`cfg` as YAML a run reads back, one line a field, each after a comment with its help."""
    lines, section = [], None
    for key, field, _, value in _fields(cfg):
        *path, name = key.split(".")
        if path and path[0] != section:
            section = path[0]
            lines.append(f"{section}:")
        indent = "  " * len(path)
        lines.append(f"{indent}# {field.metadata['help']}")
        lines.append(f"{indent}{name}: {_flow(value)}")
    return "\n".join(lines) + "\n"


def reference() -> str:
    """docs/configuration.md: every field with its type, default, allowed values and help,
    and the shipped configs with what each changes."""
    out = ["# Configuration reference", "",
           "<!-- Generated from a3c/config/schema.py by `python -m a3c.config.reference > "
           "docs/configuration.md`; tests/test_config.py fails when this file is stale. -->", "",
           "A run is described by one config: a YAML file (or a shipped config's name), with dotted "
           "overrides on the command line (`a3c train cartpole optim.lr=3e-4`) or keyword overrides in "
           "Python (`A3C(\"cartpole\", optim__lr=3e-4)`). Every field has a default; a config holds only "
           "what it changes. `a3c config NAME` prints a config as a run would use it.", ""]
    section = None
    defaults = list(_fields(Config()))
    for key, field, tp, value in defaults:
        head = key.split(".")[0] if "." in key else "top level"
        if head != section:
            section = head
            out += ["", f"## {section}", "", "| field | type | default | allowed | meaning |", "|---|---|---|---|---|"]
        cells = [f"`{key}`", type_name(tp), f"`{_flow(value)}`", _rules(dict(field.metadata)),
                 field.metadata["help"]]
        out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    out += ["", "## Shipped configs", "", "| name | environment | solved at | changes from the defaults |",
            "|---|---|---|---|"]
    for name, path in shipped_configs().items():
        cfg = load_config(path)
        changed = ", ".join(f"`{key}`" for (key, _, _, value), (_, _, _, default) in zip(_fields(cfg), defaults)
                            if value != default and key not in ("env.id", "solved_return"))
        solved = "-" if cfg.solved_return is None else cfg.solved_return
        out.append(f"| `{name}` | {cfg.env.id} | {solved} | {changed} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(reference(), end="")
