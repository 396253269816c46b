"""Config layer: YAML loading, overrides, validation messages, saving and reporting; and the
pre-flight checks of what a config names outside itself (a3c.envs.preflight)."""
import importlib.util
import re
import sys
from pathlib import Path

import pytest
import yaml

from a3c.config import (Config, ConfigError, apply_overrides, config_table, config_to_dict, field_help, load_config,
                        save_config)
from a3c.envs.preflight import preflight

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))
HAS_ALE = importlib.util.find_spec("ale_py") is not None


def problems(source, overrides=()):
    """The problems of a config, its own or those of what it names, as a run finds them."""
    with pytest.raises(ConfigError) as info:
        preflight(load_config(source, overrides))
    return info.value.problems


def test_configs_folder_holds_the_expected_configs():
    assert {p.stem for p in CONFIGS} >= {"cartpole", "acrobot", "pendulum", "pong"}


def leaves(d, prefix=""):
    """{dotted key: value} of every field a config dict sets (kwargs and wrappers as values)."""
    return {k: x for key, v in d.items()
            for k, x in (leaves(v, f"{prefix}{key}.").items() if isinstance(v, dict) and key != "kwargs"
                         else {prefix + key: v}.items())}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_config_loads_differs_from_the_defaults_only_where_it_says_and_names_its_threshold(path):
    raw = yaml.safe_load(path.read_text())
    cfg = load_config(path.stem)  # by name, as a user names it
    assert cfg == load_config(path) and cfg.name == path.stem
    assert cfg.solved_return is not None and raw["solved_return"] == cfg.solved_return
    resolved, default = leaves(config_to_dict(cfg)), leaves(config_to_dict(Config()))
    differ = {key for key in resolved if resolved[key] != default[key]}
    assert differ == set(leaves(raw))  # each field it writes changes a default, and only those change
    if cfg.env.id.startswith("ALE/") and not HAS_ALE:
        pytest.importorskip("ale_py", reason="the ALE environment check needs ale-py")
    if any(name in cfg.env.imports or cfg.env.id.startswith(name) for name in ("minatar", "MinAtar")):
        pytest.importorskip("minatar", reason="the MinAtar environment check needs minatar")
    preflight(cfg)


def test_an_empty_dict_gives_the_defaults():
    assert load_config({}) == Config()
    assert load_config(Config()) == Config()


def test_string_overrides_parse_floats_ints_lists_and_null():
    cfg = load_config({}, ["optim.lr=3e-4", "seed=7", "model.hidden_sizes=[128,128]",
                           "vtrace.clip_rho_threshold=null", "learners.gamma=1", "env.kwargs.frameskip=1"])
    assert cfg.optim.lr == 3e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.seed == 7 and cfg.model.hidden_sizes == [128, 128]
    assert cfg.vtrace.clip_rho_threshold is None
    assert cfg.learners.gamma == 1.0 and isinstance(cfg.learners.gamma, float)  # int accepted for float
    assert cfg.env.kwargs == {"frameskip": 1}


def test_mapping_overrides_set_values_as_given_without_touching_the_input():
    data = {"optim": {"lr": 1e-3}}
    out = apply_overrides(data, {"optim.lr": 3e-4, "actors.num": 4})
    assert data == {"optim": {"lr": 1e-3}}
    assert out == {"optim": {"lr": 3e-4}, "actors": {"num": 4}}
    assert load_config(data, {"optim.lr": 3e-4}).optim.lr == 3e-4


def test_malformed_override_is_reported():
    assert any("expected dotted.key=value" in p for p in problems({}, ["optim.lr"]))
    with pytest.raises(ConfigError, match="optim"):
        apply_overrides({"optim": 5}, {"optim.lr": 1.0})


@pytest.mark.parametrize("key, suggestion", [
    ("optim.lrr", "optim.lr"), ("nmae", "name"), ("actors.unroll_lenght", "actors.unroll_length"),
    ("optimm.lr", "optim"), ("env.frame_stak", "env.frame_stack")])
def test_misspelled_key_anywhere_is_reported_with_a_suggestion(key, suggestion):
    bad_key = key.split(".")[0] if key.startswith("optimm") else key
    assert f"{bad_key}: unknown key; did you mean '{suggestion}'?" in problems({}, [f"{key}=1"])


def test_several_problems_are_all_reported_in_one_error():
    with pytest.raises(ConfigError) as info:
        load_config({"optim": {"lrr": 1, "lr": -1}, "actors": {"mode": "proces"},
                     "learners": {"gamma": 1.5, "batch_size": "32"}}, ["seed=x"])
    found = info.value.problems
    assert len(found) == 6
    for key in ("optim.lrr", "optim.lr", "actors.mode", "learners.gamma", "learners.batch_size", "seed"):
        assert any(p.startswith(f"{key}:") for p in found), key
        assert key in str(info.value)
    assert len(str(info.value).splitlines()) == 1 + len(found)  # a header, then one problem per line


