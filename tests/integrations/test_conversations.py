"""Finding the start state and turn of a conversation (what serve-policy's scripts replay)."""

from __future__ import annotations

import pytest

from bat_gym.core.errors import StateNotFound
from bat_gym.integrations.conversations import (
    AmbiguousConversation,
    ConversationStates,
    UnknownConversation,
)


@pytest.fixture(scope="module")
def index(toy_bank):
    return ConversationStates([toy_bank.get(i) for i in toy_bank.select()])


@pytest.fixture(scope="module")
def row(toy_bank):
    """A stage row with a stored history (earlier stages' calls and results)."""
    return toy_bank.get(toy_bank.select(focus="S3")[0])


def _turn(n: int) -> list[dict]:
    call = {"id": f"c{n}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"c{n}", "content": "ok"},
    ]


def test_a_stage_row_is_found_from_its_opening_and_the_turn_counted(index, row):
    messages = [dict(m) for m in row.messages]
    placed = index.place(messages)
    assert (placed.state.state_id, placed.turn, placed.matched_by) == (row.state_id, 0, "opening")
    # Two steps later, one of them refused (no call read: an assistant message and the
    # env's error as a user message): the env's info["turns"] is 2.
    refused = [
        {"role": "assistant", "content": "no call here"},
        {"role": "user", "content": "[tool call error] No tool call found"},
    ]
    assert index.place(messages + _turn(0) + refused).turn == 2


def test_a_replaced_system_prompt_falls_back_to_the_user_messages(index, row):
    messages = [{"role": "system", "content": "You are a helpful agent."}]
    messages += [dict(m) for m in row.messages[1:]]
    placed = index.place(messages)
    assert placed.state.state_id == row.state_id and placed.matched_by == "user_messages"


def test_developer_role_and_content_parts_read_as_the_env_writes_them(index, row):
    system, user, *rest = (dict(m) for m in row.messages)
    messages = [
        {"role": "developer", "content": system["content"]},
        {"role": "user", "content": [{"type": "text", "text": user["content"]}]},
        *rest,
    ]
    assert index.place(messages).matched_by == "opening"


def test_an_explicit_id_wins_and_an_unknown_one_lists_the_held_ids(index, row, toy_bank):
    other = toy_bank.get(toy_bank.select(focus="E2E")[0])
    placed = index.place([dict(m) for m in other.messages], state_id=other.state_id)
    assert (placed.state.state_id, placed.matched_by) == (other.state_id, "state_id")
    with pytest.raises(StateNotFound, match=row.state_id):
        index.place([dict(m) for m in row.messages], state_id="nope")


def test_e2e_openings_are_shared_by_a_tracks_tasks(index, toy_bank):
    state = toy_bank.get(toy_bank.select(focus="E2E")[0])
    same_track = toy_bank.select(focus="E2E", track=state.track)
    found = index.placements([dict(m) for m in state.messages])
    assert sorted(p.state.state_id for p in found) == sorted(same_track)
    with pytest.raises(AmbiguousConversation, match="state_id") as caught:
        index.place([dict(m) for m in state.messages])
    assert set(caught.value.state_ids) == set(same_track)


def test_a_conversation_of_no_state_is_unknown(index):
    with pytest.raises(UnknownConversation, match="metadata"):
        index.place([{"role": "user", "content": "hello"}])
    with pytest.raises(UnknownConversation, match="no user message"):
        index.place([{"role": "system", "content": "x"}])


def test_a_conversation_shorter_than_the_rows_history_is_unknown(index, row):
    opening = [dict(m) for m in row.messages if m["role"] in ("system", "user")]
    with pytest.raises(UnknownConversation, match="fewer assistant messages"):
        index.place(opening)
