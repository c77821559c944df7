"""The Runner: env slots, the one retry rule, threads and coroutines."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from bat_gym.core.errors import ConfigError, EnvLost, SandboxCrashed
from bat_gym.policies import PolicyError
from bat_gym.rollout import Runner, SandboxRestarted


class Env:
    """A stand-in env that only counts its lives."""

    ids = itertools.count()

    def __init__(self) -> None:
        self.id = next(Env.ids)
        self.closed = False

    def close(self) -> None:
        self.closed = True


def failing(errors: list[Exception], value: str = "played"):
    """A play function raising ``errors`` one per call, then returning ``value``."""
    seen: list[Env] = []

    def play(env: Env) -> str:
        seen.append(env)
        if errors:
            raise errors.pop(0)
        return value

    return play, seen


@pytest.mark.parametrize(
    "error", [EnvLost("actor died"), SandboxRestarted(2), PolicyError("503"), SandboxCrashed("x")]
)
def test_infrastructure_is_played_again_and_counted_never_a_failure(error):
    runner = Runner(Env, workers=1, max_attempts=3)
    play, _ = failing([error])
    played = runner.attempt(play)
    runner.close()
    assert (played.value, played.attempts, played.error) == ("played", 2, None)


def test_after_max_attempts_the_last_error_is_the_answer():
    runner = Runner(Env, workers=1, max_attempts=2)
    play, seen = failing([PolicyError("one"), PolicyError("two"), PolicyError("three")])
    played = runner.attempt(play)
    assert played.attempts == 2 and str(played.error) == "two" and len(seen) == 2
    play, _ = failing([EnvLost("one"), EnvLost("two")])
    with pytest.raises(EnvLost, match="two") as caught:
        runner.run(play)
    assert "played 2 time(s)" in caught.value.__notes__[0]
    runner.close()


def test_an_error_playing_again_cannot_fix_ends_the_episode_at_once():
    runner = Runner(Env, workers=1, max_attempts=3)
    play, seen = failing([KeyError("bug")])
    played = runner.attempt(play)
    assert played.attempts == 1 and isinstance(played.error, KeyError) and len(seen) == 1
    runner.close()


def test_a_sandbox_error_replaces_the_env_the_others_keep_it():
    runner = Runner(Env, workers=1, max_attempts=3)
    play, seen = failing([SandboxCrashed("gone"), PolicyError("503")])
    runner.attempt(play)
    assert seen[0] is not seen[1] and seen[0].closed  # rebuilt after the sandbox error
    assert seen[1] is seen[2] and not seen[1].closed  # kept after the policy error
    runner.close()
    assert seen[2].closed


def test_map_keeps_the_order_of_the_jobs_and_builds_at_most_one_env_per_worker():
    runner = Runner(Env, workers=3)
    out = runner.map(lambda job: runner.run(lambda env: (job, env.id)), range(12))
    assert [job for job, _ in out] == list(range(12))
    assert len({env for _, env in out}) <= 3 and len(runner.envs()) <= 3
    runner.close()


def test_coroutines_get_the_same_rule():
    runner = Runner(Env, workers=1, max_attempts=3)
    errors = [EnvLost("actor died")]

    async def play(env: Env) -> int:
        if errors:
            raise errors.pop()
        return env.id

    played = asyncio.run(runner.arun(play))
    assert played.attempts == 2 and played.error is None
    runner.close()


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="workers"):
        Runner(Env, workers=0)
    with pytest.raises(ConfigError, match="max_attempts"):
        Runner(Env, workers=1, max_attempts=0)


def test_an_env_on_a_ray_actor_is_kept_its_pool_renews_the_actor():
    from bat_gym.distributed import ActorEnv

    class ViewOfAnActor(ActorEnv):
        def __init__(self) -> None:  # no pool needed: the runner only keeps or closes it
            self.id = next(Env.ids)

    built: list[ViewOfAnActor] = []
    runner = Runner(lambda: built.append(ViewOfAnActor()) or built[-1], workers=1, max_attempts=2)
    play, seen = failing([SandboxCrashed("gone")])
    assert runner.attempt(play).attempts == 2
    assert len(built) == 1 and seen[0] is seen[1]
    runner.close()
