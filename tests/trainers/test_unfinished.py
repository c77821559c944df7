"""GRPO ranks a finished episode above the same work left for a budget to end.

The rubric scores the workspace however an episode ended, so a stage row pays its
stage's work whether or not the policy then calls ``finish``. Trained on that reward
alone, GRPO saw no difference between finishing and running out the turn budget, and
the finishing habit drifted away (skill_ladder S3: held-out episodes calling ``finish``
fell from 29 to 16 of 48). These tests play a real stage row of the toy benchmark both
ways through the env and its rubric, and check what the trainer's advantages make of it.
"""

import pytest

torch = pytest.importorskip("torch")

from bat_gym.bank.demonstrate import load_demonstration  # noqa: E402
from bat_gym.core.completion import Completion  # noqa: E402
from bat_gym.core.protocol import get_protocol  # noqa: E402
from bat_gym.env import StageEnv  # noqa: E402
from bat_gym.rollout import EpisodeResult, run_episode  # noqa: E402
from bat_gym.rubrics.verifier.reward import RubricReward  # noqa: E402
from bat_gym.trainers.fsdp import Dist  # noqa: E402
from bat_gym.trainers.grpo import GRPOConfig  # noqa: E402
from bat_gym.trainers.grpo.batch import rollout_metrics, shaped_reward, train_batch  # noqa: E402

MAX_TURNS = 6


def play(env, state_id, texts):
    """Play ``texts`` from ``state_id``, then tool-less turns until a budget ends it."""
    pending = iter(texts)
    end = run_episode(env, lambda _: Completion(next(pending, "Waiting."), 1), state_id=state_id)
    return end


@pytest.fixture(scope="module")
def both_ways(toy, toy_bank):
    """A stage row's demonstration played as stored (finish) and without its finish turn."""
    hermes = get_protocol("hermes")
    row = next(
        r for r in map(toy_bank.get, toy_bank.select(focus="S2"))
        if (turns := load_demonstration(toy_bank.store, r))
        and [c.name for c in hermes.parse(turns[-1].text).calls] == ["finish"]
    )  # fmt: skip
    texts = [t.text for t in load_demonstration(toy_bank.store, row)]
    budgets = toy.spec.budgets.model_copy(update={"max_turns": MAX_TURNS})
    env = RubricReward(StageEnv("E2E", benchmark=toy, states=toy_bank, budgets=budgets))
    try:
        return row.state_id, play(env, row.state_id, texts), play(env, row.state_id, texts[:-1])
    finally:
        env.close()


def as_rollout(state_id, end):
    """The episode as the trainer receives it (the token fields do not matter here)."""
    return EpisodeResult(
        state_id=state_id, prompt_ids=[1], response_ids=[2, 3], response_mask=[1, 1],
        response_logprobs=None, reward=float(end.reward), verdict=None, num_turns=end.turns,
        num_replies=0, stop_reason="terminated" if end.terminated else "truncated", messages=[],
    )  # fmt: skip


def config(tmp_path, **kw):
    return GRPOConfig(
        model=str(tmp_path / "m"), output_dir=str(tmp_path / "o"), benchmark="toy_pipeline",
        state_ids=("s",), **kw,
    )  # fmt: skip


def test_the_rubric_pays_a_stage_row_the_same_whether_or_not_it_finishes(both_ways):
    # The hazard itself: the reward of the env is blind to the finish call.
    _, finished, unfinished = both_ways
    assert finished.terminated and finished.info["stop_reason"] == "finished"
    assert unfinished.truncated and unfinished.info["stop_reason"] == "turn_budget"
    assert unfinished.turns == MAX_TURNS
    assert finished.reward == unfinished.reward > 0


def test_grpo_ranks_the_finished_episode_above_the_same_work_unfinished(both_ways, tmp_path):
    state_id, finished, unfinished = both_ways
    group = [as_rollout(state_id, e) for e in (finished, unfinished, finished, unfinished)]
    batch = train_batch(group, config(tmp_path))  # the default: unfinished="penalize"
    # A = r' - mean(r'), r' = r - 0.25 for the unfinished ones  -> (+0.125, -0.125, ...)
    assert batch.advantages.tolist() == pytest.approx([0.125, -0.125, 0.125, -0.125])
    # Without the penalty the group is uniform: no gradient toward finishing at all.
    kept = train_batch(group, config(tmp_path, unfinished="keep"))
    assert kept.advantages.tolist() == pytest.approx([0.0] * 4)


def test_only_an_env_budget_is_unfinished(tmp_path):
    # A token limit is the overlong setting's; a finished episode is never penalised.
    cfg = config(tmp_path, unfinished_penalty=0.5, overlong="keep")
    ends = {"terminated": 1.0, "truncated": 0.5, "length": 1.0}
    for stop, want in ends.items():
        r = EpisodeResult(
            state_id="s", prompt_ids=[1], response_ids=[2], response_mask=[1],
            response_logprobs=None, reward=1.0, verdict=None, num_turns=1, num_replies=0,
            stop_reason=stop, messages=[],
            length_limit="turn" if stop == "length" else None,
        )  # fmt: skip
        assert shaped_reward(r, cfg) == pytest.approx(want), stop
    with pytest.raises(ValueError, match="unfinished_penalty"):
        config(tmp_path, unfinished_penalty=-0.1)


def test_the_step_metrics_show_the_finish_rate_per_pool(both_ways):
    state_id, finished, unfinished = both_ways
    rollouts = [as_rollout(state_id, e) for e in (finished, unfinished, unfinished)]
    m = rollout_metrics(rollouts, ["target", "target", "e2e"], Dist())
    assert m["finished"] == pytest.approx(1 / 3)
    assert m["finished_by_pool"] == {"target": 0.5, "e2e": 0.0}
    assert m["budget_cut"] == pytest.approx(2 / 3)


def test_by_default_no_unfinished_episode_ranks_with_a_finished_one(tmp_path):
    # Masking the episodes a token limit cut let turns grow until the limit cut them
    # (skill_ladder S3: cut share 0.03 -> 0.56 in 10 steps), since a cut episode was never
    # pushed down while a wrong finished one was; by default each way of not finishing
    # now costs reward, and every rollout stays in the update.
    cfg = config(tmp_path)
    group = []
    for stop in ("terminated", "truncated", "length"):
        group.append(
            EpisodeResult(
                state_id="s",
                prompt_ids=[1],
                response_ids=[2],
                response_mask=[1],
                response_logprobs=None,
                reward=1.0,
                verdict=None,
                num_turns=1,
                num_replies=0,
                stop_reason=stop,
                messages=[],
                length_limit="turn" if stop == "length" else None,
            )  # fmt: skip
        )
    shaped = [shaped_reward(r, cfg) for r in group]
    assert shaped[0] > shaped[1] > shaped[2]
    batch = train_batch(group, cfg)
    assert len(batch.rollouts) == 3 and batch.advantages[0] > 0 > batch.advantages[2]
