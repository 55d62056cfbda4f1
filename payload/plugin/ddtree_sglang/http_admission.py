"""DDTREE's admission in SGLang's HTTP process, before a stream starts (0.5.17-0.5.23).

The hook on ``TokenizerManager.generate_request`` (``admission_hook``) refuses a request before it
reaches the scheduler; for a non-streamed request that is an HTTP 400. A streamed one is
different: SGLang's routes answer ``200 text/event-stream`` first and call the tokenizer manager
inside the stream, so the refusal would arrive as an SSE ``error`` event. This module refuses
streamed requests earlier, the same rules (``ddtree.admission``) on the same request fields:

* ``/generate`` and ``/vertex_generate``: an ASGI middleware, the innermost one of SGLang's
  FastAPI ``app`` (after CORS, decompression and the API key), reads the body, builds the
  ``GenerateReqInput`` the route would (``/generate``: FastAPI's pydantic validation of the body;
  the Vertex route: its own construction from ``instances`` and ``parameters``) and, for a
  streamed one DDTREE refuses, answers 400 with the body ``/generate`` uses for its own errors
  (``{"error": {"message": ...}}``) before the route runs. A body the route would not accept
  (not JSON, nested too deep, failing validation) is handed on: the route answers it;
* ``/v1/completions`` and ``/v1/chat/completions``: an AFTER hook (SGLang's ``HookRegistry``) on
  each serving class's ``_convert_to_internal_request``, which ``OpenAIServingBase.handle_request``
  calls before it branches on ``stream``; a ``ValueError`` there is its HTTP 400;
* ``/v1/messages`` (SGLang's Anthropic adapter): it calls the chat class's conversion (with the
  hook above) inside ``except Exception``, which answers 500 "Internal server error" (0.5.17 to
  0.5.21); an AROUND hook on ``AnthropicServing._handle_non_streaming`` and
  ``_handle_streaming`` turns a refusal raised in that call into the adapter's own 400
  ``invalid_request_error`` naming the parameter, before any stream starts.
* ``/v1/responses``: a BEFORE hook on ``OpenAIServingResponses._generate_with_builtin_tools``,
  which ``create_responses`` calls with the ``GenerateReqInput`` it built, inside ``except
  ValueError`` (its 400 ``invalid_request_error``) and before any stream: the method is an async
  generator, so the hook runs at the call;
* Ollama's ``/api/generate`` and ``/api/chat``: an AROUND hook on ``OllamaServing``'s four
  response builders (each gets the ``GenerateReqInput`` the route built, before any stream)
  answers a refusal HTTP 400 ``{"error": ...}`` (Ollama's error shape) instead of a stream cut
  off (streamed) or an uncaught 500 (not streamed).

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
OLLAMA_TARGETS = tuple(
    f"sglang.srt.entrypoints.ollama.serving.OllamaServing.{method}"
    for method in ("_generate_chat_response", "_stream_chat_response",
                   "_generate_generate_response", "_stream_generate_response"))
RESPONSES_TARGET = ("sglang.srt.entrypoints.openai.serving_responses.OpenAIServingResponses"
                    "._generate_with_builtin_tools")
GENERATE = "/generate"

logger = logging.getLogger("ddtree_sglang")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class NotInstalled(RuntimeError):
    """The HTTP admission cannot be installed in this process."""


def route_path(scope: Scope) -> str:
    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", "") or "")
    if root and path.startswith(root):
        path = path[len(root):] or "/"
    return path


class StreamAdmission:
    """ASGI middleware: a streamed ``POST|PUT /generate`` (or ``POST`` to the Vertex route) that
    DDTREE would serve differently is answered 400 before SGLang's route runs; everything else
    passes untouched (the body it read is handed on as it came)."""

    def __init__(self, app: Any, request_cls: type, adapter: Any, vertex: str | None) -> None:
        self.app = app
        self.request_cls = request_cls
        self.adapter = adapter  # pydantic TypeAdapter(request_cls): what FastAPI builds
        self.vertex = vertex

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = route_path(scope)
        if (scope.get("type") != "http" or scope.get("method") not in ("POST", "PUT")
                or path not in (GENERATE, self.vertex)):
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
        why = self.refusal(path, body) if other is None else None
        if why is not None:
            await _answer_400(send, why)
            return
        await self.app(scope, _replay(body, other, receive), send)

    def request(self, path: str, body: bytes) -> Any:
        """The ``GenerateReqInput`` the route would build from ``body``, or None where the
        route would answer the body itself (it raises: not JSON, too deep, invalid)."""
        doc = json.loads(body)
        if path == GENERATE:
            return self.adapter.validate_python(doc)
        if not isinstance(doc, dict) or not isinstance(doc.get("instances"), list):
            return None
        instances, parameters = doc["instances"], doc.get("parameters") or {}
        if not instances or not isinstance(parameters, dict):
            return None
        inputs = {}  # as SGLang's vertex_generate builds its request
        for key in ("text", "input_ids", "input_embeds"):
            if instances[0].get(key):
                inputs[key] = [instance.get(key) for instance in instances]
                break
        images = [i.get("image_data") for i in instances if i.get("image_data") is not None]
        return self.request_cls(**inputs, image_data=images or None, **parameters)

    def refusal(self, path: str, body: bytes) -> str | None:
        """The refusal text for a streamed request DDTREE would serve differently, else None."""
        from ddtree.admission import Refused, check_request

        from ddtree_sglang.admission_hook import request_fields

        try:
            obj = self.request(path, body)
        except (ValueError, TypeError, AttributeError, RecursionError):
            return None  # the route answers it (its own error)
        if obj is None or not dataclasses.is_dataclass(obj) or not getattr(obj, "stream", False):
            return None  # not streamed: refused by the tokenizer manager's hook, as a 400
        try:
            check_request(*request_fields(obj))
        except Refused as exc:
            return str(exc)
        except Exception:  # never a 500 from here: the route answers it, and
            return None  # the tokenizer manager's hook still stands behind the route
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


def vertex_route(app: Any) -> str | None:
    """The path SGLang serves ``vertex_generate`` on (``AIP_PREDICT_ROUTE``), if any."""
    for route in getattr(app, "routes", []):
        if getattr(route, "name", None) == "vertex_generate":
            return str(getattr(route, "path", "")) or None
    return None


def add_middleware(app: Any, request_cls: type) -> None:
    """Put :class:`StreamAdmission` innermost in ``app``'s user middleware (Starlette builds the
    stack from ``user_middleware`` when the app first runs: too late once it has)."""
    from pydantic import TypeAdapter
    from starlette.middleware import Middleware

    if getattr(app, "middleware_stack", None) is not None:
        raise NotInstalled("the HTTP app has already started")
    listed = getattr(app, "user_middleware", None)
    if not isinstance(listed, list):
        raise NotInstalled("the HTTP app has no user_middleware list (not a Starlette app)")
    if any(getattr(m, "cls", None) is StreamAdmission for m in listed):
        return
    try:
        adapter = TypeAdapter(request_cls)
    except Exception as exc:  # pydantic's errors for a type it cannot build
        raise NotInstalled(f"pydantic cannot validate {request_cls.__name__}: {exc}") from exc
    listed.append(Middleware(StreamAdmission, request_cls=request_cls, adapter=adapter,
                             vertex=vertex_route(app)))


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


def ollama_hook(name: str, seen: Seen) -> Callable[..., Any]:
    """AROUND hook on ``OllamaServing``'s response builders ``(self, gen_request, raw_request,
    model_name)``: the request through the same rules; a refusal is Ollama's 400."""
    from ddtree.admission import Refused

    from ddtree_sglang.admission_hook import make_hook

    check = make_hook(name)

    def around(original: Callable[..., Any], serving: Any, gen_request: Any, *args: Any,
               **kwargs: Any) -> Any:
        try:
            check(getattr(serving, "tokenizer_manager", None), gen_request)
        except Refused as exc:
            return _ollama_400(str(exc))
        return original(serving, gen_request, *args, **kwargs)

    around.ddtree_admission = name  # type: ignore[attr-defined]
    return around


