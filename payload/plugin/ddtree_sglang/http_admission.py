"""DDTREE's admission in SGLang's HTTP process, before a stream starts (0.5.17-0.5.23).

The hook on ``TokenizerManager.generate_request`` (``admission_hook``) refuses a request before it
reaches the scheduler; for a non-streamed request that is an HTTP 400. A streamed one is
different: SGLang's routes answer ``200 text/event-stream`` first and call the tokenizer manager
inside the stream, so the refusal would arrive as an SSE ``error`` event. This module refuses
streamed requests earlier, the same rules (``ddtree.admission``) on the same request fields:

* ``/generate``: an ASGI middleware, the innermost one of SGLang's FastAPI ``app`` (after CORS,
  decompression and the API key), reads the body of a streamed request, fills
  ``GenerateReqInput``'s fields from it and answers 400 with the body ``/generate`` uses for its
  own errors (``{"error": {"message": ...}}``) before the route runs;
* ``/v1/completions`` and ``/v1/chat/completions``: an AFTER hook (SGLang's ``HookRegistry``) on
  each serving class's ``_convert_to_internal_request``, which ``OpenAIServingBase.handle_request``
  calls before it branches on ``stream``; a ``ValueError`` there is its HTTP 400;
* ``/v1/messages`` (SGLang's Anthropic adapter): it calls the chat class's conversion (with the
  hook above) inside ``except Exception``, which answers 500 "Internal server error" (0.5.17 to
  0.5.21); an AROUND hook on ``AnthropicServing._handle_non_streaming`` and
  ``_handle_streaming`` turns a refusal raised in that call into the adapter's own 400
  ``invalid_request_error`` naming the parameter, before any stream starts.

:func:`install` runs in the process that serves HTTP, once its ``TokenizerManager`` exists and
before the app starts (``admission_hook`` calls it from ``TokenizerManager.__init__``), and only
on a DDTREE server. Where it cannot install all of this it raises: the server does not start
(fail closed).
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

HTTP_MODULE = "sglang.srt.entrypoints.http_server"
REQUEST_CLASS = "sglang.srt.managers.io_struct:GenerateReqInput"
SERVING_TARGETS = (
    "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion"
    "._convert_to_internal_request",
    "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._convert_to_internal_request",
)
ANTHROPIC_TARGETS = (
    "sglang.srt.entrypoints.anthropic.serving.AnthropicServing._handle_non_streaming",
    "sglang.srt.entrypoints.anthropic.serving.AnthropicServing._handle_streaming",
)
GENERATE = "/generate"

logger = logging.getLogger("ddtree_sglang")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class NotInstalled(RuntimeError):
    """The HTTP admission cannot be installed in this process."""


def body_fields(body: Any, request_cls: type) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The request's fields as ``/generate`` fills ``request_cls`` from a JSON body (keys that
    are not fields are ignored, as SGLang's route ignores them), and the fields' defaults;
    None for a body that is not a JSON object (the route answers that itself)."""
    if not isinstance(body, dict):
        return None
    fields: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    for field in dataclasses.fields(request_cls):
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = field.default
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = field.default_factory()
        if field.name in body:
            fields[field.name] = body[field.name]
        elif field.name in defaults:
            fields[field.name] = defaults[field.name]
    return fields, defaults


def route_path(scope: Scope) -> str:
    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", "") or "")
    if root and path.startswith(root):
        path = path[len(root):] or "/"
    return path


class StreamAdmission:
    """ASGI middleware: a streamed ``POST|PUT /generate`` that DDTREE would serve differently
    is answered 400 before SGLang's route runs; everything else passes untouched (the body it
    read is handed on as it came)."""

    def __init__(self, app: Any, request_cls: type) -> None:
        self.app = app
        self.request_cls = request_cls

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope.get("type") != "http" or scope.get("method") not in ("POST", "PUT")
                or route_path(scope) != GENERATE):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        other: Message | None = None  # a disconnect while the body was read
        while True:
            message = await receive()
            if message.get("type") != "http.request":
                other = message
                break
            chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        why = self.refusal(body) if other is None else None
        if why is not None:
            await _answer_400(send, why)
            return
        await self.app(scope, _replay(body, other, receive), send)

    def refusal(self, body: bytes) -> str | None:
        """The refusal text for a streamed request DDTREE would serve differently, else None."""
        from ddtree.admission import Refused, check_request

        try:
            doc = json.loads(body)
        except ValueError:
            return None  # not JSON: SGLang's route answers it
        if not isinstance(doc, dict) or not doc.get("stream"):
            return None  # not streamed: refused by the tokenizer manager's hook, as a 400
        got = body_fields(doc, self.request_cls)
        if got is None:
            return None
        try:
            check_request(*got)
        except Refused as exc:
            return str(exc)
        return None


