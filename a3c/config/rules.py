"""Validation: a config dict checked against the schema (types, choices, ranges, unknown
keys, each with a suggestion) and the cross-field rules, as pure functions of the values.
Every problem is collected, and one ConfigError lists them all. Nothing here looks
outside the config: `a3c.envs.preflight` checks what it names (environments, devices)."""
from __future__ import annotations

import copy
import dataclasses
import difflib
import operator
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from .schema import Config, ConfigError, EnvConfig, LearnersConfig, RayConfig, type_name

__all__ = ["ALE_KWARGS", "ale_obstacle", "validate"]


def _conform(v: Any, tp: Any) -> tuple[bool, Any]:
    """(ok, value converted to tp); ints are accepted for floats, bools are not ints."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            ok, c = _conform(v, arg)
            if ok:
                return True, c
        return False, None
    if tp is type(None):
        return v is None, None
    if origin is list:
        if not isinstance(v, (list, tuple)):
            return False, None
        items = [_conform(x, typing.get_args(tp)[0]) for x in v]
        return all(ok for ok, _ in items), [c for _, c in items]
    if tp is dict or origin is dict:
        ok = isinstance(v, Mapping) and all(isinstance(k, str) for k in v)
        return ok, copy.deepcopy(dict(v)) if ok else None
    if tp is float:
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        return ok, float(v) if ok else None
    if tp is int:
        return isinstance(v, int) and not isinstance(v, bool), v
    return isinstance(v, tp), v


def _range_problem(key: str, v: Any, meta: Mapping[str, Any], nullable: bool) -> str | None:
    if "choices" in meta and v not in meta["choices"]:
        return f"{key}: {v!r} is not allowed; use one of: {', '.join(meta['choices'])}"
    lo = [(">=", meta["ge"])] if "ge" in meta else [(">", meta["gt"])] if "gt" in meta else []
    hi = [("<=", meta["le"])] if "le" in meta else [("<", meta["lt"])] if "lt" in meta else []
    if not (lo or hi) or v is None:
        return None
    name = re.sub(r"\[\d+\]$", "", key.rsplit(".", 1)[-1])
    ops = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
    if all(ops[op](v, b) for op, b in lo + hi):
        return None
    if lo and hi:
        flip = {">=": "<=", ">": "<"}
        allowed = f"{lo[0][1]} {flip[lo[0][0]]} {name} {hi[0][0]} {hi[0][1]}"
    else:
        allowed = " and ".join(f"{name} {op} {b}" for op, b in lo + hi)
    return f"{key}: {v!r} is out of range; allowed: {allowed}{' or null' if nullable else ''}"


# --------------------------------------------------------------------------------------- building
def _build(cls: type, data: Mapping[str, Any], prefix: str, problems: list[str], bad: set[str]) -> Any:
    hints, names = typing.get_type_hints(cls), [f.name for f in dataclasses.fields(cls)]
    for k in data:
        if k not in names:
            key = f"{prefix}{k}"
            close = difflib.get_close_matches(str(k), names, n=1)
            hint = f"did you mean '{prefix}{close[0]}'?" if close else f"allowed keys: {', '.join(names)}"
            problems.append(f"{key}: unknown key; {hint}")
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        key, v, tp = prefix + f.name, data[f.name], hints[f.name]
        if dataclasses.is_dataclass(tp):
            if v is None:  # an empty section in YAML
                continue
            if isinstance(v, Mapping):
                values[f.name] = _build(tp, v, key + ".", problems, bad)
            else:
                bad.add(key)
                problems.append(f"{key}: {v!r} has type {type(v).__name__}; expected a section (mapping) "
                                f"with keys: {', '.join(x.name for x in dataclasses.fields(tp))}")
            continue
        ok, c = _conform(v, tp)
        if not ok:
            bad.add(key)
            problems.append(f"{key}: {v!r} has type {type(v).__name__}; expected {type_name(tp)}")
            continue
        meta, nullable = f.metadata, _conform(None, tp)[0]
        errs = [_range_problem(f"{key}[{i}]", x, meta, nullable) for i, x in enumerate(v)] \
            if isinstance(c, list) else [_range_problem(key, v, meta, nullable)]
        if "length" in meta and len(c) != meta["length"]:
            errs.append(f"{key}: {v!r} has {len(c)} items; allowed: exactly {meta['length']}")
        errs = [e for e in errs if e]
        if errs:
            bad.add(key)
            problems += errs
        else:
            values[f.name] = c
    return cls(**values)


def _check_ray(ray: RayConfig, problems: list[str], bad: set[str]) -> None:
    """The form of the ray section; whether the address answers is checked when a run starts."""
    address = ray.address
    if address is not None and address != "auto" and "ray.address" not in bad:
        host, colon, port = address.rpartition(":")
        if not (colon and host and port.isdigit() and 0 < int(port) < 65536) or "://" in host:
            problems.append(f"ray.address: {address!r} is not allowed; use null (a Ray instance for "
                            f"this run), auto, or host:port such as 10.0.0.1:6379")
    if "ray.resources" not in bad:
        for name, amount in (ray.resources or {}).items():
            if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
                problems.append(f"ray.resources.{name}: {amount!r} is not allowed; use a number >= 0")
    if not ({"ray.weights_interval_updates", "ray.weights_interval_s"} & bad) \
            and ray.weights_interval_updates == 0 and ray.weights_interval_s == 0:
        problems.append("ray.weights_interval_updates: 0 with ray.weights_interval_s 0 would never "
                        "publish new weights; set either above 0")


def _check_minibatches(learners: LearnersConfig, unroll_length: int, problems: list[str],
                       bad: set[str]) -> None:
    """No more minibatches than the batch has fragments (or steps, split by steps), and,
    where advantages are normalized, at least 2 steps in each (the std of one is not a
    number, and every loss would be skipped)."""
    if {"learners.minibatches", "learners.batch_size", "learners.minibatch_split",
            "actors.unroll_length", "learners.normalize_advantages"} & bad:
        return
    by_steps = learners.minibatch_split == "steps"
    units = learners.batch_size * unroll_length if by_steps else learners.batch_size
    single_steps = by_steps or unroll_length == 1  # each unit a minibatch is made of is one step
    limit = units // 2 if learners.normalize_advantages and single_steps else units
    if learners.minibatches <= limit:
        return
    what = (f"the batch's {units} steps (learners.batch_size times actors.unroll_length)" if by_steps
            else f"learners.batch_size ({units})")
    if limit < units:
        what = (f"half {what}: each minibatch needs 2 steps for its advantages to be normalized "
                f"(learners.normalize_advantages)")
    problems.append(f"learners.minibatches: {learners.minibatches} is larger than {what}; "
                    f"allowed: minibatches <= {limit}")


def _check_sync(cfg: Config, problems: list[str], bad: set[str]) -> None:
    """Synchronous actors act one batch per update between them (a3c.actors.local.SyncGate):
    local actors only, a batch a whole number of rounds of every actor's environments, and
    one learner that trains on nothing else (no replay)."""
    a = cfg.actors
    if not a.sync or {"actors.sync", "actors.num", "actors.envs_per_actor", "actors.mode",
                      "learners.batch_size", "learners.num", "replay.ratio"} & bad:
        return
    if cfg.learners.num > 1:
        problems.append(f"actors.sync: true acts one batch at a time, for one learner; with learners.num "
                        f"{cfg.learners.num} each would take part of it and wait for the rest forever; "
                        f"set learners.num to 1, or actors.sync to false")
    if cfg.replay.ratio:
        problems.append(f"actors.sync: true trains each batch from the policy that acted it, and "
                        f"replay.ratio {cfg.replay.ratio} trains replayed batches while the actors act; "
                        f"set replay.ratio to 0, or actors.sync to false")
    if a.mode == "ray":
        problems.append("actors.sync: true is for local actors, and actors.mode is ray; use actors.mode "
                        "process or thread, or set actors.sync to false")
    per_round = a.num * a.envs_per_actor
    if cfg.learners.batch_size % per_round:
        problems.append(f"actors.sync: true needs learners.batch_size ({cfg.learners.batch_size}) to be a "
                        f"multiple of actors.num x envs_per_actor ({a.num} x {a.envs_per_actor} = "
                        f"{per_round}); change one of them, or set actors.sync to false")


def _check_multiagent(cfg: Config, problems: list[str], bad: set[str]) -> None:
    """A PettingZoo environment (env.multiagent) comes from an entry point or a factory,
    and its actors fill fragments agent by agent (a3c.actors.agents): local actors that
    do not wait for rounds. The selfplay section is for such runs."""
    env, selfplay = cfg.env, cfg.selfplay
    if "selfplay.eval_opponent" not in bad and selfplay.eval_opponent != "random" \
            and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*", selfplay.eval_opponent):
        problems.append(f"selfplay.eval_opponent: {selfplay.eval_opponent!r} is not allowed; use random, or "
                        f"module:function (a function of (obs, mask) returning an action)")
    if "env.multiagent" in bad:
        return
    if not env.multiagent:
        for key in ("pool_size", "eval_games"):
            if getattr(selfplay, key) and f"selfplay.{key}" not in bad:
                problems.append(f"selfplay.{key}: {getattr(selfplay, key)} is for games of several agents, and "
                                f"env.multiagent is false; set env.multiagent: true (a PettingZoo environment), "
                                f"or selfplay.{key} to 0")
        return
    if env.entry_point is None and env.factory is None:
        problems.append("env.multiagent: true needs env.entry_point (module:callable returning a PettingZoo "
                        "AECEnv or ParallelEnv, e.g. pettingzoo.classic.tictactoe_v3:env) or A3C(config, env=factory)")
    unsupported = [
        ("env.atari", env.atari, "env.atari: true preprocesses a single-agent Atari environment, and "
                                 "env.multiagent is true; set env.atari to false"),
        ("env.max_episode_steps", env.max_episode_steps is not None,
         f"env.max_episode_steps: {env.max_episode_steps} is a gymnasium time limit, and env.multiagent is "
         f"true; set the game's own in env.kwargs (max_cycles for PettingZoo's MPE and Butterfly games), and "
         f"this to null"),
        ("actors.mode", cfg.actors.mode == "ray", "actors.mode: ray runs single-agent actors, and "
                                                  "env.multiagent is true; use process or thread"),
        ("actors.sync", cfg.actors.sync, "actors.sync: true acts rounds of one fragment per environment, and "
                                         "a multi-agent actor's fragments come as its agents fill them; set "
                                         "actors.sync to false"),
        ("eval.interval_steps", cfg.eval.interval_steps > 0,
         f"eval.interval_steps: {cfg.eval.interval_steps} evaluates episodes of a single-agent environment, "
         f"and env.multiagent is true; set it to 0, and selfplay.eval_games to play games against a fixed "
         f"opponent")]
    problems += [message for key, used, message in unsupported if used and key not in bad]


# The keyword arguments of an ALE id that its vector env takes as gymnasium.make does
# (frameskip: 1, which a3c.envs.preflight asks for with env.atari; the vector env skips).
ALE_KWARGS = ("frameskip", "full_action_space", "max_num_frames_per_episode", "repeat_action_probability")
_GYMNASIUM = "set env.atari_backend: gymnasium (or auto)"


def ale_obstacle(env: EnvConfig) -> str | None:
    """What keeps ale_py's AtariVectorEnv (env.atari_backend ale) from making this config's
    environments, as the rest of a one-line problem after "env.atari_backend: ale ", with
    the fix; None where nothing does. With env.atari_backend auto, any obstacle means the
    gymnasium backend (a3c.envs.vector.atari_backend); whether ale-py is installed is for
    a3c.envs.preflight to say."""
    if not env.atari:
        return "preprocesses Atari frames, and env.atari is false; set env.atari: true, or env.atari_backend: auto"
    if env.multiagent:
        return f"steps single-agent Atari games, and env.multiagent is true; {_GYMNASIUM}"
    made = "makes its environments from an ALE/ env.id (such as ALE/Pong-v5)"
    if env.factory is not None:
        return f"{made}, and this run's come from the factory {env.factory}; {_GYMNASIUM}"
    if env.entry_point is not None:
        return f"{made}, and env.entry_point is set; {_GYMNASIUM}, or name an ALE/ id in env.id"
    if not env.id.rpartition(":")[2].startswith("ALE/"):
        return f"{made}, and env.id is {env.id!r}; {_GYMNASIUM}"
    if env.wrappers:
        return f"preprocesses in C++ and applies no env.wrappers, which are set; remove them, or {_GYMNASIUM}"
    if env.action_mask not in ("auto", "none"):
        return (f"gives no action masks, and env.action_mask is {env.action_mask}; set it to auto or none, "
                f"or {_GYMNASIUM}")
    if env.max_episode_steps is not None:
        return (f"takes no env.max_episode_steps ({env.max_episode_steps}), a limit gymnasium counts in "
                f"frames, reset's no-ops included; set it to null and limit episodes with "
                f"env.kwargs.max_num_frames_per_episode (4 frames a step), or {_GYMNASIUM}")
    other = sorted(key for key in env.kwargs if key not in ALE_KWARGS)
    if other:
        return f"takes no env.kwargs.{other[0]} (only {', '.join(ALE_KWARGS)}); remove it, or {_GYMNASIUM}"
    return None


def _check_atari_backend(cfg: Config, problems: list[str], bad: set[str]) -> None:
    """An explicit env.atari_backend: ale that the ALE's vector env cannot honour."""
    if cfg.env.atari_backend != "ale" or "env.atari_backend" in bad:
        return
    obstacle = ale_obstacle(cfg.env)
    if obstacle is not None:
        problems.append(f"env.atari_backend: ale {obstacle}")


