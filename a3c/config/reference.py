"""The config described for people: a resolved config as YAML with each field's help
(`a3c config NAME`), and the field reference docs/configuration.md, both from the schema.

    python -m a3c.config.reference > docs/configuration.md   # after a field changes
"""
from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from .load import config_to_dict, shipped_configs
from .schema import Config, leaves, type_name

__all__ = ["describe", "reference"]


def _flow(value: Any) -> str:
    """A value as one line of YAML."""
    return yaml.safe_dump(value, default_flow_style=True, width=float("inf")).removesuffix("\n...\n").strip()


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
    values, lines, section = config_to_dict(cfg), [], None
    for key, field, _ in leaves():
        *path, name = key.split(".")
        value: Any = values
        for part in key.split("."):
            value = value[part]
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
    default = config_to_dict(Config())
    out = ["# Configuration reference", "",
           "<!-- Generated from a3c/config/schema.py by `python -m a3c.config.reference > "
           "docs/configuration.md`; tests/test_config.py fails when this file is stale. -->", "",
           "A run is described by one config: a YAML file (or a shipped config's name), with dotted "
           "overrides on the command line (`a3c train cartpole optim.lr=3e-4`) or keyword overrides in "
           "Python (`A3C(\"cartpole\", optim__lr=3e-4)`). Every field has a default; a config holds only "
           "what it changes. `a3c config NAME` prints a config as a run would use it.", ""]
    section = None
    for key, field, tp in leaves():
        head = key.split(".")[0] if "." in key else "top level"
        if head != section:
            section = head
            out += ["", f"## {section}", "", "| field | type | default | allowed | meaning |", "|---|---|---|---|---|"]
        value: Any = default
        for part in key.split("."):
            value = value[part]
        cells = [f"`{key}`", type_name(tp), f"`{_flow(value)}`", _rules(dict(field.metadata)),
                 field.metadata["help"]]
        out.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    out += ["", "## Shipped configs", "", "| name | environment | solved at | changes from the defaults |",
            "|---|---|---|---|"]
    for name, path in shipped_configs().items():
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        changed = ", ".join(f"`{key}`" for key in _keys(data) if key not in ("env.id", "solved_return"))
        env = (data.get("env") or {}).get("id", default["env"]["id"])
        solved = data.get("solved_return")
        out.append(f"| `{name}` | {env} | {'-' if solved is None else solved} | {changed} |")
    return "\n".join(out) + "\n"


def _keys(data: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys a config file sets (a section's fields, not the section)."""
    sections = {f.name for f in dataclasses.fields(Config)} - {key for key, _, _ in leaves() if "." not in key}
    keys = []
    for key, value in data.items():
        if not prefix and key in sections and isinstance(value, dict):
            keys += _keys(value, f"{key}.")
        else:
            keys.append(prefix + key)
    return keys


if __name__ == "__main__":
    print(reference(), end="")
