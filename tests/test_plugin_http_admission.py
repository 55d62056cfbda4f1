"""The plugin refuses streamed requests with HTTP 400 before the stream starts (issue 25, plugin
form), on every supported release.

Session 7's H200 run of SGLang 0.5.17 + the plugin: /generate with "stream": true answered HTTP 200
and then an SSE event ``data: {"error": ...}``, because SGLang's route starts the stream before it
calls the tokenizer manager, where the plugin's only check was. ``http_admission`` adds two:

* ``/generate``: its ASGI middleware in a real FastAPI app (fastapi 0.140.13, starlette 0.52.1: the
  stack the H200 runs, tests/wheels.toml) whose /generate route has SGLang's shape: a stream that
  calls the tokenizer manager (the plugin's own BEFORE hook) inside it, SGLang's error bodies.
  That the real route has that shape is read from each release's http_server.py.
* ``/v1/completions`` and ``/v1/chat/completions``: each release's real ``OpenAIServingBase`` (its
  serving_base.py, loaded by file with the fakes below) and real ``HookRegistry``
  (hook_registry.py) apply the plugin's hook to the serving classes, whose
  ``_convert_to_internal_request`` is read from the release's files (sync, returns the
  ``GenerateReqInput`` first); ``handle_request`` then answers 400 and never starts the stream.

Requests use each release's real ``GenerateReqInput`` (its dataclass, compiled from the wheel).
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import functools
import json
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from wheelcache import wheel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "payload" / "plugin"))
sys.path.insert(0, str(ROOT / "payload"))

from ddtree_sglang import admission_hook, http_admission, releases  # noqa: E402


@pytest.fixture(scope="module")
def web() -> types.SimpleNamespace:
    """fastapi and starlette from their wheels (pure Python: imported from the file itself, no
    install, no process); orjson, which fastapi's ORJSONResponse needs, is not in this venv."""
    for name, version in (("starlette", "0.52.1"), ("fastapi", "0.140.13")):
        path = str(wheel(name, version))
        if path not in sys.path:
            sys.path.insert(0, path)
    if "orjson" not in sys.modules:
        orjson = types.ModuleType("orjson")
        orjson.OPT_NON_STR_KEYS, orjson.OPT_SERIALIZE_NUMPY = 1, 2  # type: ignore[attr-defined]
        orjson.dumps = lambda obj, option=None, default=None: json.dumps(obj).encode()  # type: ignore[attr-defined]
        sys.modules["orjson"] = orjson
    import fastapi
    import fastapi.responses
    import starlette.middleware.cors

    return types.SimpleNamespace(FastAPI=fastapi.FastAPI,
                                 JSONResponse=fastapi.responses.JSONResponse,
                                 StreamingResponse=fastapi.responses.StreamingResponse,
                                 CORSMiddleware=starlette.middleware.cors.CORSMiddleware)


SUPPORTED = sorted(releases.SUPPORTED)
REFUSED = [("frequency_penalty", {"sampling_params": {"frequency_penalty": 1.5}}),
           ("min_new_tokens", {"sampling_params": {"min_new_tokens": 3}}),
           ("logit_bias", {"sampling_params": {"logit_bias": {"5": 2.0}}}),
           ("return_logprob", {"return_logprob": True})]
NEUTRAL = {"sampling_params": {"frequency_penalty": 0.0, "presence_penalty": 0.0,
                               "repetition_penalty": 1.0, "min_new_tokens": 0,
                               "temperature": 0.7, "top_k": 2, "top_p": 0.9, "min_p": 0.1,
                               "stop_token_ids": [7], "max_new_tokens": 4}}


@functools.cache
def _source(release: str, path: str) -> str:
    with zipfile.ZipFile(wheel("sglang", release)) as zf:
        return zf.read(path).decode()