def _check_eval(cfg: Config, problems: list[str], bad: set[str]) -> None:
    """eval.judges_target stops a run on evaluations, so there must be evaluations and a target."""
    if not cfg.eval.judges_target or {"eval.judges_target", "eval.interval_steps", "target_return"} & bad:
        return
    if not cfg.eval.interval_steps:
        problems.append("eval.judges_target: true judges target_return by the evaluations, and "
                        "eval.interval_steps is 0 (none); set it, e.g. to 10000, or judges_target to false")
    if cfg.target_return is None:
        problems.append("eval.judges_target: true judges target_return by the evaluations, and "
                        "target_return is null; set target_return, or judges_target to false")


# What `deterministic` needs (docs/training.md, Reproducibility): one actor, acting each batch
# with the policy its update starts from (its fragments reach the queue in one order, and
# the learner reads the budget's count at fixed points); one learner thread, whose
# minibatches the trainer's seeded generator draws; the CPU; and an end that depends on
# the count alone. The rest of what actors.sync needs, _check_sync asks for.
_DETERMINISTIC = {"actors.num": 1, "actors.sync": True, "actors.device": "cpu", "learners.mode": "thread",
                  "learners.device": "cpu", "target_return": None}


def _check_deterministic(cfg: Config, problems: list[str], bad: set[str]) -> None:
    if not cfg.deterministic or "deterministic" in bad:
        return
    needed = dict(_DETERMINISTIC)
    if not cfg.actors.sync:  # with it, _check_sync asks for these
        needed.update({"learners.num": 1, "replay.ratio": 0.0})
    differ = [f"{key} {_shown(want)} (not {_shown(_value(cfg, key))})" for key, want in needed.items()
              if key not in bad and _value(cfg, key) != want]
    if differ:
        problems.append(f"deterministic: true needs {', '.join(differ)}; set {'it' if len(differ) == 1 else 'them'}, "
                        f"or deterministic to false")


