"""An MCP-speaking agent for tests: replays recorded tool calls through the mcp client.

Usage: python mcp_replay_agent.py CALLS.json [--exit-after N] [--exit-status S]

CALLS.json maps the sha256 of the prompt (the server's ``task`` prompt) to the list of
``{"name": ..., "arguments": ...}`` calls to make, in order. The agent reads its
server's address from BAT_GYM_MCP_URL, as any agent run by ``mcp-agent:`` does, and
stops after ``finish`` (or after N calls, exiting with status S).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
from pathlib import Path

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import Implementation


async def main(args: argparse.Namespace) -> int:
    table = json.loads(Path(args.calls).read_text(encoding="utf-8"))
    async with (
        streamable_http_client(os.environ["BAT_GYM_MCP_URL"]) as (read, write),
        ClientSession(
            read, write, client_info=Implementation(name="replay-agent", version="0.1")
        ) as session,
    ):
        await session.initialize()
        prompt = await session.get_prompt("task")
        text = prompt.messages[0].content.text
        calls = table[hashlib.sha256(text.encode()).hexdigest()]
        listed = {t.name for t in (await session.list_tools()).tools}
        for n, call in enumerate(calls):
            if args.exit_after is not None and n >= args.exit_after:
                return args.exit_status
            assert call["name"] in listed, (call["name"], listed)
            result = await session.call_tool(call["name"], call["arguments"])
            print(f"{call['name']}: {result.content[0].text[:200]!r}", file=sys.stderr)
            if call["name"] == "finish":
                break
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("calls")
    parser.add_argument("--exit-after", type=int)
    parser.add_argument("--exit-status", type=int, default=0)
    sys.exit(asyncio.run(main(parser.parse_args())))