def _replay(body: bytes, other: Message | None, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent, other
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": other is not None}
        if other is not None:
            message, other = other, None
            return message
        return await receive()

    return replay


async def _answer_400(send: Send, why: str) -> None:
    data = json.dumps({"error": {"message": why}}).encode()
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def add_middleware(app: Any, request_cls: type) -> None:
    """Put :class:`StreamAdmission` innermost in ``app``'s user middleware (Starlette builds the
    stack from ``user_middleware`` when the app first runs: too late once it has)."""
    from starlette.middleware import Middleware

    if getattr(app, "middleware_stack", None) is not None:
        raise NotInstalled("the HTTP app has already started")
    listed = getattr(app, "user_middleware", None)
    if not isinstance(listed, list):
        raise NotInstalled("the HTTP app has no user_middleware list (not a Starlette app)")
    if any(getattr(m, "cls", None) is StreamAdmission for m in listed):
        return
    listed.append(Middleware(StreamAdmission, request_cls=request_cls))


Seen = contextvars.ContextVar[list[Exception] | None]


def serving_hook(name: str, seen: Seen) -> Callable[..., Any]:
    """AFTER hook on ``_convert_to_internal_request``: the adapted ``GenerateReqInput``
    through the same rules, before ``handle_request`` starts a stream. A refusal is also noted
    in ``seen`` (set by :func:`anthropic_hook` around a caller that would hide it)."""
    from ddtree.admission import Refused

    from ddtree_sglang.admission_hook import make_hook

    check = make_hook(name)

    def after(result: Any, serving: Any, *args: Any, **kwargs: Any) -> None:
        adapted = result[0] if isinstance(result, tuple) and result else None
        try:
            check(getattr(serving, "tokenizer_manager", None), adapted)
        except Refused as exc:
            noted = seen.get()
            if noted is not None:
                noted.append(exc)
            raise
        return None

    after.ddtree_admission = name  # type: ignore[attr-defined]
    return after


def anthropic_hook(name: str, seen: Seen) -> Callable[..., Any]:
    """AROUND hook on the Anthropic adapter's two handlers: a refusal its conversion call raised
    (which the adapter answers 500 "Internal server error") is answered as the adapter answers a
    bad request: HTTP 400, ``{"type": "error", "error": {"type": "invalid_request_error",
    "message": ...}}``."""

    def around(original: Callable[..., Any], serving: Any, *args: Any, **kwargs: Any) -> Any:
        async def handle() -> Any:
            noted: list[Exception] = []
            token = seen.set(noted)
            try:
                result = await original(serving, *args, **kwargs)
            finally:
                seen.reset(token)
            if noted:
                return serving._error_response(status_code=400,
                                               error_type="invalid_request_error",
                                               message=str(noted[0]))
            return result

        return handle()

    around.ddtree_admission = name  # type: ignore[attr-defined]
    return around


def hook_serving(name: str) -> None:
    """Register and apply the serving hooks (``HookRegistry``); raise where one is not applied."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    seen: Seen = contextvars.ContextVar(f"{name}_refused", default=None)
    hooks = [(t, serving_hook, HookType.AFTER) for t in SERVING_TARGETS]
    hooks += [(t, anthropic_hook, HookType.AROUND) for t in ANTHROPIC_TARGETS]
    for target, make, kind in hooks:
        listed = HookRegistry._hooks.get(target, [])
        if not any(getattr(entry[1], "ddtree_admission", None) == name for entry in listed):
            HookRegistry.register(target, make(name, seen), kind)
    HookRegistry.apply_hooks()
    missing = [t for t, _, _ in hooks if t not in HookRegistry._patched]
    if missing:
        raise NotInstalled(f"SGLang's hooks were not applied to {', '.join(missing)}")


def install(name: str) -> bool:
    """Install both parts in this process when it serves HTTP (its http_server module is
    loaded); False where it does not (an offline ``Engine``: no streams to refuse)."""
    http = sys.modules.get(HTTP_MODULE)
    if http is None or not hasattr(http, "app"):
        return False
    import pkgutil

    try:
        request_cls = pkgutil.resolve_name(REQUEST_CLASS)
        if not dataclasses.is_dataclass(request_cls):
            raise NotInstalled(f"{REQUEST_CLASS} is not a dataclass")
        add_middleware(http.app, request_cls)
        hook_serving(name)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise NotInstalled(f"{type(exc).__name__}: {exc}") from exc
    logger.info("%s: streamed requests are admitted before the stream starts (/generate: "
                "middleware; /v1/completions, /v1/chat/completions, /v1/messages: request "
                "conversion).", name)
    return True
