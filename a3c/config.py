"""Run configuration: typed dataclass sections, YAML loading, dotted overrides and validation.

Every leaf field carries its one-line help text in ``metadata["help"]`` (the single source for
``field_help`` and CLI help) and its allowed values/ranges in the same metadata. Validation collects
every problem and raises one ``ConfigError`` listing them all.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import operator
import os
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .files import write_atomically

__all__ = [
    "Config", "EnvConfig", "ModelConfig", "ActorsConfig", "LearnersConfig", "OptimConfig",
    "VTraceConfig", "ReplayConfig", "LoggingConfig", "CheckpointConfig", "RayConfig", "ConfigError",
    "load_config", "apply_overrides", "config_to_dict", "save_config", "config_table", "field_help",
]


def _f(default: Any, help: str, **rules: Any) -> Any:
    """A leaf field with help text and validation rules (choices, ge, gt, le, lt, length)."""
    meta = {"help": help, **rules}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class EnvConfig:
    id: str = _f("CartPole-v1", "gymnasium id, or module:EnvId to import the module that registers it "
                 "first; ALE ids (e.g. ALE/Pong-v5) need ale-py. With entry_point or A3C's env= "
                 "factory, only the environment's name (left out: the entry point's or factory's)")
    imports: list[str] = _f([], "modules imported before the environment is made, e.g. [minatar] "
                            "(packages that register their ids on import, or by a gymnasium.envs hook)")
    entry_point: str | None = _f(None, "module:callable (a class or a function) called with kwargs to "
                                 "make an environment that no id names; takes the place of env.id")
    kwargs: dict[str, Any] = _f({}, "keyword arguments passed to gymnasium.make or the entry point")
    atari: bool = _f(False, "Atari preprocessing (84x84 gray, frame skip 4, noop 30) + frame stack")
    frame_stack: int = _f(4, "frames stacked when atari is true", ge=1)
    max_episode_steps: int | None = _f(None, "episode step limit (null: the environment's own)", ge=1)
    wrappers: list[str | dict[str, Any]] = _f(
        [], "wrappers applied in order after the Atari preprocessing: module:Wrapper, or "
            "{module:Wrapper: {kwargs}} (RL Zoo's env_wrapper form)")
    factory: str | None = _f(None, "set by A3C(config, env=factory), not by hand: the factory's "
                             "module:name; such a run needs it again: A3C.load(path, env=factory)")


@dataclass
class ModelConfig:
    hidden_sizes: list[int] = _f([64, 64], "sizes of the hidden layers of the MLP torso", ge=1)
    activation: str = _f("tanh", "activation of the hidden layers", choices=("tanh", "relu"))
    cnn: bool | None = _f(None, "CNN torso (null: auto, CNN for image observations)")
    cnn_arch: str = _f("auto", "CNN for images: nature (Nature DQN), small (MinAtar's one 3x3 "
                       "conv, for small grids), auto (nature from 36x36 up, else small)",
                       choices=("auto", "nature", "small"))
    lstm: int = _f(0, "hidden size of an LSTM core between the torso and the heads, for tasks "
                   "that need memory (0: none)", ge=0)
    normalize_obs: bool = _f(True, "normalize vector observations by running mean and variance")
    normalize_value: bool = _f(True, "PopArt: learn values in units of the running std of their targets")
    state_dependent_std: bool = _f(False, "Gaussian policies: the head outputs a log-std per state "
                                   "(false: one learned log-std per action dimension)")
    shared_torso: bool = _f(True, "the policy and value heads read one torso (false: the value head "
                            "gets a torso of its own, of the same shape)")
    log_std_init: float = _f(0.0, "Gaussian policies: the initial log-std of the actions (0: std 1)")
    layer_norm: bool = _f(False, "layer normalization before each activation of the MLP torsos")


@dataclass
class ActorsConfig:
    mode: str = _f("process", "how actors run: processes or threads on this machine, or ray: remote "
                   "actors on a Ray cluster (the ray section)", choices=("process", "thread", "ray"))
    num: int = _f(2, "number of actors", ge=1)
    envs_per_actor: int = _f(8, "environments stepped by each actor", ge=1)
    unroll_length: int = _f(16, "steps per fragment (T)", ge=1)
    queue_capacity: int = _f(64, "fragments the queue holds (>= learners.batch_size); small keeps data fresh",
                            ge=1)
    max_restarts: int = _f(10, "times each actor may die and be restarted before the run fails", ge=0)
    sync: bool = _f(False, "actors wait for each fresh batch's update before acting again, so every "
                    "batch is acted by the policy version its update starts from, as PPO's rollouts (the actors "
                    "idle while the learner trains); needs local actors, learners.batch_size a multiple "
                    "of actors.num x envs_per_actor, one learner and no replay")


@dataclass
class LearnersConfig:
    mode: str = _f("thread", "how learners run: threads of the trainer, or processes (one GIL each; "
                   "the model and optimizer statistics in shared memory)", choices=("thread", "process"))
    num: int = _f(1, "learners (Hogwild threads or processes, learners.mode)", ge=1)
    batch_size: int = _f(32, "fragments per update (B)", ge=1)
    gamma: float = _f(0.99, "discount factor", ge=0, le=1)
    ent_coef: float = _f(0.0, "entropy bonus coefficient", ge=0)
    bound_coef: float = _f(
        0.0, "Gaussian policies on bounded actions: penalty on the squared distance of the mean "
             "beyond the bounds, in half-widths of the range (0: none; needs a feedforward model)", ge=0)
    vf_coef: float = _f(0.5, "value loss coefficient", ge=0)
    max_grad_norm: float = _f(0.5, "gradient norm clipping threshold", gt=0)
    epochs: int = _f(4, "passes over each fresh batch (more reuse per fragment)", ge=1)
    minibatches: int = _f(8, "gradient steps per pass: the batch split in this many parts "
                             "(learners.minibatch_split)", ge=1)
    minibatch_split: str = _f(
        "fragments", "what a minibatch is made of: whole fragments, or single steps drawn from all "
                     "the batch's fragments with V-trace's targets computed over the whole batch at "
                     "the start of each pass (or once, fixed_targets), as PPO's minibatches (steps: a "
                     "feedforward model only)",
        choices=("fragments", "steps"))
    fixed_targets: bool = _f(
        False, "compute V-trace's targets and advantages once per batch, with the model as it is "
               "before the first pass, and keep them for every pass, as PPO keeps its advantages for "
               "all its epochs (false: with the model as it is at each minibatch, or with "
               "minibatch_split steps at each pass)")
    clip_coef: float | None = _f(
        0.2, "PPO clip of the ratio pi/mu in the policy loss (null: IMPALA's policy gradient)", gt=0)
    target_kl: float | None = _f(
        None, "end a batch's passes before the step of the first minibatch (after the first) "
              "whose approx KL from the policy the batch's update began with exceeds 1.5 x "
              "target_kl, as Stable-Baselines3's PPO ends its epochs; not the KL of "
              "losses/approx_kl, which is from the acting policy (null: every pass runs; on an "
              "accelerator each check waits for the device)", gt=0)
    proximal_decay: float | None = _f(
        None, "centre the clip on an exponential moving average of the model's weights, one for all "
              "learners (saved in checkpoints), which after each gradient step keeps this share of "
              "itself and takes the rest from the policy (0.99: about the last 100 steps; PPO-EWMA, "
              "Hilton et al. 2022); each step's term is weighted by average/acting policy, capped at "
              "vtrace.clip_pg_rho_threshold (null: the clip is centred on the acting policy)",
        gt=0, lt=1)
    normalize_advantages: bool = _f(True, "scale advantages to zero mean, unit std per batch")
    advantage_std_floor: float = _f(
        0.1, "with PopArt: normalize_advantages divides by the minibatch's std, but by no less "
             "than this many value scales, so that the small advantages of a solved task are not "
             "scaled up (0: always to unit std)", ge=0)
    value_scale_floor: float = _f(
        0.01, "with PopArt: the value scale (the std of the value targets, the unit of value "
              "errors and advantages) is at least this fraction of the targets' mean magnitude", ge=0)
    device: str = _f("cpu", "learner device: cpu | cuda | cuda:N (cuda: learner threads train a copy of "
                     "the model on the GPU)")
    publish_every: int = _f(4, "with learners.device cuda: gradient steps between copies of the GPU "
                               "model to the actors (on the CPU they share one model)", ge=1)


@dataclass
class OptimConfig:
    name: str = _f("adam", "optimizer", choices=("rmsprop", "adam"))
    lr: float = _f(1e-3, "learning rate", gt=0)
    value_lr: float | None = _f(None, "learning rate of the value's own torso and head, the modules "
                                "named value_* (null: lr); the schedule scales it as it does lr", gt=0)
    lr_schedule: str = _f("linear", "learning rate schedule (linear: to 0 at total_timesteps)",
                          choices=("constant", "linear"))
    eps: float = _f(1e-5, "optimizer epsilon", gt=0)
    alpha: float = _f(0.99, "RMSprop smoothing constant", ge=0, lt=1)
    betas: list[float] = _f([0.9, 0.99], "Adam betas (beta2 0.99: the second moment keeps up with a "
                            "solved policy's fading gradients)", ge=0, lt=1, length=2)


@dataclass
class VTraceConfig:
    clip_rho_threshold: float | None = _f(1.0, "V-trace rho clip (null: no clipping)", gt=0)
    clip_pg_rho_threshold: float | None = _f(1.0, "V-trace policy-gradient rho clip (null: no clipping)",
                                             gt=0)
    td_lambda: float = _f(1.0, "trace lambda: 1 is IMPALA's V-trace, lower trades variance for bias",
                          ge=0, le=1)


@dataclass
class ReplayConfig:
    ratio: float = _f(0.0, "replayed fragments per fresh fragment, at most (0: no replay)", ge=0)
    window: int = _f(256, "fragments replay draws from: the most recent ones", ge=1)


@dataclass
class LoggingConfig:
    run_root: str = _f("runs", "folder that holds the run folders")
    interval_s: float = _f(5.0, "monitor write interval in seconds", gt=0)
    progress: bool = _f(True, "progress bar on the terminal")


@dataclass
class CheckpointConfig:
    interval_s: float = _f(60.0, "checkpoint interval in seconds (0: only a final checkpoint)", ge=0)


@dataclass
class RayConfig:
    address: str | None = _f(None, "the Ray cluster of actors.mode=ray: null starts one on this machine "
                             "for the run (stopped at its end); auto joins the one `ray start` runs "
                             "here; host:port joins the cluster whose head listens there")
    num_cpus: float = _f(1.0, "CPUs each remote actor reserves (it steps its environments in one "
                         "process)", ge=0)
    resources: dict[str, float] | None = _f(None, "custom resources each remote actor asks for, e.g. "
                                            "{actor_node: 1} to place actors only on nodes started with "
                                            "--resources (null: none)")
    calls_in_flight: int = _f(2, "sample calls in flight per actor: 2 keeps it busy while a result "
                              "travels; more only holds more fragments in the object store", ge=1)
    fragments_per_call: int = _f(4, "fragments each of an actor's environments adds per call; more "
                                 "spreads the cost of a call (about 1 ms) over more steps", ge=1)
    weights_interval_updates: int = _f(8, "publish the weights once the policy is this many updates "
                                       "ahead of the published ones (0: by time only)", ge=0)
    weights_interval_s: float = _f(1.0, "publish the weights this many seconds after the last "
                                   "publication, if the policy changed (0: by updates only)", ge=0)
    call_timeout_s: float = _f(60.0, "a call not back after this long counts its actor as lost: "
                               "killed, restarted, its fragments counted lost", gt=0)
    spread: bool = _f(True, "place actors on as many nodes as possible (Ray's SPREAD; false: "
                      "Ray's default, which fills a node first)")
    runtime_env: dict[str, Any] | None = _f(None, "Ray runtime environment of the run, e.g. {env_vars: "
                                            "{...}} or {py_modules: [my_envs]} to ship a module to every "
                                            "node (null: none)")


@dataclass
class Config:
    name: str = _f("run", "run name; the run folder is <run_root>/<name>-<YYYYmmdd-HHMMSS>")
    seed: int = _f(1, "random seed", ge=0)
    total_timesteps: int = _f(500_000, "env steps to train for (summed over all envs)", ge=1)
    target_return: float | None = _f(
        None, "stop early once the mean return of the last 100 episodes reaches this (null: never)")
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    actors: ActorsConfig = field(default_factory=ActorsConfig)
    learners: LearnersConfig = field(default_factory=LearnersConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    vtrace: VTraceConfig = field(default_factory=VTraceConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    ray: RayConfig = field(default_factory=RayConfig)


class ConfigError(ValueError):
    """Invalid configuration; ``problems`` lists every problem found, one message each."""

    def __init__(self, problems: Sequence[str], source: str | None = None):
        self.problems = list(problems)
        head = f"{source}: " if source else ""
        n = len(self.problems)
        super().__init__(f"{head}invalid config ({n} problem{'s' * (n != 1)}):\n"
                         + "\n".join(f"  {p}" for p in self.problems))


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


# ----------------------------------------------------------------------------------- introspection
def _leaves(cls: type = Config, prefix: str = "") -> list[tuple[str, dataclasses.Field, Any]]:
    """(dotted key, field, type) for every leaf field, in declaration order."""
    out, hints = [], typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += _leaves(tp, f"{prefix}{f.name}.")
        else:
            out.append((prefix + f.name, f, tp))
    return out


def field_help() -> dict[str, str]:
    """Dotted key -> one-line help text, for every leaf field."""
    return {key: f.metadata["help"] for key, f, _ in _leaves()}


def _tname(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(_tname(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if typing.get_origin(tp) is list:
        return f"list of {_tname(typing.get_args(tp)[0])}"
    if tp is dict or typing.get_origin(tp) is dict:
        return "mapping"
    return tp.__name__


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
            problems.append(f"{key}: {v!r} has type {type(v).__name__}; expected {_tname(tp)}")
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


def _check_env(env: EnvConfig, problems: list[str], bad: set[str]) -> None:
    """Where the environment comes from: the modules to import, the entry point, the
    wrappers and the id, each imported and looked up now, so that a typo is reported with
    the rest and not by every actor."""
    from .envs import MODULE, EnvError, import_env_module, load_object, wrapper_spec

    def resolves(key: str, resolve: Any, arg: Any) -> bool:
        try:
            resolve(arg)
            return True
        except EnvError as error:
            problems.append(f"{key}: {error}")
            return False

    # Imports first: they may register env.id.
    for i, name in enumerate(env.imports if "env.imports" not in bad else []):
        if not MODULE.fullmatch(name):
            problems.append(f"env.imports[{i}]: {name!r} is not a module name; use a dotted name "
                            f"such as minatar or my_pkg.envs")
        else:
            resolves(f"env.imports[{i}]", import_env_module, name)
    if env.entry_point is not None and "env.entry_point" not in bad:
        resolves("env.entry_point", load_object, env.entry_point)
    for i, item in enumerate(env.wrappers if "env.wrappers" not in bad else []):
        try:
            path, _ = wrapper_spec(item)
        except EnvError as error:
            problems.append(f"env.wrappers[{i}]: {error}")
            continue
        resolves(f"env.wrappers[{i}]", load_object, path)
    if env.entry_point is None and env.factory is None and not ({"env.id", "env.kwargs"} & bad):
        _check_env_id(env, problems, resolves)


def _check_env_id(env: EnvConfig, problems: list[str], resolves: Any) -> None:
    import gymnasium

    from .envs import MODULE, import_env_module

    module, colon, name = env.id.rpartition(":")
    if colon and not (MODULE.fullmatch(module) and name):
        problems.append(f"env.id: {env.id!r} is not an id or module:EnvId (e.g. my_pkg.envs:MyEnv-v0)")
        return
    if colon and not resolves("env.id", import_env_module, module):
        return
    if name.startswith("ALE/"):
        try:
            import ale_py
        except ImportError:
            problems.append(f"env.id: {env.id!r} needs ale-py, which is not installed; pip install ale-py")
            return
        gymnasium.register_envs(ale_py)
    registry = gymnasium.envs.registry
    if name not in registry:
        close = difflib.get_close_matches(name, list(registry), n=3)
        hint = f"did you mean {', '.join(map(repr, close))}?" if close else \
            f"module {module!r} registers no such id" if colon else "see gymnasium.envs.registry"
        if not colon:
            hint += "; a package that registers it on import goes in env.imports"
        problems.append(f"env.id: {env.id!r} is not a registered gymnasium environment; {hint}")
    elif env.atari and {**registry[name].kwargs, **env.kwargs}.get("frameskip", 1) != 1:
        skip = {**registry[name].kwargs, **env.kwargs}["frameskip"]
        problems.append(f"env.kwargs.frameskip: {skip!r} is not allowed with env.atari true; use 1 "
                        f"(the Atari preprocessing skips frames itself)")


def _check_device(device: str, problems: list[str]) -> None:
    m = re.fullmatch(r"cpu|cuda(?::(\d+))?", device)
    if not m:
        problems.append(f"learners.device: {device!r} is not allowed; use one of: cpu, cuda, cuda:N")
        return
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            problems.append(f"learners.device: {device!r} but CUDA is not available; use cpu")
        elif m.group(1) and int(m.group(1)) >= torch.cuda.device_count():
            problems.append(f"learners.device: {device!r} but only {torch.cuda.device_count()} CUDA "
                            f"device(s) are visible; allowed: cuda:0 .. cuda:{torch.cuda.device_count() - 1}")


def config_here(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's config dict with a learner device this host has: a run trained on a
    GPU (or on cuda:N) evaluates and resumes on a host without it, its learner on the CPU."""
    device = str(saved.get("learners", {}).get("device", "cpu"))
    problems: list[str] = []
    _check_device(device, problems)
    if problems and re.fullmatch(r"cuda(:\d+)?", device):  # a malformed device stays, to be reported
        return apply_overrides(saved, {"learners.device": "cpu"})
    return dict(saved)


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