async def _ollama_400(why: str) -> Any:
    from starlette.responses import JSONResponse

    return JSONResponse({"error": why}, status_code=400)


def responses_hook(name: str, seen: Seen) -> Callable[..., Any]:
    """BEFORE hook on ``_generate_with_builtin_tools(self, request_id, request_prompt,
    adapted_request, ...)``: the built request through the same rules, at the call."""
    from ddtree_sglang.admission_hook import make_hook

    check = make_hook(name)

    def before(serving: Any, *args: Any, **kwargs: Any) -> None:
        adapted = kwargs.get("adapted_request", args[2] if len(args) > 2 else None)
        check(getattr(serving, "tokenizer_manager", None), adapted)
        return None

    before.ddtree_admission = name  # type: ignore[attr-defined]
    return before


def optional_route(target: str) -> bool:
    """Whether the module of an optional route's class imports. SGLang's own HTTP server loads
    serving_responses only in its lifespan, inside ``except Exception`` (/v1/responses is then
    disabled, with a warning): a module that does not import leaves no route to hook, and the
    tokenizer manager's refusal still stands behind it."""
    import importlib

    module = target.rsplit(".", 2)[0]
    try:
        importlib.import_module(module)
    except Exception as exc:  # SGLang's own guard is as broad
        logger.warning("%s does not import (%s: %s): its route is not hooked; SGLang disables it",
                       module, type(exc).__name__, exc)
        return False
    return True


def hook_serving(name: str) -> None:
    """Register and apply the serving hooks (``HookRegistry``); raise where one is not applied."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    seen: Seen = contextvars.ContextVar(f"{name}_refused", default=None)
    hooks = [(t, serving_hook, HookType.AFTER) for t in SERVING_TARGETS]
    hooks += [(t, anthropic_hook, HookType.AROUND) for t in ANTHROPIC_TARGETS]
    hooks += [(t, ollama_hook, HookType.AROUND) for t in OLLAMA_TARGETS]
    if optional_route(RESPONSES_TARGET):
        hooks.append((RESPONSES_TARGET, responses_hook, HookType.BEFORE))
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
    logger.info("%s: streamed requests are admitted before the stream starts (/generate, "
                "/vertex_generate: middleware; /v1/completions, /v1/chat/completions, "
                "/v1/messages: request conversion; /v1/responses: its generator's call; "
                "/api/generate, /api/chat: Ollama's response builders).", name)
    return True
