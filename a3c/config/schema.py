"""The config's schema: typed dataclass sections whose every leaf field carries its
one-line help text in ``metadata["help"]`` (the single source of `field_help`, of
`a3c config` and of docs/configuration.md) and its allowed values and ranges in the same
metadata (`choices`, `ge`, `gt`, `le`, `lt`, `length`), which `rules.build` checks."""
from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ActorsConfig", "CheckpointConfig", "Config", "ConfigError", "EnvConfig", "EvalConfig",
           "LearnersConfig", "LoggingConfig", "ModelConfig", "OptimConfig", "RayConfig", "ReplayConfig",
           "SelfPlayConfig", "VTraceConfig", "field_help", "leaves", "type_name"]


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
    atari: bool = _f(False, "Atari preprocessing (84x84 gray, frame skip 4 with max-pooling, up to 30 "
                     "no-ops at reset) + frame stack (zero frames before the first), as env.atari_backend does it")
    frame_stack: int = _f(4, "frames stacked when atari is true", ge=1)
    atari_backend: str = _f(
        "auto", "what steps an actor's Atari environments (env.atari): ale (one ale_py AtariVectorEnv, which "
                "preprocesses in C++ threads), gymnasium (gymnasium.make, AtariPreprocessing and "
                "FrameStackObservation per environment; the same frames), auto (ale for an ALE/ id made by "
                "env.id with no wrappers, entry point, time limit or kwargs it does not take, where ale-py has "
                "it; else gymnasium)", choices=("auto", "ale", "gymnasium"))
    max_episode_steps: int | None = _f(None, "episode step limit (null: the environment's own)", ge=1)
    wrappers: list[str | dict[str, Any]] = _f(
        [], "wrappers applied in order after the Atari preprocessing: module:Wrapper, or "
            "{module:Wrapper: {kwargs}} (RL Zoo's env_wrapper form)")
    action_mask: str = _f("auto", "where the environment gives its action masks: observation (a Dict "
                          "observation's action_mask entry), info (info['action_mask']), method (an "
                          "action_masks() method), auto (the entry, else the method), none (no masks)",
                          choices=("auto", "observation", "info", "method", "none"))
    multiagent: bool = _f(False, "the environment is a PettingZoo one (an AECEnv or ParallelEnv from "
                          "entry_point or A3C's env= factory): one policy acts for every agent, each "
                          "agent's steps its own fragments; steps count agent steps")
    factory: str | None = _f(None, "set by A3C(config, env=factory), not by hand: the factory's "
                             "module:name; such a run needs it again: A3C.load(path, env=factory)")


@dataclass
class ModelConfig:
    hidden_sizes: list[int] = _f([64, 64], "sizes of the hidden layers of the MLP torso", ge=1)
    activation: str = _f("tanh", "activation of the hidden layers", choices=("tanh", "relu"))
    cnn: bool | None = _f(None, "CNN torso (null: auto, CNN for image observations)")
    cnn_arch: str = _f("auto", "CNN for images: nature (Nature DQN), impala (IMPALA's residual "
                       "torso: 15 layers, more per frame at more cost), small (MinAtar's one 3x3 conv, "
                       "for small grids), auto (nature from 36x36 up, else small)",
                       choices=("auto", "nature", "impala", "small"))
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
    precision: str = _f("auto", "what the torso computes in: float32, bfloat16 (autocast: convolutions "
                        "and matrix products in bfloat16, heads and loss in float32), auto (bfloat16 for the "
                        "nature and impala CNNs where the device computes it in hardware: AVX-512 BF16 or "
                        "AMX CPUs, CUDA GPUs from Ampere on; else float32)",
                        choices=("float32", "bfloat16", "auto"))


