"""Serving the viewer on 127.0.0.1 with the standard library's HTTP server.

Read-only: GET and HEAD only, answered from :class:`~bat_gym.viewer.site.Site`; the
server binds the loopback address alone, so the pages (held-out traces among them)
are not offered to the network.
"""

from __future__ import annotations

import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from bat_gym.viewer.html import warm_highlighter
from bat_gym.viewer.site import Site

__all__ = ["make_server"]


def make_server(site: Site, port: int = 0, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """A server of ``site`` on ``host:port`` (0: a free port); call ``serve_forever()``.

    The bound port is ``server.server_address[1]``.
    """

    class Handler(BaseHTTPRequestHandler):
        server_version = "bat-gym-view"

        def _answer(self, body: bool) -> None:
            name = unquote(urlsplit(self.path).path).lstrip("/")
            got = site.get(name)
            if got is None:
                data, kind, status = (
                    b"not found\n",
                    "text/plain; charset=utf-8",
                    HTTPStatus.NOT_FOUND,
                )
            else:
                (data, kind), status = got, HTTPStatus.OK
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if body:
                self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
            self._answer(True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(False)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # one line per page would bury the URL the command printed

    server = ThreadingHTTPServer((host, port), Handler)
    # Pygments loads its lexers on first use (about half a second): do it now, so the
    # first episode a person opens comes as fast as the next.
    threading.Thread(target=warm_highlighter, daemon=True).start()
    return server
