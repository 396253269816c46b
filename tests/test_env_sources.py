"""Environments from anywhere: a registered id, gymnasium's `module:EnvId`, `env.imports`
(and the `gymnasium.envs` hook of an imported package), an entry point, a factory passed to
the Python API, and `env.wrappers` in order; the short errors when a module cannot be
imported or a factory cannot reach actor processes; and a corridor defined only in the tests
that learns through its entry point. The environments live in tests/envs_for_tests.py,
imported by name as a user's own package would be."""
import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml

from a3c import A3C
from a3c.api import evaluate
from a3c.checkpoint import CheckpointError
from a3c.config import ConfigError, load_config
from a3c.envs import EnvError, make_env
from a3c.envs.preflight import preflight
from a3c.metrics import MemorySink
from a3c.trainer import Trainer
from conftest import A3C_CLI, run_killing_its_actor
from envs_for_tests import PLAIN_ID, REGISTERED_ID, Corridor, PlainCorridor, Scale, make_corridor

pytestmark = pytest.mark.usefixtures("stop_the_fork_server")  # restarted actors come from it

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
ON_IMPORT, ON_IMPORT_ID = "envs_registered_on_import", "TestOnImport-v0"
CORRIDOR = {"entry_point": "envs_for_tests:Corridor", "kwargs": {"length": 6}, "max_episode_steps": 12}
TINY = {"actors": {"mode": "thread", "num": 1, "envs_per_actor": 2, "unroll_length": 5, "queue_capacity": 16},
        "learners": {"batch_size": 4, "minibatches": 1},
        "logging": {"progress": False, "interval_s": 0.5}, "checkpoint": {"interval_s": 0}}


def config(env, run_root=None, **top):
    """A tiny run's config dict with this env section."""
    logging = {**TINY["logging"], **({"run_root": str(run_root)} if run_root else {})}
    return {**TINY, "logging": logging, "env": env, **top}