def _check_producers(cfg: Config, problems: list[str], bad: set[str]) -> None:
    """Every local actor puts into one queue, which registers a bounded number of putting
    threads at once (native/rq.h); remote actors put through one thread of the trainer's."""
    if {"actors.num", "actors.mode"} & bad or cfg.actors.mode == "ray":
        return
    from replay.queue import MAX_PRODUCERS  # here: validating a config needs no compiled queue otherwise

    if cfg.actors.num > MAX_PRODUCERS:
        problems.append(f"actors.num: {cfg.actors.num} local actors each put into one queue, which takes "
                        f"{MAX_PRODUCERS} at once; use at most {MAX_PRODUCERS}, or actors.mode: ray "
                        f"(one thread puts for every remote actor)")


def _check_sync(cfg: Config, problems: list[str], bad: set[str]) -> None:
    """Synchronous actors act one batch per update between them (a3c.actor.SyncGate):
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


def _validate(data: Mapping[str, Any], problems: list[str], source: str | None) -> Config:
    bad: set[str] = set()
    cfg = _build(Config, data, "", problems, bad)
    if "name" not in bad and (not cfg.name or cfg.name.startswith(".") or re.search(r"[/\\]", cfg.name)):
        problems.append(f"name: {cfg.name!r} is not allowed; use a folder name without '/' or '\\' "
                        f"that does not start with '.'")
    _check_minibatches(cfg.learners, cfg.actors.unroll_length, problems, bad)
    if not ({"actors.queue_capacity", "learners.batch_size"} & bad) \
            and cfg.actors.queue_capacity < cfg.learners.batch_size:
        problems.append(f"actors.queue_capacity: {cfg.actors.queue_capacity} is smaller than "
                        f"learners.batch_size ({cfg.learners.batch_size}); "
                        f"allowed: queue_capacity >= batch_size")
    _check_producers(cfg, problems, bad)
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
    _check_env(cfg.env, problems, bad)
    env_data = data.get("env")
    named_by = cfg.env.factory or cfg.env.entry_point
    if named_by and isinstance(env_data, Mapping) and "id" not in env_data:
        cfg.env.id = named_by.rpartition(":")[2]  # the run's name for an environment no id names
    if "learners.device" not in bad:
        _check_device(cfg.learners.device, problems)
        if cfg.learners.device != "cpu" and cfg.learners.mode == "process":
            problems.append(f"learners.mode: process with learners.device {cfg.learners.device!r} is not "
                            "supported: the GPU model lives in the trainer's process; use learners.mode: "
                            "thread (learners.num threads share it)")
    _check_ray(cfg.ray, problems, bad)
    if problems:
        raise ConfigError(problems, source)
    return cfg


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


def load_config(source: str | os.PathLike | Mapping[str, Any] | Config,
                overrides: Sequence[str] | Mapping[str, Any] = ()) -> Config:
    """Load and validate a config from a YAML path, a dict or a Config, applying overrides.

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
        data = _read_yaml(Path(source))
    else:
        raise ConfigError([f"config source: {type(source).__name__} given; "
                           f"expected a path, a dict or a Config"])
    problems: list[str] = []
    items = dict(overrides) if isinstance(overrides, Mapping) else _parse_overrides(
        [overrides] if isinstance(overrides, str) else overrides, problems)
    return _validate(_apply(data, items, problems), problems, name)


def config_to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict of the config (YAML-safe)."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """Write the config as YAML, atomically."""
    text = yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=None)
    write_atomically(path, lambda file: file.write(text.encode("utf-8")))


def _flow(v: Any) -> str:
    return yaml.safe_dump(v, default_flow_style=True, width=float("inf")).removesuffix("\n...\n").strip()


def config_table(cfg: Config) -> str:
    """Markdown table ``| key | value |``, one row per dotted leaf (for TensorBoard's text plugin)."""
    flat = config_to_dict(cfg)
    rows = []
    for key, _, _ in _leaves():
        v: Any = flat
        for part in key.split("."):
            v = v[part]
        rows.append(f"| {key} | {_flow(v).replace('|', chr(92) + '|')} |")
    return "\n".join(["| key | value |", "|---|---|", *rows])
