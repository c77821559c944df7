r"""Tool schemas and the adapters that read tool calls out of an assistant message.

The env's action is the assistant's whole message as text. A :class:`ToolProtocol`
extracts the tool calls from it (and renders calls back into text, for teachers and
SFT rows). Three ship with bat_gym, registered in :data:`PROTOCOLS` (entry point group
``bat_gym.protocols``) like any a package adds:

* ``hermes`` (default): Hermes/Qwen style, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
* ``json``: the message is a JSON object ``{"name": ..., "arguments": ...}`` (or a list
  of them), optionally inside a fenced ```` ```json ```` block;
* ``openai``: the message is an OpenAI assistant message as JSON, with ``tool_calls``
  whose ``function.arguments`` is a JSON string.

Nothing here raises on bad input: problems come back as :attr:`ParsedMessage.error`,
a sentence that says what was wrong and how to write the call instead. That includes
JSON a model (or an adversary) can write but Python cannot hold: nesting deeper than
the interpreter's recursion limit, integers past ``sys.get_int_max_str_digits()``,
arguments nested deeper than :data:`MAX_ARGUMENT_DEPTH`. Lone surrogates (``"\ud800"``)
in decoded strings become U+FFFD, since no process or file can take them.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from bat_gym.core.errors import ProtocolNotFound
from bat_gym.core.plugins import Expect, Registry

__all__ = [
    "EXECUTE_CODE",
    "FINISH",
    "TOOLS",
    "ToolCall",
    "python_call",
    "bash_call",
    "ParsedMessage",
    "ToolProtocol",
    "HermesProtocol",
    "JsonProtocol",
    "OpenAIProtocol",
    "PROTOCOLS",
    "get_protocol",
    "validate_call",
    "clean_text",
    "MAX_ARGUMENT_DEPTH",
]

MAX_ARGUMENT_DEPTH = 16
"""Deepest nesting of lists and objects accepted inside a call's arguments."""


def clean_text(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (a no-op for valid text)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def _raw_decode(text: str, pos: int = 0) -> tuple[Any, int]:
    """``json.JSONDecoder().raw_decode`` that fails only with ``JSONDecodeError``."""
    try:
        return _DECODER.raw_decode(text, pos)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise json.JSONDecodeError("the JSON nests too deeply to read", text, pos) from None
    except ValueError as exc:  # an integer literal past the digit limit
        raise json.JSONDecodeError(f"unreadable value: {exc}", text, pos) from None


def _tame(obj: Any) -> tuple[Any, str | None]:
    """Clean decoded JSON: surrogates replaced, depth checked; (value, error)."""
    # Iterative, since the input came from outside: [(container, key, value, depth)].
    root: list[Any] = [None]
    todo: list[tuple[Any, Any, Any, int]] = [(root, 0, obj, 0)]
    while todo:
        parent, key, value, depth = todo.pop()
        if isinstance(value, str):
            parent[key] = clean_text(value)
        elif isinstance(value, (dict, list)):
            if depth >= MAX_ARGUMENT_DEPTH:
                return None, f"the call nests deeper than {MAX_ARGUMENT_DEPTH} levels"
            if isinstance(value, dict):
                copy: Any = {}
                for k, v in value.items():
                    k = clean_text(k)
                    copy[k] = None
                    todo.append((copy, k, v, depth + 1))
            else:
                copy = [None] * len(value)
                todo.extend((copy, i, v, depth + 1) for i, v in enumerate(value))
            parent[key] = copy
        else:
            parent[key] = value
    return root[0], None


EXECUTE_CODE: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "execute_code",
        "description": (
            "Run code in the task's sandbox and return its exit code and output. Each call is a "
            "fresh process; files in /workspace persist between calls. No network, no package installs."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "language": {"type": "string", "enum": ["python", "bash"]},
                "code": {"type": "string", "description": "The program to run."},
            },
            "required": ["language", "code"],
            "additionalProperties": False,
        },
    },
}