def _value(cfg: Config, key: str) -> Any:
    """The value of a dotted key."""
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


def _shown(value: Any) -> str:
    """A value as YAML writes it: true, null, 0.0."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def validate(data: Mapping[str, Any], problems: list[str], source: str | None = None) -> Config:
    """The Config of the dict `data`, or one ConfigError listing all its problems along
    with `problems` (those found before, such as malformed overrides)."""
    bad: set[str] = set()
    cfg = _build(Config, _name_unnamed_env(data), "", problems, bad)
    if "name" not in bad and (not cfg.name or cfg.name.startswith(".") or re.search(r"[/\\]", cfg.name)):
        problems.append(f"name: {cfg.name!r} is not allowed; use a folder name without '/' or '\\' "
                        f"that does not start with '.'")
    _check_minibatches(cfg.learners, cfg.actors.unroll_length, problems, bad)
    if not ({"actors.queue_capacity", "learners.batch_size"} & bad) \
            and cfg.actors.queue_capacity < cfg.learners.batch_size:
        problems.append(f"actors.queue_capacity: {cfg.actors.queue_capacity} is smaller than "
                        f"learners.batch_size ({cfg.learners.batch_size}); "
                        f"allowed: queue_capacity >= batch_size")
    if not ({"learners.bound_coef", "model.lstm"} & bad) and cfg.learners.bound_coef and cfg.model.lstm:
        problems.append(f"learners.bound_coef: {cfg.learners.bound_coef} needs a feedforward model, and "
                        f"model.lstm is {cfg.model.lstm}; set one of them to 0")
    if not ({"learners.minibatch_split", "model.lstm"} & bad) \
            and cfg.learners.minibatch_split == "steps" and cfg.model.lstm:
        problems.append(f"learners.minibatch_split: steps needs a feedforward model, and model.lstm is "
                        f"{cfg.model.lstm}; split by fragments, or set model.lstm to 0")
    if not ({"learners.proximal_decay", "learners.clip_coef"} & bad) \
            and cfg.learners.proximal_decay is not None and cfg.learners.clip_coef is None:
        problems.append(f"learners.proximal_decay: {cfg.learners.proximal_decay} centres PPO's clip, and "
                        f"learners.clip_coef is null; set clip_coef (e.g. 0.2), or proximal_decay to null")
    _check_sync(cfg, problems, bad)
    _check_eval(cfg, problems, bad)
    _check_deterministic(cfg, problems, bad)
    _check_multiagent(cfg, problems, bad)
    _check_atari_backend(cfg, problems, bad)
    if "learners.device" not in bad:
        _check_device(cfg.learners, problems)
    if "actors.device" not in bad:
        _check_actors_device(cfg, problems)
    _check_ray(cfg.ray, problems, bad)
    if problems:
        raise ConfigError(problems, source)
    return cfg


def _name_unnamed_env(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """`data` with env.id set to the entry point's (or factory's) name where no id is
    given: the run's name for an environment that no id names."""
    env = data.get("env")
    if not isinstance(env, Mapping) or "id" in env:
        return data
    named_by = env.get("factory") or env.get("entry_point")
    if not isinstance(named_by, str):
        return data
    return {**data, "env": {**env, "id": named_by.rpartition(":")[2]}}


