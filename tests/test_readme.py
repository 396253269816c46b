"""README.md's code blocks work as written: each ```python block runs in a fresh
interpreter from an empty folder, and each ```bash block names only commands that exist,
its `a3c` lines in the forms the command line takes."""
from __future__ import annotations

import dataclasses
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"^```(\w*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
TIMEOUT_S = 120

# The programs a README command may start, and the a3c subcommands.
COMMANDS = {"a3c", "python", "python3", "pip", "tensorboard", ".", "source", "bash", "export",
            "cd", "ray", "git", "docker", "make"}
SUBCOMMANDS = {"train", "eval", "config"}
EVAL_OPTIONS = {"--episodes": int, "--seed": int, "--stochastic": None, "--video": str}
OPERATORS = {"&&", "||", ";", "|", "&"}


def blocks(language: str) -> list[str]:
    return [m.group(2) for m in BLOCK.finditer(README.read_text()) if m.group(1) == language]


def commands(block: str) -> list[list[str]]:
    """Each simple command of a bash block, as its words: lines joined where they end in a
    backslash, comments dropped, split at &&, ||, ;, | and &."""
    found = []
    for line in block.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split, lexer.commenters = True, "#"
        words: list[str] = []
        for token in lexer:
            if token in OPERATORS:
                found.append(words)
                words = []
            else:
                words.append(token)
        found.append(words)
    return [words for words in found if words]


def shipped_configs() -> set[str]:
    return {path.stem for path in (ROOT / "configs").glob("*.yaml")}


def is_config(name: str) -> bool:
    return name in shipped_configs() or name.endswith((".yaml", ".yml"))


def is_override(word: str) -> bool:
    key, sep, _ = word.partition("=")
    return bool(sep) and re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", key) is not None


def check_a3c(args: list[str]) -> None:
    """args: the words after `a3c`, in one of the forms of `a3c train`, `a3c eval` or
    `a3c config`."""
    assert args and args[0] in SUBCOMMANDS, f"a3c {' '.join(args)}: the subcommand is one of {SUBCOMMANDS}"
    command, rest = args[0], args[1:]
    line = "a3c " + " ".join(args)
    if command == "eval":
        assert rest and not rest[0].startswith("-"), f"{line}: a run folder first"
        i = 1
        while i < len(rest):
            option = rest[i]
            assert option in EVAL_OPTIONS, f"{line}: {option} is not one of {sorted(EVAL_OPTIONS)}"
            kind = EVAL_OPTIONS[option]
            if kind is not None:
                assert i + 1 < len(rest), f"{line}: {option} takes a value"
                kind(rest[i + 1])  # an int where one is needed
                i += 1
            i += 1
        return
    if command == "train" and rest[:1] == ["--resume"]:
        assert len(rest) >= 2 and not rest[1].startswith("-"), f"{line}: --resume takes a run folder"
        overrides = rest[2:]
    else:
        assert rest and is_config(rest[0]), f"{line}: a shipped config's name or a YAML file first"
        overrides = rest[1:]
    for word in overrides:
        assert is_override(word), f"{line}: {word!r} is not a key=value override"


def overrides_in_readme() -> list[str]:
    found = []
    for block in blocks("bash"):
        for words in commands(block):
            if words[0] == "a3c" and len(words) > 1 and words[1] in ("train", "config"):
                found += [word for word in words[2:] if is_override(word)]
    return found


PYTHON = blocks("python")
BASH = blocks("bash")


def test_the_readme_has_blocks_of_both_kinds():
    assert PYTHON and BASH


@pytest.mark.parametrize("code", PYTHON, ids=[f"python-{i + 1}" for i in range(len(PYTHON))])
def test_python_block_runs(code, tmp_path):
    if "a3c" in code:  # the trainer's blocks need its extra
        pytest.importorskip("torch")
        pytest.importorskip("gymnasium")
    script = tmp_path / "block.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=TIMEOUT_S, check=False)
    assert done.returncode == 0, f"{code}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"


@pytest.mark.parametrize("block", BASH, ids=[f"bash-{i + 1}" for i in range(len(BASH))])
def test_bash_block_names_commands_that_exist(block):
    for words in commands(block):
        assert words[0] in COMMANDS, f"{' '.join(words)}: {words[0]!r} is not a known command"
        if words[0] == "a3c":
            check_a3c(words[1:])
        if words[0] in ("python", "python3") and len(words) > 1 and words[1].endswith(".py"):
            assert (ROOT / words[1]).is_file(), f"{' '.join(words)}: no file {words[1]}"


def test_bash_overrides_name_config_fields():
    from a3c.config import Config

    for word in overrides_in_readme():
        node = Config
        for part in word.partition("=")[0].split("."):
            assert dataclasses.is_dataclass(node), f"{word}: {node} has no field {part!r}"
            fields = {field.name: field for field in dataclasses.fields(node)}
            assert part in fields, f"{word}: no field {part!r}; fields: {sorted(fields)}"
            node = fields[part].type
            if isinstance(node, str):  # postponed annotations: the dataclass by its name
                node = getattr(sys.modules[Config.__module__], node, node)


def test_the_checks_catch_what_they_are_for():
    assert commands('a && b "c d" # e\nf \\\n  g | h') == [["a"], ["b", "c d"], ["f", "g"], ["h"]]
    check_a3c(["train", "cartpole", "optim.lr=3e-4"])
    check_a3c(["train", "--resume", "runs/x", "total_timesteps=10"])
    check_a3c(["eval", "runs/x", "--episodes", "3", "--stochastic", "--video", "x.mp4"])
    check_a3c(["config", "my.yaml", "seed=2"])
    for bad in (["fit", "cartpole"], ["train", "no_such_config"], ["train", "cartpole", "lr"],
                ["eval", "runs/x", "--episodes", "many"], ["eval", "runs/x", "--render"],
                ["train", "--resume"]):
        with pytest.raises((AssertionError, ValueError)):
            check_a3c(bad)