@dataclass
class ActorsConfig:
    mode: str = _f("process", "how actors run: processes or threads on this machine, or ray: remote "
                   "actors on a Ray cluster (the ray section)", choices=("process", "thread", "ray"))
    num: int = _f(2, "number of actors", ge=1)
    envs_per_actor: int = _f(8, "environments stepped by each actor", ge=1)
    device: str = _f("cpu", "where local actors run their policy's forward pass: cpu | cuda | cuda:N (the "
                     "weights are copied there once per unroll, the observations each step; the CPU "
                     "cores then step environments only)")
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
    reward_clip: float | None = _f(None, "clip each reward to [-reward_clip, reward_clip] in the loss, as "
                                   "DQN and IMPALA do on Atari (null: rewards as they are); the charted "
                                   "returns stay the game's", gt=0)
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
class EvalConfig:
    interval_steps: int = _f(0, "env steps between evaluations of the newest weights, played by a "
                             "process of their own, and one more at the end of the run; the best "
                             "mean's weights go to best.pt (0: no evaluation)", ge=0)
    episodes: int = _f(10, "episodes each evaluation plays, the i-th reset with seed + i", ge=1)
    deterministic: bool = _f(True, "greedy actions, as a3c eval plays them (false: sampled, as the "
                             "actors act)")
    seed: int = _f(0, "the seed of each evaluation's first episode: every evaluation plays the same "
                   "episodes, those a3c eval plays by default", ge=0)
    judges_target: bool = _f(False, "target_return stops the run on the latest evaluation's mean, not "
                             "on the last 100 training episodes' (needs interval_steps above 0)")


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
class SelfPlayConfig:
    pool_size: int = _f(0, "past versions of the policy each actor keeps to play the other seats of a "
                        "game, the first the policy it starts with (0: the policy plays every seat)", ge=0)
    snapshot_interval: int = _f(10_000, "policy versions (gradient steps) between the snapshots an actor "
                                "adds to its pool, the oldest leaving a full one", ge=1)
    pool_prob: float = _f(0.5, "share of games in which one past version from the pool plays every seat "
                          "but one, chosen at random (those seats make no fragments)", ge=0, le=1)
    eval_games: int = _f(0, "games each evaluation of the newest weights plays against eval_opponent, "
                         "greedy, in a process of its own, the policy taking each seat in turn; charted as "
                         "selfplay/win_rate, draw_rate and loss_rate, by the sign of its return (0: none)", ge=0)
    eval_interval_steps: int = _f(20_000, "env steps between the evaluations against eval_opponent; one more "
                                  "at the end of the run", ge=1)
    eval_opponent: str = _f("random", "the fixed opponent of the evaluator: random (uniform over the "
                            "valid actions), or module:function(obs, mask) -> action (obs: the agent's "
                            "observation without its mask; mask: the flat mask, 1 = valid, or None; a "
                            "discrete action as its index from 0, as the mask counts)")


@dataclass
class Config:
    name: str = _f("run", "run name; the run folder is <run_root>/<name>-<YYYYmmdd-HHMMSS>")
    seed: int = _f(1, "random seed: the default model's initial weights, the environments' seeds and each "
                   "actor process's sampling", ge=0)
    deterministic: bool = _f(
        False, "two runs of the config give bit-identical weights: torch is seeded from seed, and the run "
               "ends between updates; needs actors.num 1, actors.sync true, one learner thread on the "
               "cpu, no replay and no target_return (docs/training.md, Reproducibility)")
    total_timesteps: int = _f(500_000, "env steps to train for (summed over all envs)", ge=1)
    target_return: float | None = _f(
        None, "stop early once the mean return of the last 100 episodes reaches this (null: never)")
    solved_return: float | None = _f(
        None, "the mean return of the last 100 episodes at which the task counts as solved, the bar "
              "the tests and benchmarks judge a run by; unlike target_return, it does not stop a "
              "run (null: none named)")
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    actors: ActorsConfig = field(default_factory=ActorsConfig)
    learners: LearnersConfig = field(default_factory=LearnersConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    vtrace: VTraceConfig = field(default_factory=VTraceConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    selfplay: SelfPlayConfig = field(default_factory=SelfPlayConfig)


class ConfigError(ValueError):
    """Invalid configuration; ``problems`` lists every problem found, one message each."""

    def __init__(self, problems: Sequence[str], source: str | None = None):
        self.problems = list(problems)
        head = f"{source}: " if source else ""
        n = len(self.problems)
        super().__init__(f"{head}invalid config ({n} problem{'s' * (n != 1)}):\n"
                         + "\n".join(f"  {p}" for p in self.problems))


# ----------------------------------------------------------------------------------- introspection
def leaves(cls: type = Config, prefix: str = "") -> list[tuple[str, dataclasses.Field, Any]]:
    """(dotted key, field, type) for every leaf field, in declaration order."""
    out, hints = [], typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out += leaves(tp, f"{prefix}{f.name}.")
        else:
            out.append((prefix + f.name, f, tp))
    return out


def field_help() -> dict[str, str]:
    """Dotted key -> one-line help text, for every leaf field."""
    return {key: f.metadata["help"] for key, f, _ in leaves()}


def type_name(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if typing.get_origin(tp) is list:
        return f"list of {type_name(typing.get_args(tp)[0])}"
    if tp is dict or typing.get_origin(tp) is dict:
        return "mapping"
    return tp.__name__