def _device_form(key: str, device: str) -> str | None:
    """Why `device` is no device name a run takes, or None."""
    if not re.fullmatch(r"cpu|cuda(?::\d+)?", device):
        return f"{key}: {device!r} is not allowed; use one of: cpu, cuda, cuda:N"
    return None


def _check_actors_device(cfg: Config, problems: list[str]) -> None:
    """actors.device's form, and the actors that take it (local ones of one agent)."""
    device = cfg.actors.device
    problem = _device_form("actors.device", device)
    if problem is None and device != "cpu" and cfg.actors.mode == "ray":
        problem = (f"actors.device: {device!r} is for local actors; Ray actors act on their nodes' CPUs, "
                   f"set actors.device: cpu")
    if problem is None and device != "cpu" and cfg.env.multiagent:
        problem = f"actors.device: {device!r} is not supported with env.multiagent; set actors.device: cpu"
    if problem is not None:
        problems.append(problem)


def _check_device(learners: LearnersConfig, problems: list[str]) -> None:
    """The device's form; whether this host has it is for a3c.envs.preflight to say."""
    device = learners.device
    problem = _device_form("learners.device", device)
    if problem is not None:
        problems.append(problem)
    elif device != "cpu" and learners.mode == "process":
        problems.append(f"learners.mode: process with learners.device {device!r} is not "
                        "supported: the GPU model lives in the trainer's process; use learners.mode: "
                        "thread (learners.num threads share it)")
