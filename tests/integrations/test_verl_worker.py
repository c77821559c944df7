"""verl's own AgentLoopWorker runs BatAgentLoop, as verl's trainer does (CPU, no server).

The worker is verl's: it reads the agent loop config file this project writes, builds
the loop with hydra from verl's own composed trainer config, runs a batch of dataset
rows through it, and pads the outputs into the DataProto verl trains on. Only the LLM
server is a stand-in: it samples the scripted teacher's turns as tokens. The rewards
must be the in-process env's for the same calls, and the response mask 1 on exactly the
sampled tokens. Runs where verl is installed (bash .ci/venv-verl.sh).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip(
    "verl.experimental.agent_loop.agent_loop",
    reason="verl is not installed here: bash .ci/venv-verl.sh runs this",
    exc_type=ImportError,
)

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from bat_gym.core.protocol import get_protocol  # noqa: E402
from bat_gym.integrations.verl import agent_loop_config, verl_dataset  # noqa: E402
from bat_gym.rollout.chat_tokens import render_ids  # noqa: E402

LOGPROB = -0.125


class TeacherTokens:
    """verl's LLM server client, sampling the teacher's turns of whichever state a request's
    first prompt is: one script per request id, as verl keeps an episode on one server."""

    def __init__(self, scripts) -> None:
        self.scripts = scripts  # prompt ids -> ScriptedTokens
        self.by_request: dict[str, object] = {}

    async def generate(self, request_id, *, prompt_ids, sampling_params, **_):
        gen = self.by_request.get(request_id)
        if gen is None:
            gen = self.by_request[request_id] = self.scripts[tuple(prompt_ids)]
        tokens = gen(prompt_ids)
        return SimpleNamespace(
            token_ids=tokens,
            log_probs=[LOGPROB] * len(tokens),
            routed_experts=None,
            num_preempted=None,
            extra_fields={},
            stop_reason=None,
        )


def _trainer_config(model_dir: Path, agent_yaml: Path):
    import verl.trainer.config
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(
        config_dir=str(Path(verl.trainer.config.__file__).parent), version_base=None
    ):
        return compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.mode=async",
                "actor_rollout_ref.rollout.prompt_length=4096",
                "actor_rollout_ref.rollout.response_length=4096",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_yaml}",
            ],
        )


def test_verls_agent_loop_worker_plays_bank_states_as_the_env_scores_them(
    toy, toy_bank, tiny_model_dir, helpers, tmp_path
):
    from transformers import AutoTokenizer
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    state_ids = [toy_bank.select(focus=f, track="threshold")[0] for f in ("E2E", "S3", "S5")]
    scripts, native = {}, []
    for state_id in state_ids:
        env = gym.make("bat/E2E-v0", benchmark=toy, states=toy_bank)
        _, info = env.reset(options={"state_id": state_id})
        env.close()
        prompt = render_ids(tokenizer, info["messages"], info["tools"], add_generation_prompt=True)
        actions = helpers.script(toy, toy_bank.get(state_id), "teacher")
        scripts[tuple(prompt)] = helpers.ScriptedTokens(tokenizer, actions)
        calls = [c for a in actions for c in get_protocol("hermes").parse(a).calls]
        native.append(helpers.play_in_process(toy, toy_bank, state_id, calls)[0])

    agent_yaml = agent_loop_config(
        tmp_path / "agent.yaml",
        env="bat/E2E-v0",
        env_kwargs={"benchmark": "toy_pipeline", "states": str(toy_bank.root)},
    )
    worker = AgentLoopWorker(
        _trainer_config(tiny_model_dir, agent_yaml), llm_client=TeacherTokens(scripts)
    )
    rows = [dict(r) for r in verl_dataset(toy_bank, state_ids=state_ids)]
    batch = DataProto(
        batch=None,
        non_tensor_batch={
            "agent_name": np.array([r["agent_name"] for r in rows], dtype=object),
            "raw_prompt": np.array([r["prompt"] for r in rows], dtype=object),
            "extra_info": np.array([r["extra_info"] for r in rows], dtype=object),
            "index": np.array([r["extra_info"]["index"] for r in rows], dtype=object),
        },
        meta_info={},
    )
    out = asyncio.run(worker.generate_sequences(batch))

    assert list(out.non_tensor_batch["state_id"]) == state_ids
    rewards = out.batch["rm_scores"].sum(-1).tolist()
    assert rewards == pytest.approx(native, abs=1e-9)
    assert min(native) > 0.9  # the teacher wins each row: the comparison means something
    width = out.batch["prompts"].shape[1]
    for i, state_id in enumerate(state_ids):
        # The row's prompt (left-padded) names the script that played it.
        prompt = out.batch["prompts"][i][out.batch["attention_mask"][i][:width].bool()]
        gen = scripts[tuple(prompt.tolist())]
        mask = out.batch["response_mask"][i].bool()
        assert out.batch["responses"][i][mask].tolist() == [t for turn in gen.turns for t in turn]
        assert torch.all(out.batch["rollout_log_probs"][i][mask] == LOGPROB), state_id
        # The env's replies sit between the turns, in the response but masked out.
        assert int(out.batch["attention_mask"][i][width:].sum()) > int(mask.sum()), state_id