FINISH: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "finish",
        "description": "End the episode: call it when the work asked for is complete.",
        "parameters": {
            "type": "object",
            "properties": {"summary": {"type": "string", "description": "What was done, briefly."}},
            "required": ["summary"],
            "additionalProperties": False,
        },
    },
}

TOOLS: tuple[dict[str, Any], ...] = (EXECUTE_CODE, FINISH)
_DECODER = json.JSONDecoder()


class ToolCall(BaseModel):
    """One parsed call: a tool name and its arguments (a JSON object)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    id: str = ""

    def to_openai(self) -> dict[str, Any]:
        """The call as an OpenAI ``tool_calls`` item."""
        return {
            "id": self.id,
            "type": "function",
            "function": {
                "name": self.name,
                "arguments": json.dumps(self.arguments, ensure_ascii=False),
            },
        }


def python_call(code: str) -> ToolCall:
    """An ``execute_code`` call running python ``code``, stripped, with one final newline.

    What a scripted teacher sends; the code reads in a transcript as it was written.
    """
    return ToolCall(
        name="execute_code", arguments={"language": "python", "code": code.strip() + "\n"}
    )


def bash_call(code: str) -> ToolCall:
    """An ``execute_code`` call running bash ``code``, stripped, with one final newline."""
    return ToolCall(
        name="execute_code", arguments={"language": "bash", "code": code.strip() + "\n"}
    )


class ParsedMessage(BaseModel):
    """What a protocol read from one assistant message."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    content: str = Field("", description="Text outside the tool calls.")
    calls: tuple[ToolCall, ...] = ()
    error: str | None = Field(None, description="Why no call could be read, and how to fix it.")


def _type_ok(value: Any, schema: dict[str, Any]) -> bool:
    expected = schema.get("type")
    checks = {
        "string": str,
        "object": dict,
        "array": list,
        "boolean": bool,
        "integer": int,
        "number": (int, float),
    }
    if expected in checks and not isinstance(value, checks[expected]):
        return False
    return not (expected in ("integer", "number") and isinstance(value, bool))


def validate_call(call: ToolCall, tools: tuple[dict[str, Any], ...] = TOOLS) -> str | None:
    """Check a call against the tool schemas; return what is wrong, or None."""
    by_name = {t["function"]["name"]: t["function"] for t in tools}
    if call.name not in by_name:
        return f"unknown tool {call.name!r}; the tools are {', '.join(sorted(by_name))}."
    params = by_name[call.name]["parameters"]
    props = params.get("properties", {})
    for key in params.get("required", []):
        if key not in call.arguments:
            return f"{call.name}: missing required argument {key!r}."
    for key, value in call.arguments.items():
        if key not in props:
            if params.get("additionalProperties", True) is False:
                return f"{call.name}: unexpected argument {key!r}; it takes {', '.join(sorted(props))}."
            continue
        schema = props[key]
        if not _type_ok(value, schema):
            return f"{call.name}: argument {key!r} must be a {schema['type']}, got {type(value).__name__}."
        if "enum" in schema and value not in schema["enum"]:
            allowed = ", ".join(repr(v) for v in schema["enum"])
            return f"{call.name}: argument {key!r} must be one of {allowed}; got {value!r}."
    return None


def _call_from_obj(obj: Any, where: str) -> ToolCall | str:
    obj, error = _tame(obj)
    if error is not None:
        return f"{where}: {error}."
    if not isinstance(obj, dict):
        return (
            f"{where} must be a JSON object with 'name' and 'arguments', got {type(obj).__name__}."
        )
    name = obj.get("name")
    if not isinstance(name, str):
        return f"{where} has no string 'name'."
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        text = args.strip()
        try:
            args, end = _raw_decode(text)
            if end != len(text):
                raise json.JSONDecodeError("extra data", text, end)
            args, error = _tame(args)
            if error is not None:
                return f"{where}: {error}."
        except json.JSONDecodeError as exc:
            return f"{where}: 'arguments' is a string that is not valid JSON ({exc.msg} at char {exc.pos})."
    if not isinstance(args, dict):
        return f"{where}: 'arguments' must be a JSON object, got {type(args).__name__}."
    return ToolCall(name=name, arguments=args)