@functools.cache
def real_request_class(release: str) -> type:
    """The release's ``GenerateReqInput``, compiled from its io_struct.py alone, in a module of
    its own so that pydantic resolves its annotations as FastAPI does: typing's names, pydantic's
    PlainValidator, the release's own field_validators.py; SGLang's enums and multimodal input
    types (torch, PIL) stand as ``Any``."""
    tree = ast.parse(_source(release, "sglang/srt/managers/io_struct.py"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GenerateReqInput")
    import typing
    import uuid
    from collections import Counter

    import pydantic

    module = types.ModuleType(f"io_struct_{release.replace('.', '_')}")
    sys.modules[module.__name__] = module
    validators = _source(release, "sglang/srt/utils/field_validators.py")
    exec(compile(validators, "field_validators.py", "exec"), module.__dict__)
    module.__dict__.update({name: getattr(typing, name) for name in typing.__all__})
    module.__dict__.update({"dataclass": dataclasses.dataclass, "field": dataclasses.field,
                            "uuid": uuid, "Counter": Counter,
                            "PlainValidator": pydantic.PlainValidator})
    module.__dict__.update(dict.fromkeys(
        ("Modality", "MultimodalDataInputFormat", "ReturnHiddenStatesMode",
         "SamplingLogprobsMode", "KvHintsEnvelope"), Any))
    code = ast.Module(body=[ast.ImportFrom(module="__future__", names=[
        ast.alias(name="annotations")], level=0), cls], type_ignores=[])
    exec(compile(ast.fix_missing_locations(code), "io_struct.py", "exec"), module.__dict__)
    return module.GenerateReqInput  # type: ignore[no-any-return]


def manager(algorithm: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(server_args=types.SimpleNamespace(speculative_algorithm=algorithm))


# ---- /generate: the middleware in a real FastAPI app with SGLang's route shape -------------

def sglang_shaped_app(web: Any, request_cls: type, algorithm: str) -> Any:
    """/generate as SGLang 0.5.17-0.5.23 serve it (http_server.generate_request): the body
    validated into the request class as FastAPI does (pydantic; 422 when invalid), a streamed
    request's tokenizer-manager call (with the plugin's BEFORE hook) inside the stream; a
    ValueError there is an SSE error event after HTTP 200, before it SGLang's 400 body. And
    /vertex_generate (http_server.vertex_generate), which builds the request from ``instances``
    and ``parameters`` and calls /generate's handler directly. ``app.state.reached`` lists the
    bodies the routes got."""
    from pydantic import TypeAdapter, ValidationError

    app = web.FastAPI()
    app.add_middleware(web.CORSMiddleware, allow_origins=["*"])
    check = admission_hook.make_hook("DDTREE")
    tm = manager(algorithm)
    adapter = TypeAdapter(request_cls)
    app.state.reached = []

    async def tokens(obj: Any) -> Any:
        check(tm, obj)
        for i in range(3):
            yield {"output_ids": list(range(i + 1)), "echo": obj.sampling_params}

    async def serve(obj: Any) -> Any:
        if obj.stream:
            async def stream_results() -> Any:
                try:
                    async for out in tokens(obj):
                        yield b"data: " + json.dumps(out).encode() + b"\n\n"
                except ValueError as e:
                    yield b"data: " + json.dumps({"error": {"message": str(e)}}).encode() + b"\n\n"
                yield b"data: [DONE]\n\n"

            return web.StreamingResponse(stream_results(), media_type="text/event-stream")
        try:
            return web.JSONResponse(await tokens(obj).__anext__())
        except ValueError as e:
            return web.JSONResponse({"error": {"message": str(e)}}, status_code=400)

    async def generate_request(request: Any) -> Any:
        body = await request.body()
        app.state.reached.append(body)
        try:
            obj = adapter.validate_json(body)
        except ValidationError as e:
            return web.JSONResponse({"detail": str(e)}, status_code=422)
        return await serve(obj)

    async def vertex_generate(request: Any) -> Any:
        doc = await request.json()
        app.state.reached.append(doc)
        instances = doc["instances"]
        inputs = {"input_ids": [i.get("input_ids") for i in instances]}
        return await serve(request_cls(**inputs, image_data=None, **(doc["parameters"] or {})))

    app.add_route("/generate", generate_request, methods=["POST", "PUT"])
    app.add_route("/vertex_generate", vertex_generate, methods=["POST"], name="vertex_generate")
    return app


@pytest.fixture()
def http_process(web: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """This process as SGLang's HTTP process: its http_server module (with ``app``) loaded;
    the serving hooks' part is the /v1 tests' (here: recorded, not applied)."""
    applied: list[str] = []
    monkeypatch.setattr(http_admission, "hook_serving", applied.append)

    def start(release: str, algorithm: str = "DDTREE") -> tuple[Any, list[str]]:
        cls = real_request_class(release)
        app = sglang_shaped_app(web, cls, algorithm)
        http = types.ModuleType(http_admission.HTTP_MODULE)
        http.app = app  # type: ignore[attr-defined]
        io_struct = types.ModuleType("sglang.srt.managers.io_struct")
        io_struct.GenerateReqInput = cls  # type: ignore[attr-defined]
        for name in ("sglang", "sglang.srt", "sglang.srt.managers", "sglang.srt.entrypoints"):
            package = types.ModuleType(name)
            package.__path__ = []
            monkeypatch.setitem(sys.modules, name, package)
        monkeypatch.setitem(sys.modules, http.__name__, http)
        monkeypatch.setitem(sys.modules, io_struct.__name__, io_struct)
        admission_hook.make_init_hook("DDTREE")(None, manager(algorithm))
        return app, applied

    return start


def post(app: Any, body: dict[str, Any], path: str = "/generate") -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sglang") as client:
            return await client.post(path, json=body)

    return asyncio.run(go())


@pytest.mark.parametrize("release", SUPPORTED)
@pytest.mark.parametrize(("name", "fields"), REFUSED)
def test_a_streamed_generate_request_ddtree_refuses_is_a_400_before_the_stream(
        http_process: Any, release: str, name: str, fields: dict[str, Any]) -> None:
    app, applied = http_process(release)
    got = post(app, {"input_ids": [1, 2, 3], "stream": True, **fields})
    assert got.status_code == 400 and got.headers["content-type"] == "application/json"
    message = got.json()["error"]["message"]
    assert message.startswith(f"DDTREE speculative decoding refuses {name}=")
    assert "data:" not in got.text
    assert applied == ["DDTREE"]  # and the /v1 hooks were asked for


def test_without_the_middleware_the_stream_starts_and_carries_the_refusal(web: Any) -> None:
    """The H200 finding (0.5.17, session 7): HTTP 200, then ``data: {"error": ...}``."""
    got = post(sglang_shaped_app(web, real_request_class("0.5.17"), "DDTREE"),
               {"input_ids": [1], "stream": True, **REFUSED[0][1]})
    assert got.status_code == 200
    assert got.text.startswith('data: {"error": {"message": "DDTREE speculative decoding '
                               'refuses frequency_penalty=1.5')


@pytest.mark.parametrize("release", SUPPORTED)
def test_neutral_streams_and_plain_requests_pass_through_unchanged(http_process: Any,
                                                                  release: str) -> None:
    app, _ = http_process(release)
    body = {"input_ids": [1, 2, 3], "stream": True, **NEUTRAL}
    got = post(app, body)
    assert got.status_code == 200 and got.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in got.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) == 4
    assert json.loads(events[0])["echo"] == NEUTRAL["sampling_params"]  # the body, as sent
    # not streamed: SGLang's own path refuses it (the tokenizer manager's hook), still a 400
    plain = post(app, {"input_ids": [1], "stream": False, **REFUSED[0][1]})
    assert plain.status_code == 400 and "frequency_penalty" in plain.json()["error"]["message"]
    # a body that is not JSON is handed to the route, which answers it itself (FastAPI: 422)
    assert asyncio.run(_raw(app, b"{not json")) == 422
    assert app.state.reached[-1] == b"{not json"


async def _raw(app: Any, data: bytes) -> int:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://sglang") as client:
        got = await client.post("/generate", content=data,
                                headers={"content-type": "application/json"})
    return got.status_code


@pytest.mark.parametrize("release", SUPPORTED)
def test_a_streamed_vertex_generate_request_ddtree_refuses_is_a_400_before_the_stream(
        http_process: Any, release: str) -> None:
    """/vertex_generate calls /generate's handler itself, past the /generate path: 0.3.2's
    middleware let its stream start (HTTP 200, then an error event)."""
    app, _ = http_process(release)
    for name, fields in REFUSED:
        parameters = {"stream": True, **fields}
        got = post(app, {"instances": [{"input_ids": [1, 2]}], "parameters": parameters},
                   "/vertex_generate")
        assert got.status_code == 400 and "data:" not in got.text, (release, name)
        assert got.json()["error"]["message"].startswith(
            f"DDTREE speculative decoding refuses {name}=")
    assert app.state.reached == []
    neutral = post(app, {"instances": [{"input_ids": [1]}],
                         "parameters": {"stream": True, **NEUTRAL}}, "/vertex_generate")
    assert neutral.status_code == 200 and neutral.text.count("data: ") == 4


@pytest.mark.parametrize("release", SUPPORTED)
def test_the_middleware_judges_the_request_fastapi_builds_not_the_raw_json(
        http_process: Any, release: str) -> None:
    """pydantic reads "false" as False: the route serves return_logprob="false" (not set),
    streamed as it does unstreamed; 0.3.2's middleware refused it streamed only."""
    app, _ = http_process(release)
    body = {"input_ids": [1], "return_logprob": "false"}
    plain = post(app, {**body, "stream": False})
    streamed = post(app, {**body, "stream": True})
    assert plain.status_code == 200 and streamed.status_code == 200
    assert streamed.headers["content-type"].startswith("text/event-stream")
    refused = post(app, {**body, "return_logprob": "true", "stream": "true"})
    assert refused.status_code == 400 and "return_logprob=True" in refused.text
    invalid = post(app, {"input_ids": [1], "stream": True, "return_logprob": "maybe"})
    assert invalid.status_code == 422  # the route's own answer to a body it cannot validate


def test_a_body_nested_too_deep_is_handed_to_the_route(http_process: Any) -> None:
    """json.loads raises RecursionError on b"[" * 200000: 0.3.2's middleware crashed on it."""
    app, _ = http_process("0.5.17")
    assert asyncio.run(_raw(app, b"[" * 200000)) == 422
    assert app.state.reached == [b"[" * 200000]


@pytest.mark.parametrize("name", ["frequency_penalty", "presence_penalty",
                                  "repetition_penalty", "min_new_tokens"])
def test_a_penalty_past_floats_range_is_a_400_naming_it_not_a_500(http_process: Any,
                                                                   name: str) -> None:
    """A 400-digit integer: float() raised OverflowError through the middleware (a 500)."""
    app, _ = http_process("0.5.17")
    for stream in (True, False):
        got = post(app, {"input_ids": [1], "stream": stream,
                         "sampling_params": {name: 10**400}})
        assert got.status_code == 400, (stream, got.text)
        assert got.json()["error"]["message"].startswith(
            f"DDTREE speculative decoding refuses {name}=")


def test_an_unexpected_error_in_the_check_hands_the_request_to_the_route(
        http_process: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the check raises besides a refusal, the middleware answers no 500: the route
    gets the request (and the tokenizer manager's hook stands behind it)."""
    from ddtree import admission

    app, _ = http_process("0.5.17")

    def broken(*args: Any, **kwargs: Any) -> None:
        raise ArithmeticError("a check that failed unexpectedly")

    monkeypatch.setattr(admission, "check_request", broken)
    got = asyncio.run(_raw(app, json.dumps({"input_ids": [1], "stream": True}).encode()))
    assert got == 200 and len(app.state.reached) == 1  # the route served it (its hook is the
    # one made at start, which kept the real check)


def test_a_deeply_nested_field_is_decided_without_recursion() -> None:
    from ddtree.admission import Refused, check_request

    unset: Any = [None]
    set_: Any = [1]
    for _ in range(5000):
        unset, set_ = [unset], [set_]
    check_request({"image_data": unset}, {})  # unset at any depth: passes
    with pytest.raises(Refused, match="refuses image_data=<a list nested too deep to show>"):
        check_request({"image_data": set_}, {})


def test_other_algorithms_get_no_middleware_and_stream_as_before(http_process: Any) -> None:
    app, applied = http_process("0.5.17", algorithm="DFLASH")
    assert applied == [] and all(m.cls is not http_admission.StreamAdmission
                                 for m in app.user_middleware)
    got = post(app, {"input_ids": [1], "stream": True, **REFUSED[0][1]})
    assert got.status_code == 200  # DFLASH serves penalties (issue 25's anchor finding)


def test_the_middleware_is_innermost_and_installed_once(web: Any, http_process: Any,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="ddtree_sglang"):
        app, _ = http_process("0.5.23")
    assert "DDTREE: streamed requests are admitted before the stream starts" in caplog.text
    admission_hook.make_init_hook("DDTREE")(None, manager("DDTREE"))  # a second manager
    app.add_middleware(web.CORSMiddleware, allow_origins=["*"])  # SGLang adds more (API key) later
    assert [m.cls for m in app.user_middleware][-1] is http_admission.StreamAdmission
    assert sum(m.cls is http_admission.StreamAdmission for m in app.user_middleware) == 1
    got = post(app, {"text": "hi", "stream": True, **REFUSED[0][1]})
    assert got.status_code == 400


def test_an_app_that_already_started_refuses_ddtree_at_start(http_process: Any,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    app, _ = http_process("0.5.17", algorithm="DFLASH")
    assert post(app, {"input_ids": [1]}).status_code == 200  # the app has started
    with pytest.raises(RuntimeError, match="DDTREE refused: its admission of streamed requests "
                                           "cannot be installed .*already started"):
        admission_hook.make_init_hook("DDTREE")(None, manager("DDTREE"))


def test_an_engine_without_http_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, http_admission.HTTP_MODULE, raising=False)
    assert http_admission.install("DDTREE") is False
    assert admission_hook.make_init_hook("DDTREE")(None, manager("DDTREE")) is None


@pytest.mark.parametrize("release", SUPPORTED)
def test_the_real_generate_route_calls_the_tokenizer_manager_inside_its_stream(
        release: str) -> None:
    """Why the middleware: each release's /generate starts the stream, then calls the tokenizer
    manager; its own error body is ``{"error": {"message": str(e)}}``, the middleware's too."""
    tree = ast.parse(_source(release, "sglang/srt/entrypoints/http_server.py"))
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef)}
    route = next(f for f in funcs.values() if any(
        isinstance(d, ast.Call) and d.args and getattr(d.args[0], "value", None) == "/generate"
        for d in f.decorator_list))
    called = {c.func.id for c in ast.walk(route) if isinstance(c, ast.Call)
              and isinstance(c.func, ast.Name)}
    serve = funcs.get("serve_generate_request") if "serve_generate_request" in called else route
    assert serve is not None
    stream = next(n for n in ast.walk(serve) if isinstance(n, ast.If)
                  and ast.unparse(n.test) == "obj.stream")
    inner = next(n for n in stream.body if isinstance(n, ast.AsyncFunctionDef))
    assert "tokenizer_manager.generate_request(" in ast.unparse(inner)
    assert any(isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "app"
               and ast.unparse(n.value).startswith("FastAPI(") for n in tree.body)
    error = ast.unparse(funcs["_create_error_response"])
    assert "{'error': {'message': str(e)}}" in error
    # FastAPI validates /generate's body into GenerateReqInput (what the middleware builds)
    assert ast.unparse(route.args.args[0].annotation) == "GenerateReqInput"
    # the Vertex route, by its function's name, builds the request and calls /generate's handler
    vertex = ast.unparse(funcs["vertex_generate"])
    assert "req = GenerateReqInput(**inputs, image_data=image_data, " \
           "**vertex_req.parameters or {})" in vertex
    assert "await generate_request(req, raw_request)" in vertex
    assert "'AIP_PREDICT_ROUTE', '/vertex_generate'" in ast.unparse(
        funcs["vertex_generate"].decorator_list[0])


# ---- /v1: the real OpenAIServingBase.handle_request and HookRegistry of each release --------

FAKES = {
    "sglang.srt.entrypoints.openai.encoding_dsv32": {"DS32EncodingError": type(
        "DS32EncodingError", (Exception,), {})},
    "sglang.srt.observability.req_time_stats": {"monotonic_time": lambda: 0.0},
    "sglang.srt.runtime_context": {"get_observability": lambda: None},
    "sglang.srt.server_args": {"ServerArgs": type("ServerArgs", (), {})},  # not ours
    "sglang.srt.parser.template_detection": {"detect_inline_system_support": lambda t: True},
}
# the names anthropic/serving.py and protocol.py import from openai/protocol.py (not ours)
OPENAI_PROTOCOL = ("ChatCompletionRequest", "ChatCompletionResponse",
                   "ChatCompletionStreamResponse", "ResponseFormat", "StreamOptions", "Tool",
                   "ToolChoice", "ToolChoiceFuncName")


@dataclasses.dataclass
class ErrorResponse:  # protocol.ErrorResponse's fields, as create_error_response fills them
    object: str
    message: str
    type: str
    param: Any
    code: int

    def model_dump(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _load(name: str, text: str, monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(text, name.replace(".", "/") + ".py", "exec"), module.__dict__)
    return module


RESPONSES = "sglang/srt/entrypoints/openai/serving_responses.py"


def responses_class(release: str) -> type:
    """``OpenAIServingResponses`` with the release's own ``_generate_with_builtin_tools`` (its
    source, compiled alone) and ``create_error_response``; the rest of the class (harmony, tool
    parsers) is not loaded: the call site is read from the file (test below)."""
    tree = ast.parse(_source(release, RESPONSES))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef)
               and n.name == "OpenAIServingResponses")
    keep = [n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            and n.name in ("_generate_with_builtin_tools", "create_error_response")]
    code = ast.Module(body=[ast.ImportFrom(module="__future__", names=[
        ast.alias(name="annotations")], level=0), ast.ClassDef(
        name="OpenAIServingResponses", bases=[], keywords=[], body=keep, decorator_list=[],
        type_params=[])], type_ignores=[])
    scope: dict[str, Any] = {"__name__": "serving_responses", "ErrorResponse": ErrorResponse,
                             "HTTPStatus": __import__("http").HTTPStatus,
                             "ORJSONResponse": lambda content, status_code: (status_code,
                                                                            content)}
    exec(compile(ast.fix_missing_locations(code), RESPONSES, "exec"), scope)
    return scope["OpenAIServingResponses"]  # type: ignore[no-any-return]


@pytest.fixture(params=SUPPORTED)
def serving(web: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Per release: its real hook_registry and serving_base; the two serving classes as the
    targets the plugin hooks (their conversion's shape is read from the release's files)."""
    release = request.param
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins", "sglang.srt.entrypoints",
                 "sglang.srt.entrypoints.openai", "sglang.srt.managers",
                 "sglang.srt.observability", "sglang.srt.parser",
                 "sglang.srt.entrypoints.anthropic", "sglang.srt.entrypoints.ollama"):
        package = types.ModuleType(name)
        package.__path__ = []
        monkeypatch.setitem(sys.modules, name, package)
    for name, attrs in FAKES.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    cls = real_request_class(release)
    io_struct = types.ModuleType("sglang.srt.managers.io_struct")
    io_struct.GenerateReqInput, io_struct.EmbeddingReqInput = cls, type("E", (), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, io_struct.__name__, io_struct)
    protocol = types.ModuleType("sglang.srt.entrypoints.openai.protocol")
    protocol.ErrorResponse, protocol.OpenAIServingRequest = ErrorResponse, Any  # type: ignore[attr-defined]
    for name in OPENAI_PROTOCOL:
        setattr(protocol, name, type(name, (), {}))
    from pydantic import BaseModel

    protocol.PDRoutingFields = type("PDRoutingFields", (BaseModel,), {})  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, protocol.__name__, protocol)
    registry = _load("sglang.srt.plugins.hook_registry",
                     _source(release, "sglang/srt/plugins/hook_registry.py"), monkeypatch)
    base = _load("sglang.srt.entrypoints.openai.serving_base",
                 _source(release, "sglang/srt/entrypoints/openai/serving_base.py"), monkeypatch)
    for adapter in ("anthropic", "ollama"):  # /v1/messages; /api/generate, /api/chat
        for name in ("protocol", "serving"):
            _load(f"sglang.srt.entrypoints.{adapter}.{name}",
                  _source(release, f"sglang/srt/entrypoints/{adapter}/{name}.py"), monkeypatch)
    responses = types.ModuleType("sglang.srt.entrypoints.openai.serving_responses")
    responses.OpenAIServingResponses = responses_class(release)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, responses.__name__, responses)
    started: list[Any] = []

    def serving_class(name: str) -> type:
        def convert(self: Any, request: Any, raw_request: Any = None) -> tuple[Any, Any]:
            return cls(input_ids=[1, 2], stream=request.stream, **request.fields), request

        async def streaming(self: Any, adapted: Any, processed: Any, raw: Any) -> str:
            started.append(adapted)
            return "stream started"

        async def plain(self: Any, adapted: Any, processed: Any, raw: Any) -> str:
            started.append("served")
            return "served"

        return type(name, (base.OpenAIServingBase,), {
            "_request_id_prefix": lambda self: "x-", "_convert_to_internal_request": convert,
            "_handle_streaming_request": streaming, "_handle_non_streaming_request": plain,
            "_validate_request": lambda self, request: None})

    classes = {}
    for target in http_admission.SERVING_TARGETS:
        module_name, class_name, _ = target.rsplit(".", 2)
        module = types.ModuleType(module_name)
        classes[class_name] = serving_class(class_name)
        setattr(module, class_name, classes[class_name])
        monkeypatch.setitem(sys.modules, module_name, module)
    yield types.SimpleNamespace(release=release, registry=registry.HookRegistry,
                                classes=classes, started=started)
    registry.HookRegistry.reset()


def _handle(serving_cls: type, algorithm: str, stream: bool, fields: dict[str, Any]) -> Any:
    tm = manager(algorithm)
    tm.request_logger = types.SimpleNamespace(log_requests=False, log_requests_level=0)
    request = types.SimpleNamespace(stream=stream, fields=fields)
    return asyncio.run(serving_cls(tm).handle_request(request, None))


@pytest.mark.parametrize("stream", [True, False])
def test_v1_refusals_are_a_400_from_the_real_handle_request_before_any_stream(
        serving: Any, stream: bool) -> None:
    http_admission.hook_serving("DDTREE")
    assert set(http_admission.SERVING_TARGETS) <= serving.registry._patched
    for cls in serving.classes.values():
        for name, fields in REFUSED:
            got = _handle(cls, "DDTREE", stream, fields)
            assert got.status_code == 400, (serving.release, name)
            doc = json.loads(got.body)
            assert doc["object"] == "error" and doc["code"] == 400
            assert doc["message"].startswith(f"DDTREE speculative decoding refuses {name}=")
        assert _handle(cls, "DDTREE", stream, NEUTRAL) == ("stream started" if stream
                                                           else "served")
        assert _handle(cls, "DFLASH", stream, REFUSED[0][1]) == ("stream started" if stream
                                                                 else "served")
    assert len(serving.started) == 4  # neutral + DFLASH, two classes
    http_admission.hook_serving("DDTREE")  # again (a second manager): one hook per target
    assert all(len(serving.registry._hooks[t]) == 1 for t in http_admission.SERVING_TARGETS)


def _messages(serving: Any, algorithm: str, stream: bool, fields: dict[str, Any]) -> Any:
    """The release's real ``AnthropicServing`` handler (/v1/messages, after its own conversion
    of the Anthropic request to a chat request) over the chat serving class."""
    adapter = sys.modules["sglang.srt.entrypoints.anthropic.serving"].AnthropicServing
    tm = manager(algorithm)
    tm.create_abort_task = lambda adapted: None
    anthropic = adapter.__new__(adapter)
    anthropic.openai_serving_chat = serving.classes["OpenAIServingChat"](tm)
    chat = types.SimpleNamespace(stream=stream, fields=fields)
    handler = anthropic._handle_streaming if stream else anthropic._handle_non_streaming
    return asyncio.run(handler(chat, types.SimpleNamespace(stream=stream), None))


@pytest.mark.parametrize("stream", [True, False])
def test_v1_messages_refusals_are_the_adapters_400_naming_ddtree(serving: Any,
                                                                 stream: bool) -> None:
    """Anthropic's adapter calls the chat conversion inside ``except Exception`` (a 500
    "Internal server error" up to 0.5.21): the refusal is its 400 invalid_request_error."""
    http_admission.hook_serving("DDTREE")
    assert set(http_admission.ANTHROPIC_TARGETS) <= serving.registry._patched
    for name, fields in REFUSED:
        got = _messages(serving, "DDTREE", stream, fields)
        assert got.status_code == 400, (serving.release, name)
        doc = json.loads(got.body)
        assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
        assert doc["error"]["message"].startswith(f"DDTREE speculative decoding refuses {name}=")
    assert serving.started == []
    neutral = _messages(serving, "DDTREE", stream, NEUTRAL)
    dflash = _messages(serving, "DFLASH", stream, REFUSED[0][1])
    if stream:
        assert neutral.media_type == dflash.media_type == "text/event-stream"
    assert len(serving.started) == (0 if stream else 2)  # the stream's body runs when read


def test_v1_messages_without_the_around_hooks_a_refusal_was_a_500_up_to_0_5_21(
        serving: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The regression the AROUND hooks fix: only the conversion hook, as plugin 0.3.2 had."""
    monkeypatch.setattr(http_admission, "ANTHROPIC_TARGETS", ())
    http_admission.hook_serving("DDTREE")
    for stream in (True, False):
        got = _messages(serving, "DDTREE", stream, REFUSED[0][1])
        old = serving.release in ("0.5.17", "0.5.19", "0.5.21")
        assert got.status_code == (500 if old else 400)
        assert ("DDTREE" in json.loads(got.body)["error"]["message"]) is not old


def _ollama(serving: Any, algorithm: str, route: str, stream: bool, options: dict[str, Any]
            ) -> Any:
    """The release's real ``OllamaServing`` (its route handler, with the request parsed by its
    real protocol), over a tokenizer manager that checks as the plugin's hook does, then
    yields one chunk; returns the response, the stream's body read."""
    ollama = sys.modules["sglang.srt.entrypoints.ollama.serving"]
    protocol = sys.modules["sglang.srt.entrypoints.ollama.protocol"]
    check = admission_hook.make_hook("DDTREE")
    tm = manager(algorithm)
    tm.served_model_name = "m"
    tm.tokenizer = types.SimpleNamespace(apply_chat_template=lambda *a, **k: [1, 2])

    async def generate_request(obj: Any, raw: Any = None) -> Any:
        check(tm, obj)
        serving.started.append(obj)
        yield {"text": "x", "meta_info": {"finish_reason": {"type": "stop"},
                                          "prompt_tokens": 2, "completion_tokens": 1}}

    tm.generate_request = generate_request
    body = {"model": "m", "stream": stream, "options": options}
    if route == "chat":
        request = protocol.OllamaChatRequest(messages=[{"role": "user", "content": "hi"}], **body)
        handle = ollama.OllamaServing(tm).handle_chat
    else:
        request = protocol.OllamaGenerateRequest(prompt="hi", **body)
        handle = ollama.OllamaServing(tm).handle_generate

    async def go() -> Any:
        got = await handle(request, None)
        if hasattr(got, "body_iterator"):
            got.text = b"".join([c async for c in got.body_iterator]).decode()
        return got

    return asyncio.run(go())


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("route", ["chat", "generate"])
def test_ollama_refusals_are_a_400_before_any_stream(serving: Any, route: str,
                                                     stream: bool) -> None:
    http_admission.hook_serving("DDTREE")
    assert set(http_admission.OLLAMA_TARGETS) <= serving.registry._patched
    for name in ("frequency_penalty", "presence_penalty"):
        got = _ollama(serving, "DDTREE", route, stream, {name: 1.5})
        assert got.status_code == 400, (serving.release, name)
        assert json.loads(got.body)["error"].startswith(
            f"DDTREE speculative decoding refuses {name}=1.5")
    assert serving.started == []
    neutral = _ollama(serving, "DDTREE", route, stream, {"frequency_penalty": 0, "top_k": 2})
    dflash = _ollama(serving, "DFLASH", route, stream, {"frequency_penalty": 1.5})
    for got in (neutral, dflash):  # a stream, or the response model FastAPI answers 200
        assert json.loads(got.text.splitlines()[-1])["done"] if stream else got.done
    assert len(serving.started) == 2


def test_ollama_without_the_hooks_a_refusal_was_a_cut_stream_or_an_uncaught_error(
        serving: Any) -> None:
    with pytest.raises(ValueError, match="DDTREE speculative decoding refuses"):
        _ollama(serving, "DDTREE", "generate", True, {"frequency_penalty": 1.5})  # mid-stream
    with pytest.raises(ValueError, match="DDTREE speculative decoding refuses"):
        _ollama(serving, "DDTREE", "chat", False, {"frequency_penalty": 1.5})  # uncaught: 500


def _responses(serving: Any, algorithm: str, fields: dict[str, Any]) -> Any:
    """``create_responses``'s call site (read from the file below): the generator made inside
    ``except ValueError: return self.create_error_response(str(e))``, then iterated."""
    cls = sys.modules["sglang.srt.entrypoints.openai.serving_responses"].OpenAIServingResponses
    tm = manager(algorithm)

    async def generate_request(obj: Any, raw: Any = None) -> Any:
        serving.started.append(obj)
        yield {"text": "x"}

    tm.generate_request = generate_request
    responses = cls()
    responses.tokenizer_manager = tm
    context = types.SimpleNamespace(append_output=lambda out: None,
                                    need_builtin_tool_call=lambda: False)
    adapted = real_request_class(serving.release)(input_ids=[1, 2], **fields)
    try:
        generator = responses._generate_with_builtin_tools("rid", [1, 2], adapted, {}, context,
                                                           raw_request=None, priority=None)
    except ValueError as e:
        return responses.create_error_response(str(e))

    async def drain() -> list[Any]:
        return [out async for out in generator]

    return asyncio.run(drain())


def test_v1_responses_refusals_are_its_400_before_the_generator_runs(serving: Any) -> None:
    http_admission.hook_serving("DDTREE")
    assert http_admission.RESPONSES_TARGET in serving.registry._patched
    for name, fields in REFUSED:
        got = _responses(serving, "DDTREE", {"stream": True, **fields})
        assert isinstance(got, tuple) and got[0] == 400, (serving.release, name)
        doc = got[1]["error"]
        assert doc["type"] == "invalid_request_error" and doc["code"] == 400
        assert doc["message"].startswith(f"DDTREE speculative decoding refuses {name}=")
    assert serving.started == []
    assert len(_responses(serving, "DDTREE", {"stream": True, **NEUTRAL})) == 1
    assert len(_responses(serving, "DFLASH", REFUSED[0][1])) == 1
    assert len(serving.started) == 2


def test_a_responses_module_that_does_not_import_leaves_the_other_hooks_in_place(
        serving: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """SGLang imports serving_responses in its lifespan inside ``except Exception`` (the route is
    then disabled): the server must still start with the other routes' admission."""
    monkeypatch.delitem(sys.modules, "sglang.srt.entrypoints.openai.serving_responses")
    with caplog.at_level("WARNING", logger="ddtree_sglang"):
        http_admission.hook_serving("DDTREE")
    assert "serving_responses does not import (ModuleNotFoundError" in caplog.text
    assert http_admission.RESPONSES_TARGET not in serving.registry._patched
    expected = http_admission.SERVING_TARGETS + http_admission.ANTHROPIC_TARGETS
    assert set(expected + http_admission.OLLAMA_TARGETS) <= serving.registry._patched


def test_v1_responses_without_the_hook_the_refused_request_reached_the_generator(
        serving: Any) -> None:
    assert len(_responses(serving, "DDTREE", {"stream": True, **REFUSED[0][1]})) == 1


@pytest.mark.parametrize("release", SUPPORTED)
def test_the_real_responses_route_makes_its_generator_inside_except_value_error(
        release: str) -> None:
    tree = ast.parse(_source(release, RESPONSES))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef)
               and n.name == "OpenAIServingResponses")
    create = next(n for n in cls.body if isinstance(n, ast.AsyncFunctionDef)
                  and n.name == "create_responses")
    calls = [t for t in ast.walk(create) if isinstance(t, ast.Try) and any(
        "self._generate_with_builtin_tools(" in ast.unparse(s) for s in t.body)]
    assert len(calls) == 1
    handler = calls[0].handlers[0]
    assert ast.unparse(handler.type) == "ValueError"
    assert ast.unparse(handler.body) == "return self.create_error_response(str(e))"
    call = next(c for c in ast.walk(calls[0]) if isinstance(c, ast.Call)
                and ast.unparse(c.func) == "self._generate_with_builtin_tools")
    assert ast.unparse(call.args[2]) == "adapted_request"
    method = next(n for n in cls.body if isinstance(n, ast.AsyncFunctionDef)
                  and n.name == "_generate_with_builtin_tools")
    assert any(isinstance(n, ast.Yield) for n in ast.walk(method))  # an async generator
    assert [a.arg for a in method.args.args][:4] == ["self", "request_id", "request_prompt",
                                                      "adapted_request"]