@pytest.mark.parametrize("override, message", [
    ("actors.mode=proces", "actors.mode: 'proces' is not allowed; use one of: process, thread"),
    ("optim.name=sgd", "optim.name: 'sgd' is not allowed; use one of: rmsprop, adam"),
    ("learners.device=tpu", "learners.device: 'tpu' is not allowed; use one of: cpu, cuda, cuda:N"),
    ("learners.batch_size=true", "learners.batch_size: True has type bool; expected int"),
    ("optim.lr=fast", "optim.lr: 'fast' has type str; expected float"),
    ("vtrace.clip_rho_threshold=[1]", "vtrace.clip_rho_threshold: [1] has type list; expected float or null"),
    ("env=3", "env: 3 has type int; expected a section"),
    ("learners.gamma=1.5", "learners.gamma: 1.5 is out of range; allowed: 0 <= gamma <= 1"),
    ("optim.lr=0", "optim.lr: 0 is out of range; allowed: lr > 0"),
    ("actors.unroll_length=0", "actors.unroll_length: 0 is out of range; allowed: unroll_length >= 1"),
    ("total_timesteps=0", "total_timesteps: 0 is out of range; allowed: total_timesteps >= 1"),
    ("vtrace.clip_pg_rho_threshold=-1", "vtrace.clip_pg_rho_threshold: -1 is out of range; "
                                        "allowed: clip_pg_rho_threshold > 0 or null"),
    ("logging.interval_s=0", "logging.interval_s: 0 is out of range; allowed: interval_s > 0"),
    ("checkpoint.interval_s=-1", "checkpoint.interval_s: -1 is out of range; allowed: interval_s >= 0"),
    ("model.hidden_sizes=[64,0]", "model.hidden_sizes[1]: 0 is out of range; allowed: hidden_sizes >= 1"),
    ("actors.queue_capacity=8", "actors.queue_capacity: 8 is smaller than learners.batch_size (32)"),
    ("learners.minibatches=33", "learners.minibatches: 33 is larger than learners.batch_size (32)"),
    ("vtrace.td_lambda=1.5", "vtrace.td_lambda: 1.5 is out of range; allowed: 0 <= td_lambda <= 1"),
    ("replay.ratio=-1", "replay.ratio: -1 is out of range; allowed: ratio >= 0"),
    ("learners.clip_coef=0", "learners.clip_coef: 0 is out of range; allowed: clip_coef > 0 or null"),
])
def test_enum_type_and_range_messages_name_the_field_the_value_and_what_is_allowed(override, message):
    assert any(p.startswith(message) for p in problems({}, [override])), problems({}, [override])


def test_zero_checkpoint_interval_is_allowed():
    assert load_config({}, ["checkpoint.interval_s=0"]).checkpoint.interval_s == 0.0


def test_unknown_env_id_names_the_id_and_a_suggestion():
    (p,) = problems({"env": {"id": "CartPol-v1"}})
    assert p.startswith("env.id: 'CartPol-v1' is not a registered gymnasium environment")
    assert "'CartPole-v1'" in p


def test_ale_id_without_ale_py_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # makes `import ale_py` fail
    (p,) = problems({"env": {"id": "ALE/Pong-v5"}})
    assert p.startswith("env.id: 'ALE/Pong-v5'") and "pip install ale-py" in p


@pytest.mark.skipif(not HAS_ALE, reason="needs ale-py for the ALE environments")
def test_atari_preprocessing_requires_frameskip_1_in_the_base_env():
    (p,) = problems({"env": {"id": "ALE/Pong-v5", "atari": True}})  # ALE v5 defaults to frameskip 4
    assert p.startswith("env.kwargs.frameskip: 4 is not allowed with env.atari true; use 1")
    assert load_config({"env": {"id": "ALE/Pong-v5", "atari": True, "kwargs": {"frameskip": 1}}}).env.atari


def test_proximal_decay_without_the_clip_it_centres_is_refused_with_the_fix():
    (problem,) = problems({"learners": {"proximal_decay": 0.99, "clip_coef": None}})
    assert "learners.proximal_decay" in problem and "clip_coef is null" in problem and "set clip_coef" in problem
    (problem,) = problems({"learners": {"proximal_decay": 1.0}})
    assert "learners.proximal_decay" in problem


