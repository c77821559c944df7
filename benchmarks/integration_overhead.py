"""What the trainer adapters' token bookkeeping costs, next to stepping the env alone.

Plays the toy_pipeline teacher's E2E episodes (every turn a tool call, then ``finish``)
twice per state: through the native env API (``reset`` + ``step`` with the text), and
through :class:`~bat_gym.rollout.TokenEpisode` with a generator that returns the
same turns as tokens, so the difference is the adapter's own work: rendering the
prompt, decoding each turn, and rendering each reply as a chat-template delta (two
renders of the whole conversation per turn, so it grows with the conversation).

A tiny byte-level BPE tokenizer with the Qwen-style tool template is built on the spot;
nothing is downloaded.

Usage: python benchmarks/integration_overhead.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import gymnasium as gym

from bat_gym.bank import build_bank
from bat_gym.catalog import get_benchmark
from bat_gym.core.protocol import get_protocol
from bat_gym.policies import EpisodeContext, PolicyRequest, ScriptedPolicy
from bat_gym.rollout import TokenEpisode
from bat_gym.trainers.tiny_model import build_tokenizer


def teacher_turns(bench, state) -> list[str]:
    policy = ScriptedPolicy("teacher")
    turns = []
    for turn in range(64):
        text = policy.act(PolicyRequest([], [], EpisodeContext(bench, state, turn))).text
        turns.append(text)
        if any(c.name == "finish" for c in get_protocol("hermes").parse(text).calls):
            return turns
    raise RuntimeError("the teacher never finishes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="episodes per state and path")
    args = parser.parse_args()

    bench = get_benchmark("toy_pipeline")
    with tempfile.TemporaryDirectory() as tmp:
        bank = build_bank(bench, Path(tmp) / "bank", tasks_per_track=2)
        states = [bank.get(i) for i in bank.select(focus="E2E")]
        scripts = {s.state_id: teacher_turns(bench, s) for s in states}
        corpus = [str(m.get("content") or "") for s in states for m in s.messages]
        corpus += [t for turns in scripts.values() for t in turns]
        tok = build_tokenizer(corpus, Path(tmp) / "tok", vocab_size=1024)
        eos = tok.eos_token_id
        env = gym.make("bat/E2E-v0", benchmark=bench, states=bank)
        native, adapter, tokens = [], [], []
        try:
            for _ in range(args.repeats):
                for state in states:
                    turns = scripts[state.state_id]
                    t0 = time.perf_counter()
                    env.reset(options={"state_id": state.state_id})
                    for text in turns:
                        env.step(text)
                    native.append(time.perf_counter() - t0)

                    encoded = iter([tok.encode(t, add_special_tokens=False) + [eos] for t in turns])
                    t0 = time.perf_counter()
                    result = TokenEpisode(env, tok).run(
                        lambda ctx, n, it=encoded: next(it), state_id=state.state_id
                    )
                    adapter.append(time.perf_counter() - t0)
                    tokens.append(len(result.prompt_ids) + len(result.response_ids))
        finally:
            env.close()

    turns_per_episode = statistics.mean(len(t) for t in scripts.values())
    n_med, a_med = statistics.median(native), statistics.median(adapter)
    print(
        f"E2E episodes: {len(native)} per path, {turns_per_episode:.1f} turns, "
        f"{statistics.mean(tokens):.0f} tokens each (median)"
    )
    print(f"native env   : {n_med * 1e3:8.1f} ms / episode")
    print(f"TokenEpisode : {a_med * 1e3:8.1f} ms / episode")
    print(f"overhead     : {(a_med - n_med) * 1e3 / turns_per_episode:8.2f} ms / turn")


if __name__ == "__main__":
    main()
