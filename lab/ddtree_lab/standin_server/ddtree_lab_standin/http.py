"""A small JSON-over-HTTP server on the standard library (ThreadingHTTPServer).

Used by the stand-in SGLang server and by the GPU0 wrapper; access lines are
printed in uvicorn's style, as the real servers do.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class BadRequest(Exception):
    """The request body is not what the endpoint accepts (answered 400)."""


@dataclass
class Request:
    method: str
    path: str
    body: bytes = b""

    def json(self) -> dict[str, Any]:
        if not self.body:
            return {}
        try:
            value = json.loads(self.body)
        except ValueError as exc:
            raise BadRequest(f"JSON decode error: {exc}") from exc
        if not isinstance(value, dict):
            raise BadRequest("the request body must be a JSON object")
        return value


@dataclass
class Response:
    status: int = 200
    body: Any = field(default_factory=dict)
    content_type: str = "application/json"

    @property
    def streamed(self) -> bool:
        return isinstance(self.body, Iterator)

    def encode(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        if isinstance(self.body, str):
            return self.body.encode("utf-8")
        return json.dumps(self.body).encode("utf-8")


Route = Callable[[Request], Response]


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self,
        address: tuple[str, int],
        routes: dict[tuple[str, str], Route],
        access_log: bool = True,
        timestamps: bool = False,
    ) -> None:
        self.routes = routes
        self.access_log = access_log
        self.timestamps = timestamps  # "[YYYY-mm-dd HH:MM:SS] " before each line, as SGLang
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: Server
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def _dispatch(self, method: str, head: bool = False) -> None:
        path = urlsplit(self.path).path
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        route = self.server.routes.get((method, path))
        if route is None:
            known = any(p == path for _, p in self.server.routes)
            response = (
                Response(405, {"detail": "Method Not Allowed"})
                if known
                else Response(404, {"detail": "Not Found"})
            )
        else:
            try:
                response = route(Request(method, path, body))
            except BadRequest as exc:
                # as sglang's http_server _create_error_response (a ValueError's text)
                response = Response(400, {"error": {"message": str(exc)}})
            except Exception as exc:  # keep serving; report like an internal error
                response = Response(500, {"error": {"message": repr(exc), "code": 500}})
        self.send_response(response.status, REASONS.get(response.status))
        self.send_header("content-type", response.content_type)
        if response.streamed:  # a StreamingResponse: chunked transfer, one chunk per item
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            try:
                for piece in response.body:
                    if piece and not head:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        self.wfile.flush()
                if not head:
                    self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True
                close = getattr(response.body, "close", None)
                if close is not None:
                    close()
            return
        data = response.encode()
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        if not head:
            self.wfile.write(data)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_HEAD(self) -> None:
        self._dispatch("GET", head=True)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if not self.server.access_log:
            return
        status = int(code) if str(code).isdigit() else 0
        client = f"{self.client_address[0]}:{self.client_address[1]}"
        line = self.requestline
        print(stamp(self.server.timestamps)
              + f'INFO:     {client} - "{line}" {status} {REASONS.get(status, "")}'.rstrip(),
              flush=True)

    def log_message(self, format: str, *args: Any) -> None:
        print(format % args, file=sys.stderr, flush=True)


def stamp(on: bool = True) -> str:
    """SGLang's log prefix (its logging format "[%(asctime)s] ", seconds resolution)."""
    return time.strftime("[%Y-%m-%d %H:%M:%S] ") if on else ""


def make_server(
    host: str, port: int, routes: dict[tuple[str, str], Route], access_log: bool = True,
    timestamps: bool = False,
) -> Server:
    return Server((host, port), routes, access_log, timestamps)
