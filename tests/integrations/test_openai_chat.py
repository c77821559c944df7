"""The chat-completions wire format of serve-policy, against the project's own client side."""

from __future__ import annotations

import json

import pytest

from bat_gym.core.protocol import ToolCall, get_protocol
from bat_gym.integrations.openai_chat import ChatRequestError, chat_completion, request_messages
from bat_gym.policies import PolicyOutput
from bat_gym.policies.openai_policy import OpenAIPolicy

HERMES = get_protocol("hermes")


def test_every_teacher_turn_comes_back_through_the_client_as_the_text_it_was(
    toy, toy_bank, helpers
):
    client = OpenAIPolicy("http://127.0.0.1:9/v1", "teacher")  # no request is sent
    state = toy_bank.get(toy_bank.select(focus="E2E")[0])
    texts = helpers.teacher_actions(toy, state)
    for turn, text in enumerate(texts):
        reply = chat_completion(PolicyOutput(text), HERMES, model="teacher", turn=turn)
        assert reply["choices"][0]["finish_reason"] == "tool_calls"
        assert client._output(reply).text == text


def test_a_reply_without_a_readable_call_is_plain_content():
    broken = '<tool_call>{"name": "execute_code", "arguments": </tool_call>'
    reply = chat_completion(PolicyOutput(broken), HERMES, model="m", turn=0)
    choice = reply["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": broken}
    assert choice["finish_reason"] == "stop"
    cut = chat_completion(PolicyOutput("a", finish_reason="length"), HERMES, model="m", turn=0)
    assert cut["choices"][0]["finish_reason"] == "length"


def test_calls_get_ids_by_turn_and_usage_only_when_counted():
    text = HERMES.render("", [ToolCall(name="finish", arguments={"summary": "x"})] * 2)
    reply = chat_completion(PolicyOutput(text), HERMES, model="m", turn=3)
    calls = reply["choices"][0]["message"]["tool_calls"]
    assert [c["id"] for c in calls] == ["call_3_0", "call_3_1"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"summary": "x"}
    assert reply["choices"][0]["message"]["content"] is None
    assert "usage" not in reply  # a scripted reply counts no tokens: the env counts them
    counted = PolicyOutput(text, prompt_token_ids=[1, 2, 3], token_ids=[4, 5])
    assert chat_completion(counted, HERMES, model="m", turn=0)["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 2,
        "total_tokens": 5,
    }


def test_request_messages_read_content_parts_and_refuse_a_message_without_a_role():
    parts = [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]
    assert request_messages({"messages": [{"role": "user", "content": parts}]}) == [
        {"role": "user", "content": "ab"}
    ]
    with pytest.raises(ChatRequestError, match="role"):
        request_messages({"messages": [{"content": "x"}]})
    with pytest.raises(ChatRequestError, match="non-empty"):
        request_messages({"messages": []})