class ToolProtocol(ABC):
    """Reads tool calls from assistant text and writes them back."""

    name: ClassVar[str]
    example: ClassVar[str]
    """A one-line example call, used in error messages and system prompts."""

    @abstractmethod
    def parse(self, message: str) -> ParsedMessage:
        """Extract the calls in ``message``; problems go in ``error``."""

    @abstractmethod
    def render(self, content: str, calls: list[ToolCall] | tuple[ToolCall, ...]) -> str:
        """Write an assistant message holding ``content`` and ``calls``."""

    def no_call_error(self) -> str:
        """The message for a reply that holds no tool call."""
        return f"No tool call found in your message. Call a tool like this: {self.example}"


class HermesProtocol(ToolProtocol):
    """``<tool_call>{json}</tool_call>`` blocks, as in Hermes and Qwen chat templates.

    The JSON is decoded first and the closing tag looked for after it, so code that
    contains the text ``</tool_call>`` inside a string does not end the block early.
    """

    name = "hermes"
    example = '<tool_call>{"name": "execute_code", "arguments": {"language": "bash", "code": "ls"}}</tool_call>'
    _OPEN, _CLOSE = "<tool_call>", "</tool_call>"

    def parse(self, message: str) -> ParsedMessage:  # noqa: D102
        starts = [m.start() for m in re.finditer(re.escape(self._OPEN), message)]
        if not starts:
            return ParsedMessage(content=message.strip(), error=self.no_call_error())
        calls: list[ToolCall] = []
        kept: list[str] = []
        cursor = 0
        for i, start in enumerate(starts, 1):
            if start < cursor:  # inside an earlier call's JSON
                continue
            where = f"tool call {i}" if len(starts) > 1 else "the tool call"
            kept.append(message[cursor:start])
            pos = start + len(self._OPEN)
            while pos < len(message) and message[pos].isspace():
                pos += 1
            try:
                obj, end = _raw_decode(message, pos)
            except json.JSONDecodeError as exc:
                return ParsedMessage(
                    content=message,
                    error=f"{where} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}). Write: {self.example}",
                )
            close = message.find(self._CLOSE, end)
            if close < 0 or message[end:close].strip():
                return ParsedMessage(
                    content=message,
                    error=f"{where} has no closing {self._CLOSE} tag after its JSON. Write: {self.example}",
                )
            call = _call_from_obj(obj, where)
            if isinstance(call, str):
                return ParsedMessage(content=message, error=call)
            calls.append(call)
            cursor = close + len(self._CLOSE)
        kept.append(message[cursor:])
        return ParsedMessage(content="".join(kept).strip(), calls=tuple(calls))

    def render(self, content: str, calls: list[ToolCall] | tuple[ToolCall, ...]) -> str:  # noqa: D102
        parts = [content.strip()] if content.strip() else []
        for c in calls:
            body = json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
            parts.append(f"<tool_call>\n{body}\n</tool_call>")
        return "\n".join(parts)