def a3c(*args, timeout=120):
    """The command line, with tests/ on the module search path (where the user's package would be)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([*A3C_CLI, *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def first_obs(env_section):
    env = make_env(load_config({"env": env_section}).env)
    try:
        return env.reset(seed=0)[0]
    finally:
        env.close()


@pytest.fixture
def not_yet_imported():
    """The module that registers TestOnImport-v0, as if this process had never imported it."""
    def forget():
        sys.modules.pop(ON_IMPORT, None)
        gym.envs.registry.pop(ON_IMPORT_ID, None)
    forget()
    yield forget
    forget()


@pytest.fixture
def package_with_a_hook(tmp_path, monkeypatch):
    """An installed package that registers its id only through a `gymnasium.envs` entry
    point, the plugin hook gymnasium 1.0 no longer runs, as MinAtar does."""
    package = tmp_path / "hooked_envs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "registration.py").write_text(
        "import gymnasium as gym\n\n"
        "def register_envs():\n"
        "    gym.register('Hooked/Corridor-v0', entry_point='envs_for_tests:Corridor')\n")
    info = tmp_path / "hooked_envs-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hooked-envs\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[gymnasium.envs]\nHooked = hooked_envs.registration:register_envs\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "Hooked/Corridor-v0"
    for name in [m for m in sys.modules if m.partition(".")[0] == "hooked_envs"]:
        del sys.modules[name]
    gym.envs.registry.pop("Hooked/Corridor-v0", None)
    from a3c.envs import sources as envs

    envs._HOOKS_RUN.discard("hooked_envs.registration:register_envs")


# ------------------------------------------------------------------------------ where envs come from
def test_a_registered_id_is_made_by_gymnasium_with_its_kwargs():
    cfg = load_config({"env": {"id": REGISTERED_ID, "kwargs": {"length": 3}}})
    env = make_env(cfg.env)
    assert env.spec.id == REGISTERED_ID and env.reset(seed=0)[0].shape == (3,)


def test_module_colon_env_id_imports_the_module_that_registers_the_id(not_yet_imported):
    cfg = load_config({"env": {"id": f"{ON_IMPORT}:{ON_IMPORT_ID}"}})
    not_yet_imported()  # as in a fresh actor process: making it imports the module again
    assert make_env(cfg.env).spec.id == ON_IMPORT_ID


def test_an_id_registered_on_import_is_found_once_its_module_is_in_env_imports(not_yet_imported):
    with pytest.raises(ConfigError) as caught:
        preflight(load_config({"env": {"id": ON_IMPORT_ID}}))
    (problem,) = caught.value.problems
    assert problem.startswith(f"env.id: {ON_IMPORT_ID!r} is not a registered gymnasium environment")
    assert problem.endswith("a package that registers it on import goes in env.imports")
    cfg = load_config({"env": {"id": ON_IMPORT_ID, "imports": [ON_IMPORT]}})
    not_yet_imported()
    assert make_env(cfg.env).spec.id == ON_IMPORT_ID


def test_env_imports_runs_the_gymnasium_envs_hook_of_the_package_it_imports(package_with_a_hook):
    with pytest.raises(ConfigError, match="is not a registered gymnasium environment"):
        preflight(load_config({"env": {"id": package_with_a_hook}}))
    cfg = load_config({"env": {"id": package_with_a_hook, "imports": ["hooked_envs"]}})
    preflight(cfg)
    preflight(cfg)  # the hook runs once
    assert make_env(cfg.env).spec.id == package_with_a_hook


def test_an_entry_point_is_called_with_kwargs_within_the_time_limit_and_names_the_run():
    cfg = load_config({"env": {"entry_point": "envs_for_tests:make_corridor", "kwargs": {"length": 4},
                               "max_episode_steps": 3}})
    assert cfg.env.id == "make_corridor"  # no id given: the entry point's name
    env = make_env(cfg.env)
    assert env.reset(seed=0)[0].shape == (4,)
    for _ in range(3):
        *_, terminated, truncated, _ = env.step(0)
    assert truncated and not terminated
    # An id given with an entry point only names the environment: it is not looked up.
    assert load_config({"env": {"id": "MyCorridor", "entry_point": "envs_for_tests:Corridor"}}).env.id == "MyCorridor"


def test_an_entry_point_that_returns_no_environment_is_one_error_saying_so():
    cfg = load_config({"env": {"entry_point": "envs_for_tests:not_an_env"}})
    with pytest.raises(EnvError) as caught:
        make_env(cfg.env)
    assert str(caught.value) == ("env.entry_point 'envs_for_tests:not_an_env' returned a str, not a "
                                 "gymnasium.Env; subclass gymnasium.Env (or gymnasium.Wrapper)")


def test_wrappers_apply_in_the_order_listed():
    offset_then_scale = first_obs({**CORRIDOR, "kwargs": {"length": 3}, "wrappers": [
        {"envs_for_tests:Offset": {"offset": 1}}, {"envs_for_tests:Scale": {"factor": 10}}]})
    scale_then_offset = first_obs({**CORRIDOR, "kwargs": {"length": 3}, "wrappers": [
        "envs_for_tests:Scale", {"envs_for_tests:Offset": None}]})
    assert offset_then_scale.tolist() == [20, 10, 10]
    assert scale_then_offset.tolist() == [11, 1, 1]


def test_wrappers_are_written_in_yaml_as_rl_zoo_writes_env_wrapper(tmp_path):
    path = tmp_path / "corridor.yaml"
    path.write_text("env:\n"
                    "  entry_point: envs_for_tests:Corridor\n"
                    "  kwargs: {length: 3}\n"
                    "  wrappers:\n"
                    "    - envs_for_tests:Offset:\n"
                    "        offset: 2\n"
                    "    - envs_for_tests:Scale\n")
    cfg = load_config(path)
    assert cfg.env.wrappers == [{"envs_for_tests:Offset": {"offset": 2}}, "envs_for_tests:Scale"]
    assert make_env(cfg.env).reset(seed=0)[0].tolist() == [30, 20, 20]


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="needs ale-py for an Atari environment")
def test_wrappers_come_after_the_atari_preprocessing():
    cfg = load_config({"env": {"id": "ALE/Pong-v5", "kwargs": {"frameskip": 1}, "atari": True,
                               "wrappers": ["envs_for_tests:Scale"]}})
    env = make_env(cfg.env)
    try:
        assert isinstance(env, Scale) and isinstance(env.env, gym.wrappers.FrameStackObservation)
    finally:
        env.close()


# ------------------------------------------------- an environment whose constructor takes no render_mode
PLAIN_ROUTES = {
    "registered id": {"id": PLAIN_ID, "imports": ["envs_for_tests"]},
    "module:EnvId": {"id": f"envs_for_tests:{PLAIN_ID}"},
    "entry point": {"entry_point": "envs_for_tests:PlainCorridor", "max_episode_steps": 10},
    "wrapped": {"id": f"envs_for_tests:{PLAIN_ID}", "wrappers": [{"envs_for_tests:Scale": {"factor": 2}}]},
}


@pytest.mark.parametrize("route", PLAIN_ROUTES)
def test_every_route_makes_an_environment_whose_constructor_takes_no_render_mode(route):
    obs = first_obs(PLAIN_ROUTES[route])
    assert obs.shape == (5,) and obs.max() in (1.0, 2.0)


def test_a_factory_of_an_environment_without_render_mode_trains_and_evaluates(tmp_path):
    agent = A3C(config({"max_episode_steps": 10}, tmp_path / "runs"), env=PlainCorridor)
    agent.learn(300, sink=MemorySink())
    assert len(evaluate(agent.model, agent.config, 2, env=agent.env_factory)) == 2


def test_an_environment_without_render_mode_trains_evaluates_and_says_why_it_has_no_video(tmp_path):
    path = tmp_path / "plain.yaml"
    path.write_text(yaml.safe_dump(config(PLAIN_ROUTES["module:EnvId"], tmp_path / "runs",
                                          total_timesteps=600)))
    result = a3c("train", path)
    assert result.returncode == 0, result.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    result = a3c("eval", run_dir, "--episodes", "2")
    assert result.returncode == 0 and result.stdout.startswith("2 episodes: mean return"), result.stderr
    result = a3c("eval", run_dir, "--video", tmp_path / "plain.mp4")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: env.id 'envs_for_tests:{PLAIN_ID}' takes no render_mode argument, "
                           "and a video needs its frames: accept render_mode in the constructor")
    assert not (tmp_path / "plain.mp4").exists()


def test_an_environment_on_the_old_gym_api_is_one_line_before_any_run_folder(tmp_path):
    result = a3c("train", "cartpole", "env.entry_point=envs_for_tests:OldApiCorridor", "env.max_episode_steps=10",
                 f"logging.run_root={tmp_path / 'runs'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: env.id 'OldApiCorridor': reset() returned a ndarray, where gymnasium's API "
                           "returns (observation, info)")
    assert "GymV21CompatibilityV0" in line
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------- what cannot be found
def test_modules_that_cannot_be_imported_are_reported_together_each_naming_the_fix():
    with pytest.raises(ConfigError) as caught:
        preflight(load_config({"env": {"id": "no_such_env_package:Foo-v0",
                                       "imports": ["no_such_env_package", "a b"]}}))
    assert caught.value.problems == [
        "env.imports[0]: module 'no_such_env_package' cannot be imported: no module named "
        "'no_such_env_package'; is it installed? pip install no_such_env_package (or the package that "
        "provides it), or fix the name",
        "env.imports[1]: 'a b' is not a module name; use a dotted name such as minatar or my_pkg.envs",
        "env.id: module 'no_such_env_package' cannot be imported: no module named 'no_such_env_package'; "
        "is it installed? pip install no_such_env_package (or the package that provides it), or fix the name",
    ]
    with pytest.raises(ConfigError) as caught:
        preflight(load_config({"env": {"entry_point": "envs_for_tests:Coridor", "wrappers": [
            "gymnasium.wrappers.FlattenObservation", {"envs_for_tests:Scale": 10}]}}))
    assert caught.value.problems == [
        "env.entry_point: envs_for_tests has no attribute 'Coridor'; did you mean 'Corridor'?",
        "env.wrappers[0]: 'gymnasium.wrappers.FlattenObservation' is not of the form module:name; "
        "did you mean 'gymnasium.wrappers:FlattenObservation'?",
        "env.wrappers[1]: {'envs_for_tests:Scale': 10} is not a wrapper; write module:Wrapper, or a "
        "mapping of one module:Wrapper to its keyword arguments",
    ]


def test_an_unknown_module_on_the_command_line_is_one_problem_without_traceback_or_run_folder(tmp_path):
    result = a3c("train", ROOT / "configs" / "cartpole.yaml", "env.imports=[no_such_env_package]",
                 f"logging.run_root={tmp_path / 'runs'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    header, problem = result.stderr.strip().splitlines()  # the format of every config error
    assert header.startswith("error: ")
    assert problem.strip().startswith("env.imports[0]: module 'no_such_env_package' cannot be imported")
    assert "pip install no_such_env_package" in problem
    assert not (tmp_path / "runs").exists()


def test_an_entry_point_trains_and_evaluates_from_the_command_line(tmp_path):
    path = tmp_path / "corridor.yaml"
    path.write_text(yaml.safe_dump(config(CORRIDOR, tmp_path / "runs", total_timesteps=2000,
                                          actors={**TINY["actors"], "mode": "process"})))
    result = a3c("train", path)
    assert result.returncode == 0, result.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["env"]
    assert saved["id"] == "Corridor" and saved["entry_point"] == "envs_for_tests:Corridor"
    result = a3c("eval", run_dir, "--episodes", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("2 episodes: mean return")


# -------------------------------------------------------------------------- the Python API's factory
def test_a_factory_makes_every_environment_and_a_loaded_agent_needs_it_again(tmp_path):
    factory = functools.partial(Corridor, length=6)
    agent = A3C(config({"max_episode_steps": 12}, tmp_path / "runs"), env=factory)
    assert agent.config.env.factory == "envs_for_tests:Corridor" and agent.config.env.id == "Corridor"
    assert agent.model.observation_space.shape == (6,)  # the model's probe made the factory's env
    agent.learn(600, sink=MemorySink())
    assert agent.recent_returns and set(agent.recent_returns) <= {0.0, 1.0}  # corridor episodes
    returns = evaluate(agent.model, agent.config, 3, env=agent.env_factory)
    assert len(returns) == 3 and set(returns.tolist()) <= {0.0, 1.0}

    agent.save(tmp_path / "corridor.pt")
    with pytest.raises(EnvError) as caught:
        A3C.load(tmp_path / "corridor.pt")
    assert str(caught.value).startswith("env.factory: this run's environment came from the Python "
                                        "callable envs_for_tests:Corridor")
    assert "A3C.load(path, env=...)" in str(caught.value)
    loaded = A3C.load(tmp_path / "corridor.pt", env=factory)
    observations = np.eye(6, dtype=np.float32)
    assert (loaded.predict(observations)[0] == agent.predict(observations)[0]).all()
    assert loaded.learn(300, sink=MemorySink()).num_timesteps >= agent.num_timesteps + 300

    # The command line cannot make a factory's environment: one line, no traceback.
    result = a3c("eval", agent.run_dir)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: env.factory: this run's environment came from the Python callable")


def test_a_factory_run_records_its_partials_arguments_and_the_command_line_takes_the_factory(tmp_path):
    agent = A3C(config({"max_episode_steps": 12}, tmp_path / "runs"), env=functools.partial(Corridor, length=6))
    agent.learn(600, sink=MemorySink())
    saved = yaml.safe_load((agent.run_dir / "config.yaml").read_text())["env"]
    assert saved["factory"] == "envs_for_tests:Corridor" and saved["kwargs"] == {"length": 6}
    result = a3c("eval", agent.run_dir, "--episodes", "2", "--env", "envs_for_tests:Corridor")
    assert result.returncode == 0 and result.stdout.startswith("2 episodes: mean return"), result.stderr
    result = a3c("train", "--resume", agent.run_dir, "total_timesteps=1200", "--env", "envs_for_tests:Corridor")
    assert result.returncode == 0, result.stderr
    result = a3c("eval", agent.run_dir, "--env", "envs_for_tests:Coridor")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line == "error: --env: envs_for_tests has no attribute 'Coridor'; did you mean 'Corridor'?"


@pytest.mark.parametrize("trained_with, then, fix", [
    ("factory", "'envs_for_tests:Corridor'", "pass the callable it was trained with: "
                                              "A3C.load(path, env=envs_for_tests:Corridor)"),
    ("id", "None", f"it was trained on env.id {REGISTERED_ID!r}: load it without env="),
])
def test_a_run_loaded_with_another_factory_refuses_to_train_before_any_run_folder(trained_with, then, fix,
                                                                                  tmp_path):
    if trained_with == "factory":
        agent = A3C(config({"max_episode_steps": 12}, tmp_path / "trained"),
                    env=functools.partial(Corridor, length=6))
    else:
        agent = A3C(config({"id": REGISTERED_ID, "kwargs": {"length": 6}, "max_episode_steps": 12},
                           tmp_path / "trained"))
    agent.learn(300, sink=MemorySink()).save(tmp_path / "corridor.pt")
    # The same spaces, so the weights load and the agent predicts; training on would carry
    # one environment's optimizer statistics and counters into another's run.
    loaded = A3C.load(tmp_path / "corridor.pt", env=functools.partial(make_corridor, length=6))
    runs = set((tmp_path / "trained").iterdir())
    with pytest.raises(CheckpointError) as refused:
        loaded.learn(300, sink=MemorySink())
    assert str(refused.value) == (f"the checkpoint was trained with env.factory = {then} but the config has "
                                  f"env.factory = 'envs_for_tests:make_corridor'; {fix}")
    assert set((tmp_path / "trained").iterdir()) == runs


def test_a_factory_reaches_actor_processes_started_and_restarted_from_the_fork_server(tmp_path):
    cfg = load_config(config({}), {"actors.mode": "process", "total_timesteps": 4000})
    # Trained from a second thread, the trainer starts even the first actor from the fork
    # server, which receives the factory pickled; the kill below makes it start another.
    trainer = Trainer(cfg, tmp_path / "run", sink=MemorySink(),
                      env_factory=functools.partial(Corridor, length=6))
    result, _ = run_killing_its_actor(trainer)
    assert result["actor_restarts"] >= 1 and result["env_steps"] >= 4000
    # Fragments of 6-cell observations (anything else would not fit the queue) and returns
    # of 0 or 1: the actors made the factory's corridor, not the config's CartPole.
    assert set(trainer.monitor.recent_returns) <= {0.0, 1.0}


def _local_factory():
    def make():
        return Corridor()
    return make


@pytest.mark.parametrize("factory, what", [(lambda: Corridor(), "a lambda"),
                                           (_local_factory(), "a local function")])
def test_an_unpicklable_factory_with_actor_processes_is_one_clear_error_before_any_run_folder(
        factory, what, tmp_path):
    with pytest.raises(EnvError) as caught:
        A3C(config({}, tmp_path / "runs"), env=factory, actors__mode="process")
    message = str(caught.value)
    assert "\n" not in message and f"is {what}" in message
    assert "define it at module level" in message and "functools.partial" in message
    assert "actors.mode=thread" in message
    assert not (tmp_path / "runs").exists()
    with pytest.raises(EnvError, match=what):  # the trainer refuses it too
        Trainer(load_config(config({}), {"actors.mode": "process"}), tmp_path / "run", env_factory=factory)
    assert not (tmp_path / "run").exists()
    # Actor threads receive the factory as it is.
    assert A3C(config({}, tmp_path / "runs"), env=factory).env_factory is factory


def test_minatar_registers_through_env_imports():
    pytest.importorskip("minatar", reason="MinAtar is not installed (pip install minatar)")
    cfg = load_config({"env": {"id": "MinAtar/Breakout-v1", "imports": ["minatar"]}})
    env = make_env(cfg.env)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (10, 10, 4) and env.action_space.n == 3


# ---------------------------------------------------------------------------------------- learning
@pytest.mark.learning
def test_a_corridor_defined_only_in_the_tests_learns_through_its_entry_point(tmp_path):
    """Length 8 within 16 steps: a random walk reaches the end in one episode of eight; the
    last 100 episodes of a learned policy almost all do. About 3 s on 2 cores."""
    agent = A3C({"env": {"entry_point": "envs_for_tests:Corridor", "kwargs": {"length": 8},
                         "max_episode_steps": 16},
                 "total_timesteps": 50_000, "target_return": 0.95, "seed": 1,
                 "logging": {"run_root": str(tmp_path), "progress": False}, "checkpoint": {"interval_s": 0}})
    agent.learn(sink=MemorySink())
    returns = agent.recent_returns
    assert len(returns) == 100 and np.mean(returns) >= 0.95, \
        f"last-100 mean {np.mean(returns):.2f} after {agent.num_timesteps} steps"
