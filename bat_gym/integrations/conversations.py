"""Which start state an OpenAI chat conversation is an episode of, and at which turn.

A scripted policy (the benchmark's teacher or naive baseline) replays the script of the
state its episode started from, so a server that runs one behind
``/v1/chat/completions`` must recover that state from the request. The rules, tried in
order:

1. **An explicit id** (the server reads it from the request's ``metadata.state_id``,
   its URL or its ``user`` field). An id not held is an error naming the ids held.
2. **The opening**: the system and user messages before the first assistant message,
   role and text in order (``developer`` reads as ``system``), equal the state's own.
3. **The user messages of the opening alone**, for a harness that replaces or drops
   the system prompt.

When several states share an opening (the tasks of one track: their data is in their
files, not their prompt), those whose stored history (assistant tool calls and tool
results) continues the conversation's opening are kept, the longest histories only.
:meth:`ConversationStates.placements` returns all that are left;
:meth:`ConversationStates.place` insists on one.

The turn is the number of assistant messages in the conversation beyond those of the
state's stored history: exactly ``info["turns"]`` of the env that is playing it, since
every step, accepted or refused, adds one assistant message.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bat_gym.core.errors import BatGymError, StateNotFound
from bat_gym.core.spec import StageState

__all__ = [
    "AmbiguousConversation",
    "ConversationStates",
    "Placement",
    "UnknownConversation",
    "message_text",
]

MatchedBy = Literal["state_id", "opening", "user_messages"]

_OPENING_ROLES = {"system": "system", "developer": "system", "user": "user"}


class UnknownConversation(BatGymError, LookupError):
    """A conversation that is the episode of no state the server holds.

    Attributes:
        reason: what did not match.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(
            f"{reason}. A scripted policy replays the script of the state the episode "
            "started from: serve the states the episode starts from (--bank PATH, or "
            "--benchmark NAME for its held-out states), or name the state in the request "
            '(metadata: {"state_id": ID})'
        )


class AmbiguousConversation(UnknownConversation):
    """A conversation that is the episode of several states alike.

    Attributes:
        state_ids: the states it could be an episode of.
    """

    def __init__(self, state_ids: Sequence[str]) -> None:
        self.state_ids = tuple(state_ids)
        shown = ", ".join(self.state_ids[:8]) + (" ..." if len(self.state_ids) > 8 else "")
        super().__init__(f"the conversation opens like {len(self.state_ids)} states ({shown})")


@dataclass(frozen=True)
class Placement:
    """Where a conversation stands: its start state and the turn it asks for.

    Attributes:
        state: the start state of the episode.
        turn: assistant turns already taken in the episode (0: its first).
        matched_by: which rule found the state (see the module doc).
    """

    state: StageState
    turn: int
    matched_by: MatchedBy


def message_text(content: Any) -> str:
    """A message's text: a string as it is, the text parts of a list, ``""`` for None."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return str(content)


def _opening(messages: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, str], ...]:
    """(role, text) of the system and user messages before the first assistant message."""
    out = []
    for m in messages:
        role = _role(m)
        if role not in ("system", "user"):
            break
        out.append((role, message_text(m.get("content")).strip()))
    return tuple(out)


def _users(opening: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    return tuple(text for role, text in opening if role == "user")


def _calls(message: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """A message's tool calls as (name, decoded arguments): what two renderings share."""
    out = []
    for call in message.get("tool_calls") or []:
        fn = (call or {}).get("function") or {}
        args = fn.get("arguments")
        if isinstance(args, str):
            with contextlib.suppress(json.JSONDecodeError):  # compared as the text it is
                args = json.loads(args)
        out.append((str(fn.get("name")), args))
    return out


