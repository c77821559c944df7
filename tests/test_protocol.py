import json

import pytest

from bat_gym.core.protocol import (
    PROTOCOLS,
    ToolCall,
    bash_call,
    get_protocol,
    python_call,
    validate_call,
)

CALLS = [
    ToolCall(
        name="execute_code", arguments={"language": "python", "code": 'print("a}b</tool_call>")\n'}
    ),
    ToolCall(name="finish", arguments={"summary": "done"}),
]


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_render_then_parse_round_trips(name):
    proto = get_protocol(name)
    text = proto.render("thinking", CALLS)
    parsed = proto.parse(text)
    assert parsed.error is None
    assert [(c.name, c.arguments) for c in parsed.calls] == [(c.name, c.arguments) for c in CALLS]


def test_hermes_reads_qwen_style_blocks_and_keeps_content():
    msg = 'Let me look.\n<tool_call>\n{"name": "execute_code", "arguments": {"language": "bash", "code": "ls"}}\n</tool_call>'
    parsed = get_protocol("hermes").parse(msg)
    assert parsed.content == "Let me look."
    assert parsed.calls[0].arguments == {"language": "bash", "code": "ls"}


def test_arguments_given_as_a_json_string_are_accepted():
    msg = '<tool_call>{"name": "finish", "arguments": "{\\"summary\\": \\"x\\"}"}</tool_call>'
    assert get_protocol("hermes").parse(msg).calls[0].arguments == {"summary": "x"}


@pytest.mark.parametrize(
    ("msg", "expected"),
    [
        ("just prose", "No tool call found"),
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"name": "finish", "arguments": {}}', "no closing </tool_call> tag"),
        ('<tool_call>["a"]</tool_call>', "must be a JSON object"),
        ('<tool_call>{"arguments": {}}</tool_call>', "no string 'name'"),
        (
            '<tool_call>{"name": "finish", "arguments": [1]}</tool_call>',
            "'arguments' must be a JSON object",
        ),
    ],
)
def test_hermes_errors_say_what_is_wrong(msg, expected):
    parsed = get_protocol("hermes").parse(msg)
    assert parsed.calls == ()
    assert expected in parsed.error


def test_json_protocol_reads_fenced_blocks_and_lists():
    proto = get_protocol("json")
    fenced = 'Plan:\n```json\n{"name": "finish", "arguments": {"summary": "ok"}}\n```'
    assert proto.parse(fenced).calls[0].name == "finish"
    assert proto.parse(fenced).content == "Plan:"
    both = json.dumps([{"name": "finish", "arguments": {"summary": "a"}}] * 2)
    assert len(proto.parse(both).calls) == 2
    assert "not valid JSON" in proto.parse('{"name": "finish", ').error


def test_openai_protocol_keeps_call_ids_and_reports_bad_arguments():
    proto = get_protocol("openai")
    msg = json.dumps(
        {
            "content": "",
            "tool_calls": [
                {
                    "id": "c7",
                    "type": "function",
                    "function": {"name": "finish", "arguments": '{"summary": "s"}'},
                }
            ],
        }
    )
    assert proto.parse(msg).calls[0].id == "c7"
    bad = json.dumps({"tool_calls": [{"function": {"name": "finish", "arguments": "{oops"}}]})
    assert "not valid JSON" in proto.parse(bad).error
    assert "No tool call found" in proto.parse(json.dumps({"content": "hi"})).error


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (ToolCall(name="run", arguments={}), "unknown tool 'run'"),
        (
            ToolCall(name="execute_code", arguments={"language": "bash"}),
            "missing required argument 'code'",
        ),
        (
            ToolCall(name="execute_code", arguments={"language": "ruby", "code": "1"}),
            "must be one of 'python', 'bash'",
        ),
        (
            ToolCall(name="execute_code", arguments={"language": "bash", "code": 5}),
            "must be a string",
        ),
        (
            ToolCall(name="finish", arguments={"summary": "x", "extra": 1}),
            "unexpected argument 'extra'",
        ),
    ],
)
def test_validate_call_names_the_problem(call, expected):
    assert expected in validate_call(call)


def test_valid_call_passes_and_unknown_protocol_is_refused():
    assert validate_call(CALLS[0]) is None
    with pytest.raises(ValueError, match="unknown tool protocol 'xml'"):
        get_protocol("xml")


def test_a_scripted_call_is_a_valid_execute_code_call_with_one_final_newline():
    py, sh = python_call("\n\nprint(1)\n\n\n"), bash_call("  ls -l  ")
    assert py.arguments == {"language": "python", "code": "print(1)\n"}
    assert sh.arguments == {"language": "bash", "code": "ls -l\n"}
    assert validate_call(py) is None and validate_call(sh) is None