def test_v1_without_the_hooks_a_stream_would_start(serving: Any) -> None:
    """What the plugin did before: the refused stream reached _handle_streaming_request."""
    for cls in serving.classes.values():
        assert _handle(cls, "DDTREE", True, REFUSED[0][1]) == "stream started"


@pytest.mark.parametrize("release", SUPPORTED)
@pytest.mark.parametrize("path", ["sglang/srt/entrypoints/openai/serving_completions.py",
                                  "sglang/srt/entrypoints/openai/serving_chat.py"])
def test_the_real_serving_classes_convert_synchronously_to_a_generate_request(
        release: str, path: str) -> None:
    tree = ast.parse(_source(release, path))
    targets = {t.rsplit(".", 2)[1] for t in http_admission.SERVING_TARGETS}
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in targets)
    convert = next(n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
                   and n.name == "_convert_to_internal_request")
    assert isinstance(convert, ast.FunctionDef)  # sync: an AFTER hook sees its result
    returns = [n for n in ast.walk(convert) if isinstance(n, ast.Return)]
    assert returns and all(isinstance(r.value, ast.Tuple)
                           and ast.unparse(r.value.elts[0]) == "adapted_request" for r in returns)
    assert "adapted_request = GenerateReqInput(" in ast.unparse(convert)


@pytest.mark.parametrize("release", SUPPORTED)
def test_the_real_tokenizer_manager_keeps_its_server_args(release: str) -> None:
    """The init hook reads ``manager.server_args`` (and the admission hook does too)."""
    tree = ast.parse(_source(release, "sglang/srt/managers/tokenizer_manager.py"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TokenizerManager")
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert "self.server_args = server_args" in ast.unparse(init)