def _same_message(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two messages say the same: text (stripped) and tool calls (decoded)."""
    text_a, text_b = message_text(a.get("content")), message_text(b.get("content"))
    return text_a.strip() == text_b.strip() and _calls(a) == _calls(b)


def _role(message: Mapping[str, Any]) -> str:
    role = str(message.get("role"))
    return _OPENING_ROLES.get(role, role)


def _starts_with(
    messages: Sequence[Mapping[str, Any]], history: Sequence[Mapping[str, Any]]
) -> bool:
    """Whether ``messages`` begins with ``history``: roles, texts and tool calls alike."""
    if len(messages) < len(history):
        return False
    return all(
        _role(got) == _role(want) and _same_message(got, want)
        for got, want in zip(messages, history, strict=False)
    )


def _assistant_turns(messages: Sequence[Mapping[str, Any]]) -> int:
    return sum(1 for m in messages if m.get("role") == "assistant")


class ConversationStates:
    """The states a server holds, indexed by how their episodes' conversations open.

    Args:
        states: the start states, e.g. every row of a Stage Bank and the held-out E2E
            start states of a benchmark. Ids must be unique.

    Raises:
        ValueError: two states share an id.
    """

    def __init__(self, states: Sequence[StageState]) -> None:
        self._by_id: dict[str, StageState] = {}
        self._by_opening: dict[tuple[tuple[str, str], ...], list[StageState]] = {}
        self._by_users: dict[tuple[str, ...], list[StageState]] = {}
        for state in states:
            if state.state_id in self._by_id:
                raise ValueError(f"two states have the id {state.state_id!r}")
            self._by_id[state.state_id] = state
            opening = _opening(state.messages)
            self._by_opening.setdefault(opening, []).append(state)
            self._by_users.setdefault(_users(opening), []).append(state)

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, state_id: object) -> bool:
        return state_id in self._by_id

    @property
    def state_ids(self) -> list[str]:
        """The ids of the states held, sorted."""
        return sorted(self._by_id)

    def get(self, state_id: str) -> StageState:
        """The state with this id.

        Raises:
            StateNotFound: no state held has it (the message lists some that are).
        """
        try:
            return self._by_id[state_id]
        except KeyError:
            raise StateNotFound(state_id, self.state_ids[:50]) from None

    def place(
        self, messages: Sequence[Mapping[str, Any]], state_id: str | None = None
    ) -> Placement:
        """The one start state and turn of the episode ``messages`` is (see the module doc).

        Raises:
            StateNotFound: ``state_id`` names no state held.
            UnknownConversation: no state fits ``messages``.
            AmbiguousConversation: several states fit alike.
        """
        found = self.placements(messages, state_id)
        if len(found) > 1:
            raise AmbiguousConversation([p.state.state_id for p in found])
        return found[0]

    def placements(
        self, messages: Sequence[Mapping[str, Any]], state_id: str | None = None
    ) -> list[Placement]:
        """Every start state (with its turn) that ``messages`` may be an episode of.

        More than one when states share an opening and their stored histories do not
        tell them apart (the E2E states of one track's tasks: the task's data is in its
        files, not its prompt); a scripted server may still answer when all of them
        give the same reply.

        Args:
            messages: the conversation, OpenAI chat format, up to the turn asked for.
            state_id: an explicit state id (rule 1); None: found from the messages.

        Raises:
            StateNotFound: ``state_id`` names no state held.
            UnknownConversation: no state's episode opens like ``messages``, or the
                conversation is shorter than the state's stored history.
        """
        if state_id is not None:
            return [self._placed(self.get(state_id), messages, "state_id")]
        opening = _opening(messages)
        if not any(role == "user" for role, _ in opening):
            raise UnknownConversation(
                "the conversation has no user message before its first assistant message"
            )
        found = self._by_opening.get(opening)
        matched_by: MatchedBy = "opening"
        if not found:
            found, matched_by = self._by_users.get(_users(opening)), "user_messages"
        if not found:
            first = _users(opening)[0]
            raise UnknownConversation(
                f"the conversation opens like none of the {len(self)} states held (its "
                f"first user message begins {first[:120]!r})"
            )
        placed, errors = [], []
        for state in _best_fits(found, messages):
            try:
                placed.append(self._placed(state, messages, matched_by))
            except UnknownConversation as exc:  # a history longer than the conversation
                errors.append(exc)
        if not placed:
            raise errors[0]
        return placed

    @staticmethod
    def _placed(
        state: StageState, messages: Sequence[Mapping[str, Any]], matched_by: MatchedBy
    ) -> Placement:
        turn = _assistant_turns(messages) - _assistant_turns(state.messages)
        if turn < 0:
            raise UnknownConversation(
                f"the conversation has fewer assistant messages than the stored history of "
                f"state {state.state_id} ({_assistant_turns(state.messages)}), so it cannot "
                "be an episode started from it"
            )
        return Placement(state=state, turn=turn, matched_by=matched_by)


def _best_fits(found: list[StageState], messages: Sequence[Mapping[str, Any]]) -> list[StageState]:
    """The states of ``found`` whose stored history follows the conversation's opening.

    Only the longest such histories are kept. All of ``found`` when none does (a harness that re-renders the history).
    """
    if len(found) == 1:
        return found
    after = messages[len(_opening(messages)) :]
    fits = [s for s in found if _starts_with(after, s.messages[len(_opening(s.messages)) :])]
    if not fits:
        return found
    longest = max(len(s.messages) for s in fits)
    return [s for s in fits if len(s.messages) == longest]
