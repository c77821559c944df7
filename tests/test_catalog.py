import subprocess
import sys
import textwrap

import gymnasium as gym
import pytest

from bat_gym.catalog import (
    default_benchmark_name,
    env_ids,
    get_benchmark,
    list_benchmarks,
    register_benchmark,
    unregister_benchmark,
)
from bat_gym.core.errors import BenchmarkNotFound


def run_python(code, **env):
    import os

    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def test_ids_resolve_without_importing_bat_gym():
    # The .pth hook registers the ids when gymnasium is imported, in any process.
    proc = run_python("""
        import sys, gymnasium as gym
        env = gym.make("bat/Plan-v0")
        print(type(env.unwrapped).__name__, env.unwrapped.benchmark.name)
        env.close()
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["StageEnv", "medbench_lite"]


def test_the_start_up_hook_imports_neither_bat_gym_nor_gymnasium():
    # The .pth runs in every interpreter of the environment: it must stay near free
    # until gymnasium is imported (benchmarks/startup_cost.py measures the time).
    proc = run_python("""
        import sys
        print(sorted(m for m in ("bat_gym", "gymnasium") if m in sys.modules))
        print(any(getattr(f, "bat_gym_autoregister", False) for f in sys.meta_path))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["[]", "True"]


def test_the_shipped_suites_arrive_through_their_entry_points():
    assert {"medbench_lite", "toy_pipeline"} <= set(list_benchmarks())
    assert set(env_ids()) <= set(gym.registry)
    assert default_benchmark_name() == "medbench_lite"  # the highest default_priority


@pytest.mark.parametrize("spelling", ["medbench-lite", "MedBench-Lite", "MEDBENCH_LITE"])
def test_a_benchmark_is_found_whatever_its_case_and_dashes(spelling):
    assert get_benchmark(spelling) is get_benchmark("medbench_lite")


def test_unknown_benchmark_suggests_close_names():
    with pytest.raises(BenchmarkNotFound, match="Did you mean 'toy_pipeline'"):
        get_benchmark("toy_pipelin")


def test_a_third_party_benchmark_registers_without_touching_the_core(tmp_path):
    # A package with an entry point in its metadata, as pip would install it.
    pkg = tmp_path / "site"
    (pkg / "mybench").mkdir(parents=True)
    (pkg / "mybench" / "__init__.py").write_text(
        textwrap.dedent("""
        from bat_gym.envs.toy_pipeline.suite import ToyPipeline, SPEC
        class Mine(ToyPipeline):
            spec = SPEC.model_copy(update={"name": "mine", "default_priority": 1000})
        benchmark = Mine()
    """)
    )
    dist = pkg / "mybench-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mybench\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[bat_gym.benchmarks]\nmine = mybench:benchmark\n")
    proc = run_python(
        """
        import gymnasium as gym
        from bat_gym.catalog import list_benchmarks, default_benchmark_name
        env = gym.make("bat/Submit-v0", benchmark="mine")
        print(sorted(list_benchmarks()), default_benchmark_name(), env.unwrapped.benchmark.name)
    """,
        PYTHONPATH=str(pkg),
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        proc.stdout.strip()
        == "['medbench_lite', 'mine', 'radiology', 'skill_ladder', 'toy_pipeline'] mine mine"
    )


def test_register_benchmark_in_process_and_env_var_default(monkeypatch, toy):
    register_benchmark("toy_alias", lambda: toy)
    try:
        with pytest.raises(ValueError, match="calls itself 'toy_pipeline'"):
            get_benchmark("toy_alias")
        with pytest.warns(UserWarning, match="skipping benchmark 'toy_alias'"):
            assert default_benchmark_name() == "medbench_lite"
    finally:
        unregister_benchmark("toy_alias")
    assert "toy_alias" not in list_benchmarks()
    monkeypatch.setenv("BAT_GYM_BENCHMARK", "elsewhere")
    assert default_benchmark_name() == "elsewhere"


def test_a_spawned_async_vector_env_of_four_steps():
    # A spawned worker imports everything afresh and finds its benchmark by name.
    envs = gym.vector.AsyncVectorEnv(
        [lambda: gym.make("bat/Validate-v0", benchmark="toy_pipeline") for _ in range(4)],
        context="spawn",
    )
    try:
        obs, info = envs.reset(seed=0)
        assert len(obs) == 4 and all(o.startswith("[system]") for o in obs)
        action = '<tool_call>{"name": "execute_code", "arguments": {"language": "bash", "code": "echo $((6*7))"}}</tool_call>'
        obs, reward, terminated, truncated, info = envs.step((action,) * 4)
        assert all("42" in o for o in obs)
        assert list(reward) == [0.0] * 4 and not any(terminated) and not any(truncated)
    finally:
        envs.close()
