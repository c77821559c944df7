"""The oracle's solution of an exported Harbor task: replay recorded tool calls over MCP.

Harbor's ``oracle`` agent runs a task's ``solution/solve.sh`` inside the agent's
container. There the env's tools are the sidecar's MCP server
(``http://127.0.0.1:8000/mcp``), and the image holds python3 but no MCP SDK, so this
file is a standalone client on the standard library alone: it speaks MCP's streamable
HTTP transport (JSON-RPC over POST, answers as JSON or as server-sent events, the
session in the ``Mcp-Session-Id`` header), waits for the sidecar to listen, then makes
each call of ``calls.json`` in order and stops after ``finish``.

``bat-gym export harbor --solution`` copies this file into each task's ``solution/``
with the scripted teacher's calls, so ``harbor run -a oracle`` plays the teacher through
the real sidecar and verifier. Nothing here imports bat_gym.

Usage: python3 harbor_solve.py CALLS.json [URL]
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

URL = "http://127.0.0.1:8000/mcp"
PROTOCOL_VERSION = "2025-06-18"
WAIT_S = 120.0


class Session:
    """One MCP session over streamable HTTP: JSON-RPC requests, answered in order."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session_id: str | None = None
        self.next_id = 1

    def _post(self, message: dict[str, Any]) -> dict[str, Any] | None:
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": PROTOCOL_VERSION,
        }
        if self.session_id is not None:
            headers["Mcp-Session-Id"] = self.session_id
        request = urllib.request.Request(
            self.url, data=json.dumps(message).encode(), headers=headers, method="POST"
        )
        with urllib.request.urlopen(request, timeout=3600) as response:
            self.session_id = response.headers.get("Mcp-Session-Id", self.session_id)
            body = response.read().decode("utf-8")
            kind = response.headers.get("Content-Type", "")
        if "id" not in message or not body.strip():
            return None  # a notification: 202, no body
        if kind.startswith("text/event-stream"):
            return _answer_in_events(body, message["id"])
        return json.loads(body)

    def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """Send one request; its ``result``, or SystemExit with the server's error."""
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.next_id += 1
        answer = self._post(message)
        if answer is None or "error" in answer:
            raise SystemExit(f"{method} failed: {answer}")
        return answer["result"]

    def notify(self, method: str) -> None:
        """Send one notification (no answer)."""
        self._post({"jsonrpc": "2.0", "method": method})


def _answer_in_events(body: str, request_id: int) -> dict[str, Any] | None:
    """The JSON-RPC answer to ``request_id`` among server-sent events."""
    for event in body.split("\n\n"):
        data = "\n".join(
            line[5:].lstrip() for line in event.splitlines() if line.startswith("data:")
        )
        if data:
            message = json.loads(data)
            if message.get("id") == request_id:
                return message
    return None


def wait_for(url: str, seconds: float = WAIT_S) -> None:
    """Until the server answers HTTP at all (the sidecar may still be starting)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=5).close()
            return
        except urllib.error.HTTPError:
            return  # it answered (a GET without a session is refused): it listens
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"no MCP server answered at {url} within {seconds:g} s") from None
            time.sleep(0.5)


def main(argv: list[str]) -> int:
    """Replay ``argv[1]``'s calls at ``argv[2]`` (default :data:`URL`); 0 once they ran."""
    calls = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    url = argv[2] if len(argv) > 2 else URL
    wait_for(url)
    session = Session(url)
    session.request(
        "initialize",
        {
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "bat-gym-oracle", "version": "1"},
        },
    )
    session.notify("notifications/initialized")
    for call in calls:
        result = session.request(
            "tools/call", {"name": call["name"], "arguments": call["arguments"]}
        )
        text = " ".join(c.get("text", "") for c in result.get("content", []))
        print(f"{call['name']}: {text[:300]}", flush=True)
        if call["name"] == "finish":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
