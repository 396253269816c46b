"""Learning: each shipped config reaches its task's threshold (the mean return of the last
100 episodes) within the config's own budget, for several seeds; and CartPole, trained for
its whole budget with no early stop, ends solved (a run that collapses after its first
peak fails). About 5-35 s per run on 2 cores: seed 1 of each task runs by default, seeds 2
and 3 with -m slow. Marked slow too (about a minute or two each): CartPole trained for its
whole budget; CartPole at a constant learning rate for twice its budget stays solved, with
no decay of the rate to hold it; MinAtar Breakout's config reaches the MinAtar paper's DQN
return."""
import pytest

from a3c import A3C
from a3c.config import load_config
from a3c.metrics import MemorySink

from conftest import WINDOW, hold, means

pytestmark = [pytest.mark.usefixtures("stop_the_fork_server"),  # actors come from the fork server
              pytest.mark.learning]

# The shipped configs, each read at test time (the config is the thing tested) with the
# threshold it names (solved_return).
TASKS = ("cartpole", "acrobot", "pendulum")


def solved(task: str) -> float:
    return load_config(task).solved_return


def train(task, seed, tmp_path, **overrides):
    """Train the shipped config of `task`; its episodes as (env step, return) and the agent."""
    sink = MemorySink()
    agent = A3C(task, seed=seed, logging__run_root=str(tmp_path),
                logging__progress=False, checkpoint__interval_s=0, **overrides)
    agent.learn(sink=sink)
    return sink.scalars.get("charts/episodic_return", []), agent


@pytest.mark.parametrize("seed", [1, pytest.param(2, marks=pytest.mark.slow),
                                  pytest.param(3, marks=pytest.mark.slow)])
@pytest.mark.parametrize("task", TASKS)
def test_shipped_config_reaches_its_threshold_within_its_budget(task, seed, tmp_path):
    threshold = solved(task)
    # target_return stops the run once the monitor's last 100 returns reach the threshold;
    # the check below recomputes that from the recorded episodes.
    episodes, agent = train(task, seed, tmp_path, target_return=threshold)
    reached = next(((step, mean) for step, mean in means(episodes) if mean >= threshold), None)
    best = max((mean for _, mean in means(episodes)), default=float("nan"))
    print(f"\n{task} seed {seed}: {len(episodes)} episodes, {agent.num_timesteps} env steps; "
          + (f"the last-{WINDOW} mean reached {reached[1]:.1f} at step {reached[0]}" if reached
             else f"best last-{WINDOW} mean {best:.1f}"))
    assert reached is not None and reached[0] <= agent.config.total_timesteps, \
        f"{task} seed {seed}: best mean return over {WINDOW} episodes was {best:.1f} < {threshold}"


@pytest.mark.slow
def test_cartpole_trained_for_its_whole_budget_ends_solved(tmp_path):
    episodes, agent = train("cartpole", 1, tmp_path)
    assert agent.num_timesteps >= agent.config.total_timesteps
    curve = list(means(episodes))
    lowest_late = min((mean for step, mean in curve if step > curve[-1][0] // 2),
                               default=float("nan"))
    print(f"\ncartpole seed 1, {agent.num_timesteps} env steps: final last-{WINDOW} mean "
          f"{curve[-1][1]:.1f}, lowest over the second half {lowest_late:.1f}")
    assert curve[-1][1] >= solved("cartpole"), f"the run ended at a mean return of {curve[-1][1]:.1f}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cartpole_at_a_constant_learning_rate_stays_solved(seed, tmp_path):
    """Once solved, stays solved by itself: 1 M steps at the starting rate, and the last-100
    mean never falls below 400 after first reaching 475, and ends at 475 or more."""
    episodes, agent = train("cartpole", seed, tmp_path, optim__lr_schedule="constant",
                            total_timesteps=1_000_000)
    assert agent.num_timesteps >= 1_000_000
    held = hold(episodes, solved("cartpole"))
    assert held is not None, f"seed {seed}: never reached {solved('cartpole')}"
    print(f"\ncartpole seed {seed}, constant rate, {agent.num_timesteps} env steps: {held}")
    assert held.lowest >= 400, \
        f"seed {seed}: fell to a last-{WINDOW} mean of {held.lowest:.1f} at step {held.lowest_at}"
    assert held.final >= solved("cartpole"), f"seed {seed}: ended at {held.final:.1f}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_minatar_breakout_reaches_the_papers_dqn_return(seed, tmp_path):
    """configs/minatar_breakout.yaml reaches a last-100 mean of 10 (about the MinAtar paper's
    DQN at 5 M frames) within its budget; about 1 to 5 minutes a seed on 2 cores."""
    pytest.importorskip("minatar", reason="MinAtar is not installed (pip install -e '.[minatar]')")
    threshold = solved("minatar_breakout")
    episodes, agent = train("minatar_breakout", seed, tmp_path, target_return=threshold)
    reached = next(((step, mean) for step, mean in means(episodes) if mean >= threshold), None)
    best = max((mean for _, mean in means(episodes)), default=float("nan"))
    print(f"\nminatar_breakout seed {seed}: {agent.num_timesteps} env steps; "
          + (f"reached {reached[1]:.1f} at step {reached[0]}" if reached else f"best {best:.1f}"))
    assert reached is not None, f"seed {seed}: best last-{WINDOW} mean {best:.1f} < {threshold}"