class JsonProtocol(ToolProtocol):
    """The message is a JSON call object or a list of them (a fenced block is fine)."""

    name = "json"
    example = '{"name": "execute_code", "arguments": {"language": "bash", "code": "ls"}}'
    _FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)

    def parse(self, message: str) -> ParsedMessage:  # noqa: D102
        fence = self._FENCE.search(message)
        body = fence.group(1) if fence else message
        content = (message[: fence.start()] + message[fence.end() :]).strip() if fence else ""
        start = min((i for i in (body.find("{"), body.find("[")) if i >= 0), default=-1)
        if start < 0:
            return ParsedMessage(content=message.strip(), error=self.no_call_error())
        try:
            obj, end = _raw_decode(body[start:])
        except json.JSONDecodeError as exc:
            return ParsedMessage(
                content=message,
                error=f"the tool call is not valid JSON ({exc.msg} at char {exc.pos}). Write: {self.example}",
            )
        if not fence:
            content = (body[:start] + body[start + end :]).strip()
        objs = obj if isinstance(obj, list) else [obj]
        calls = []
        for i, o in enumerate(objs, 1):
            call = _call_from_obj(o, f"tool call {i}" if len(objs) > 1 else "the tool call")
            if isinstance(call, str):
                return ParsedMessage(content=message, error=call)
            calls.append(call)
        if not calls:
            return ParsedMessage(content=message, error=self.no_call_error())
        return ParsedMessage(content=content, calls=tuple(calls))

    def render(self, content: str, calls: list[ToolCall] | tuple[ToolCall, ...]) -> str:  # noqa: D102
        objs = [{"name": c.name, "arguments": c.arguments} for c in calls]
        body = json.dumps(objs[0] if len(objs) == 1 else objs, ensure_ascii=False)
        return f"{content.strip()}\n{body}".strip()


class OpenAIProtocol(ToolProtocol):
    """An OpenAI assistant message as JSON: ``{"content": ..., "tool_calls": [...]}``."""

    name = "openai"
    example = (
        '{"content": "", "tool_calls": [{"id": "call_0", "type": "function", "function": '
        '{"name": "execute_code", "arguments": "{\\"language\\": \\"bash\\", \\"code\\": \\"ls\\"}"}}]}'
    )

    def parse(self, message: str) -> ParsedMessage:  # noqa: D102
        try:
            obj, end = _raw_decode(message.strip())
            if end != len(message.strip()):
                raise json.JSONDecodeError("extra data", message.strip(), end)
        except json.JSONDecodeError as exc:
            return ParsedMessage(
                content=message,
                error=f"the message is not an OpenAI message in JSON ({exc.msg} at char {exc.pos}). Write: {self.example}",
            )
        if not isinstance(obj, dict):
            return ParsedMessage(
                content=message, error=f"expected a JSON object. Write: {self.example}"
            )
        content = obj.get("content") or ""
        raw = obj.get("tool_calls") or []
        if not isinstance(raw, list) or not raw:
            return ParsedMessage(content=str(content), error=self.no_call_error())
        calls = []
        for i, item in enumerate(raw, 1):
            fn = item.get("function") if isinstance(item, dict) else None
            call = _call_from_obj(fn, f"tool_calls[{i - 1}].function")
            if isinstance(call, str):
                return ParsedMessage(content=str(content), error=call)
            calls.append(call.model_copy(update={"id": str(item.get("id", ""))}))
        return ParsedMessage(content=str(content), calls=tuple(calls))

    def render(self, content: str, calls: list[ToolCall] | tuple[ToolCall, ...]) -> str:  # noqa: D102
        items = [
            c.model_copy(update={"id": c.id or f"call_{i}"}).to_openai()
            for i, c in enumerate(calls)
        ]
        return json.dumps({"content": content, "tool_calls": items}, ensure_ascii=False)


PROTOCOLS: Registry[type[ToolProtocol]] = Registry(
    "bat_gym.protocols",
    expect=Expect("tool protocol", ToolProtocol, subclass=True, self_name="name"),
    not_found=ProtocolNotFound,
)
"""The tool protocols, by name (entry point group ``bat_gym.protocols``)."""


def get_protocol(name: str | ToolProtocol) -> ToolProtocol:
    """A protocol instance by name (one of :data:`PROTOCOLS`), or ``name`` if it is one.

    Raises:
        ProtocolNotFound: no protocol has that name.
    """
    if isinstance(name, ToolProtocol):
        return name
    return PROTOCOLS[name]()