def test_bound_coef_with_a_recurrent_model_is_refused_with_the_fix():
    (problem,) = problems({"learners": {"bound_coef": 0.1}, "model": {"lstm": 64}})
    assert "learners.bound_coef" in problem and "model.lstm" in problem and "set one of them to 0" in problem


def test_minibatches_of_steps_may_outnumber_the_fragments_but_not_the_steps():
    raw = {"minibatch_split": "steps", "normalize_advantages": False}
    assert load_config({"learners": {**raw, "minibatches": 512}}).learners.minibatches == 512
    (problem,) = problems({"learners": {**raw, "minibatches": 513}})
    assert problem.startswith("learners.minibatches: 513 is larger than the batch's 512 steps") \
        and "allowed: minibatches <= 512" in problem


@pytest.mark.parametrize("split, unroll_length, limit", [("steps", 16, 256), ("fragments", 1, 16)])
def test_minibatches_whose_advantages_are_normalized_hold_two_steps_each(split, unroll_length, limit):
    """The std of one step's advantage is not a number: every such loss would be skipped."""
    learners = {"minibatch_split": split, "minibatches": limit}
    actors = {"unroll_length": unroll_length}
    assert load_config({"learners": learners, "actors": actors}).learners.minibatches == limit
    (problem,) = problems({"learners": {**learners, "minibatches": limit + 1}, "actors": actors})
    assert problem.startswith(f"learners.minibatches: {limit + 1} is larger than half") \
        and "learners.normalize_advantages" in problem and f"allowed: minibatches <= {limit}" in problem


def test_minibatches_of_steps_with_a_recurrent_model_are_refused_with_the_fix():
    (problem,) = problems({"learners": {"minibatch_split": "steps"}, "model": {"lstm": 64}})
    assert "learners.minibatch_split: steps needs a feedforward model" in problem and "model.lstm" in problem


def test_more_local_actors_than_the_queue_takes_producers_is_an_error_with_the_fix():
    from replay.queue import MAX_PRODUCERS

    assert load_config({"actors": {"num": MAX_PRODUCERS}}).actors.num == MAX_PRODUCERS
    (problem,) = problems({"actors": {"num": MAX_PRODUCERS + 1}})
    assert problem.startswith(f"actors.num: {MAX_PRODUCERS + 1} local actors") and "actors.mode: ray" in problem
    # Remote actors put through one thread of the trainer's, however many there are.
    assert load_config({"actors": {"num": MAX_PRODUCERS + 1, "mode": "ray"}}).actors.num == MAX_PRODUCERS + 1


def test_synchronous_actors_need_a_batch_of_whole_rounds_and_local_actors_with_the_fix():
    """Each actor acts batch / (actors x envs) unrolls per update: 32 / (2 x 8) = 2."""
    assert load_config({"actors": {"sync": True}}).actors.sync
    (problem,) = problems({"actors": {"sync": True, "envs_per_actor": 12}})
    assert problem.startswith("actors.sync: true needs learners.batch_size (32) to be a multiple of "
                              "actors.num x envs_per_actor (2 x 12 = 24)") and "set actors.sync to false" in problem
    (problem,) = problems({"actors": {"sync": True, "mode": "ray"}})
    assert problem.startswith("actors.sync: true is for local actors") and "actors.mode process or thread" in problem


def test_synchronous_actors_need_one_learner_and_no_replay_with_the_fix():
    """Two learners would each take part of a round and wait for the rest forever; a
    learner replaying while the actors act would move the policy that acts."""
    learners, replay = problems({"actors": {"sync": True}, "learners": {"num": 2}, "replay": {"ratio": 1.0}})
    assert learners.startswith("actors.sync: true acts one batch at a time, for one learner; with "
                               "learners.num 2") and "set learners.num to 1" in learners
    assert replay.startswith("actors.sync: true trains each batch from the policy that acted it, and "
                             "replay.ratio 1.0") and "set replay.ratio to 0" in replay


@pytest.mark.parametrize("learners, message", [
    ({"minibatch_split": "steps"}, "minibatch_split: steps needs a feedforward model.*split by fragments"),
    ({"bound_coef": 0.1}, "bound_coef: 0.1 needs a feedforward model.*recurrent; set it to 0")])
def test_settings_for_feedforward_models_are_refused_for_a_users_recurrent_model_with_the_fix(learners, message):
    from a3c.trainer import build_default_model, check_learner_settings

    recurrent = build_default_model(load_config({"env": {"id": "Pendulum-v1"}, "model": {"lstm": 16}}))
    with pytest.raises(ConfigError, match=message):
        check_learner_settings(load_config({"learners": learners}), recurrent)


def test_bound_coef_for_discrete_actions_is_refused_with_the_fix():
    from a3c.trainer import build_default_model, check_learner_settings

    cfg = load_config({"learners": {"bound_coef": 0.1}})  # CartPole: Discrete(2)
    with pytest.raises(ConfigError, match="learners.bound_coef.*Discrete.*set it to 0"):
        check_learner_settings(cfg, build_default_model(cfg))


def test_cuda_device_without_cuda_is_reported():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    (p,) = problems({}, ["learners.device=cuda:0"])
    assert "CUDA is not available" in p and "'cuda:0'" in p


@pytest.mark.parametrize("overrides, message", [
    (["actors.device=gpu"], "actors.device: 'gpu' is not allowed; use one of: cpu, cuda, cuda:N"),
    (["actors.device=cuda", "actors.mode=ray"], "actors.device: 'cuda' is for local actors"),
], ids=["form", "ray"])
def test_an_actors_device_that_cannot_act_is_one_line_naming_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config({}, overrides)


def test_actors_on_cuda_without_cuda_are_reported():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    (p,) = problems({}, ["actors.device=cuda"])
    assert p == "actors.device: 'cuda' but CUDA is not available; use cpu"


def test_missing_file_gives_config_error_naming_the_path(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="nope.yaml"):
        load_config(path)


def test_yaml_syntax_error_gives_config_error_with_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("seed: 1\nenv:\n  id: [CartPole\nname: x\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"{path}:4:" in str(info.value) and "YAML syntax error" in str(info.value)


def test_save_then_load_round_trips(tmp_path):
    cfg = load_config({}, ["optim.lr=3e-4", "vtrace.clip_rho_threshold=null", "env.kwargs={a: 1, b: [x]}",
                           "model.cnn=true", "name=round-trip"])
    path = tmp_path / "run" / "config.yaml"
    save_config(cfg, path)
    assert load_config(path) == cfg
    assert [p.name for p in path.parent.iterdir()] == ["config.yaml"]  # no temp file left behind
    save_config(Config(), path)  # overwrites in place
    assert load_config(path) == Config()


def test_config_table_has_one_row_per_leaf():
    lines = config_table(Config()).splitlines()
    assert lines[:2] == ["| key | value |", "|---|---|"]
    keys = [line.split(" | ")[0].removeprefix("| ") for line in lines[2:]]
    assert keys == list(field_help())
    assert "| optim.betas | [0.9, 0.99] |" in lines and "| model.cnn | null |" in lines


def test_field_help_covers_every_leaf_with_one_line():
    def leaves(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict) and k != "kwargs":
                yield from leaves(v, f"{prefix}{k}.")
            else:
                yield prefix + k
    helps = field_help()
    assert list(helps) == list(leaves(config_to_dict(Config())))
    assert all(h and "\n" not in h for h in helps.values())


def test_the_configuration_reference_is_generated_from_the_schema_and_not_stale():
    from a3c.config.reference import reference

    path = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
    assert path.read_text() == reference(), \
        "docs/configuration.md is stale: python -m a3c.config.reference > docs/configuration.md"


def test_a_config_prints_resolved_with_each_fields_help_and_reads_back_as_the_same_config(tmp_path):
    from a3c.config import describe
    from a3c.config.schema import leaves as fields

    cfg = load_config("acrobot", ["optim.lr=3e-4"])
    text = describe(cfg)
    for key, field, _ in fields():
        assert f"# {field.metadata['help']}\n" in text, key
    path = tmp_path / "printed.yaml"
    path.write_text(text)
    assert load_config(path) == cfg


def test_a_shipped_config_is_found_by_name_wherever_the_user_stands(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config("acrobot").env.id == "Acrobot-v1"
    (p,) = problems("acrobat")
    assert p.startswith("'acrobat' is neither a shipped config nor a file; shipped configs: acrobot, cartpole")


def test_a_run_whose_environment_is_overridden_is_named_after_it():
    assert load_config("cartpole", ["env.id=Acrobot-v1"]).name == "Acrobot-v1"
    assert load_config("cartpole", ["env.id=my_envs:Corridor-v0"]).name == "Corridor-v0"
    assert load_config("cartpole", ["env.id=ALE/Pong-v5", "name=mine"]).name == "mine"
    assert load_config("cartpole", ["optim.lr=1e-3"]).name == "cartpole"


def test_a_suggested_id_keeps_the_module_that_registers_it():
    (p,) = problems({"env": {"id": "envs_for_tests:TestCoridor-v0"}})
    assert p.startswith("env.id: 'envs_for_tests:TestCoridor-v0' is not a registered gymnasium environment")
    assert "did you mean 'envs_for_tests:TestCorridor-v0'" in p
