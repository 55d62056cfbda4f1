"""The plugin's target verify attention (``ddtree_sglang.target_attention``) against each
supported release's real files (tests/wheels.toml; read from the wheel, nothing installed).

What the module relies on, per release, read with ``ast``: SGLang builds every worker's
attention backends before it captures any graph, the target's first; DFLASH's worker has the
``init_attention_backends`` the DDTree worker extends; the triton backend calls its
``extend_attention_fwd`` with the positional layout and only keywords the tree kernel's wrapper
judges (``tree_attention._served``), and copies a verify's mask into its graph buffer at
replay; the graph runner asks SGLang's DFLASH mask policy at capture. Then the policy itself (the
release's own function, executed) answers "no custom mask" for SGLang's triton backend and "a
custom mask" for the backend once :func:`mask_in_graphs` changed it, which is what makes the
verify graphs carry the tree's mask.
"""

from __future__ import annotations

import ast
import logging
import os
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest
from wheelcache import wheel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "payload" / "plugin"))
sys.path.insert(0, str(ROOT / "payload"))

from ddtree_sglang import releases, settings, target_attention  # noqa: E402
from triton_interpret import kernel_device, sglang_extend_kernel  # noqa: E402, F401  (fixtures)

SUPPORTED = sorted(releases.SUPPORTED)


def _source(version: str, rel: str) -> str:
    with zipfile.ZipFile(wheel("sglang", version)) as zf:
        return zf.read(f"sglang/{rel}").decode("utf-8")


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    found = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    assert found, f"no class {name}"
    return found[0]


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    found = [f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == name]
    assert found, f"{cls.name}.{name} is gone"
    return found[0]


def _calls(node: ast.AST, attr: str) -> list[ast.Call]:
    return [c for c in ast.walk(node) if isinstance(c, ast.Call)
            and isinstance(c.func, ast.Attribute) and c.func.attr == attr]


def _call_order(fn: ast.FunctionDef, names: list[str]) -> list[int]:
    return [min(c.lineno for c in _calls(fn, n)) for n in names]


# Keywords of SGLang's extend-kernel calls that do not change what it computes (0.5.19+: the
# extend lengths on the host, for the kernel's launch grid).
HARMLESS = {"extend_seq_lens_cpu"}


def _served_keywords() -> set[str]:
    """The keywords ``tree_attention._served`` looks at (``kwargs.get("NAME"...)``)."""
    tree = ast.parse((ROOT / "payload" / "ddtree" / "tree_attention.py").read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_served")
    return {c.args[0].value for c in _calls(fn, "get")
            if c.args and isinstance(c.args[0], ast.Constant)}


def release_policy(version: str) -> Any:
    """The release's own ``resolve_dflash_verify_mask_policy`` with the set it reads."""
    tree = ast.parse(_source(version, "srt/speculative/dflash_utils.py"))
    keep = [n for n in tree.body if (isinstance(n, ast.FunctionDef)
                                     and n.name == "resolve_dflash_verify_mask_policy")
            or (isinstance(n, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "_DFLASH_VERIFY_SKIP_CUSTOM_MASK_BACKENDS"
                for t in n.targets))]
    assert len(keep) == 2, "the policy or its backend set moved"
    namespace: dict[str, Any] = {"Any": Any}
    exec(compile(ast.Module(body=keep, type_ignores=[]), "dflash_utils.py", "exec"), namespace)
    return namespace["resolve_dflash_verify_mask_policy"]


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_release_builds_backends_before_graphs_and_calls_the_extend_kernel_as_wrapped(
        version: str) -> None:
    scheduler = _class(ast.parse(_source(version, "srt/managers/scheduler.py")), "Scheduler")
    init = _method(scheduler, "init_model_worker")
    backends, graphs = _call_order(init, ["init_all_attention_backends", "init_all_cuda_graphs"])
    assert backends < graphs
    both = _method(scheduler, "init_all_attention_backends")
    calls = [c for c in _calls(both, "init_attention_backends")
             if isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Attribute)]
    assert [c.func.value.attr for c in calls] == ["tp_worker", "draft_worker"]  # type: ignore[attr-defined]
    worker = _class(ast.parse(_source(version, "srt/speculative/dflash_worker_v2.py")),
                    "DFlashWorkerV2")
    _method(worker, "init_attention_backends")

    triton = _class(ast.parse(_source(version, "srt/layers/attention/triton_backend.py")),
                    target_attention.BACKEND_CLASS)
    init_src = ast.unparse(_method(triton, "__init__"))
    assert "self.extend_attention_fwd = " in init_src
    served = _served_keywords() | HARMLESS
    # the kernel's calls: direct, or (0.5.23) through _forward_extend_kernel(layer, *same)
    extend_calls = [(c, c.args) for c in _calls(triton, "extend_attention_fwd")]
    extend_calls += [(c, c.args[1:]) for c in _calls(triton, "_forward_extend_kernel")]
    masked = [(c, args) for c, args in extend_calls if len(args) > 9
              and not (isinstance(args[9], ast.Constant) and args[9].value is None)]
    assert masked  # the calls that pass a mask (the others the wrapper never serves)
    for call, args in masked:  # SGLang's positional layout, and keywords the wrapper judges
        assert len(args) == 16, ast.unparse(call)[:200]
        assert ast.unparse(args[9]).endswith("custom_mask")
        assert {k.arg for k in call.keywords} <= served, ast.unparse(call)[:400]
    replay = ast.unparse(_method(triton, "_update_target_verify_buffers"))
    assert "custom_mask[:spec_info.custom_mask.shape[0]] = spec_info.custom_mask" in replay

    runner = ast.parse(_source(version, "srt/model_executor/runner/decode_cuda_graph_runner.py"))
    spec_info = ast.unparse(_method(_class(runner, "DecodeCudaGraphRunner"), "get_spec_info"))
    # imported inside the method: the policy is looked up at capture, on the changed backend
    assert "from sglang.srt.speculative.dflash_utils import" in spec_info
    assert "resolve_dflash_verify_mask_policy(self.model_runner.attn_backend)" in spec_info
    config = _class(ast.parse(_source(version, "srt/configs/model_config.py")), "ModelConfig")
    for name in ("get_num_attention_heads", "get_num_kv_heads"):
        _method(config, name)


def _packages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty SGLang packages, and the wrapper classes 0.5.23's policy imports when called (no
    target backend here is one of them)."""
    for name in ("sglang", "sglang.srt", "sglang.srt.speculative", "sglang.srt.layers",
                 "sglang.srt.layers.attention", "sglang.srt.model_executor"):
        module = types.ModuleType(name)
        module.__path__ = []  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, name, module)
    for name, attr, value in (
            ("sglang.srt.layers.attention.hybrid_attn_backend", "HybridAttnBackend",
             type("HybridAttnBackend", (), {})),
            ("sglang.srt.layers.attention.tbo_backend", "TboAttnBackend",
             type("TboAttnBackend", (), {})),
            ("sglang.srt.model_executor.forward_batch_info", "ForwardMode",
             types.SimpleNamespace(TARGET_VERIFY="target_verify"))):
        module = types.ModuleType(name)
        setattr(module, attr, value)
        monkeypatch.setitem(sys.modules, name, module)


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_changed_backend_gets_the_mask_under_the_release_policy(
        version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    policy = release_policy(version)
    _packages(monkeypatch)
    utils = types.ModuleType("sglang.srt.speculative.dflash_utils")
    utils.resolve_dflash_verify_mask_policy = policy  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, utils.__name__, utils)
    monkeypatch.setattr(sys.modules["sglang.srt.speculative"], "dflash_utils", utils,
                        raising=False)

    triton_cls = type(target_attention.BACKEND_CLASS, (), {"extend_attention_fwd": None})
    backend = triton_cls()
    runner = types.SimpleNamespace(attn_backend=backend, decode_attn_backend=None)
    assert policy(backend) == (target_attention.BACKEND_CLASS, False)  # DFLASH: no mask
    assert target_attention.mask_in_graphs(runner) is None
    assert isinstance(backend, triton_cls) and type(backend).__name__ == "DDTreeTritonAttnBackend"
    assert policy(backend) == ("DDTreeTritonAttnBackend", True)
    assert target_attention.mask_in_graphs(runner) is None  # twice: the same class, not nested
    assert type(backend).__mro__[1] is triton_cls

    other = types.SimpleNamespace(attn_backend=type("FlashInferAttnBackend", (), {})(),
                                  decode_attn_backend=None)
    assert target_attention.mask_in_graphs(other) == "the target's attention backend is not triton"
    late = types.SimpleNamespace(attn_backend=triton_cls(), decode_attn_backend=None,
                                 decode_cuda_graph_runner=object())
    assert "captured before" in str(target_attention.mask_in_graphs(late))
    assert type(late.attn_backend) is triton_cls


def test_a_policy_that_still_refuses_leaves_the_backend_as_it_was(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _packages(monkeypatch)
    utils = types.ModuleType("sglang.srt.speculative.dflash_utils")
    utils.resolve_dflash_verify_mask_policy = lambda b: (type(b).__name__, False)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, utils.__name__, utils)
    monkeypatch.setattr(sys.modules["sglang.srt.speculative"], "dflash_utils", utils,
                        raising=False)
    triton_cls = type(target_attention.BACKEND_CLASS, (), {})
    runner = types.SimpleNamespace(attn_backend=triton_cls(), decode_attn_backend=None)
    assert "still answers no custom mask" in str(target_attention.mask_in_graphs(runner))
    assert type(runner.attn_backend) is triton_cls


def _switches(env: dict[str, str]) -> dict[str, Any]:
    """The two switches as the worker passes them (``settings.from_env``, checked at start)."""
    got = settings.from_env(env)
    return {"tree_attention": got.tree_attention, "verify_graph": got.verify_graph}


def _prepare(runner: Any, env: dict[str, str], *, graphs_on: bool = True,
             tree_mode: bool = True) -> bool:
    return target_attention.prepare(runner, tree_mode=tree_mode, n=16, tp_size=1,
                                    graphs_on=graphs_on, **_switches(env))


DEFAULT_ON = "default; SGLANG_DDTREE_TREE_ATTENTION=0 turns it off"
GRAPHS_ON = "default; SGLANG_DDTREE_VERIFY_GRAPH=0 turns it off"


@pytest.mark.parametrize(("env", "graphs_on", "said"), [
    # both off by name: the plugin as proven on the H200 in call 2 (6ebdc14); perf-8b's -prev
    ({"SGLANG_DDTREE_VERIFY_GRAPH": "0", "SGLANG_DDTREE_TREE_ATTENTION": "0"}, True,
     "tree kernel off (SGLANG_DDTREE_TREE_ATTENTION=0); eager (SGLANG_DDTREE_VERIFY_GRAPH=0)"),
    ({"SGLANG_DDTREE_VERIFY_GRAPH": "1", "SGLANG_DDTREE_TREE_ATTENTION": "0"}, False,
     "tree kernel off (SGLANG_DDTREE_TREE_ATTENTION=0); eager (CUDA graphs are off)"),
    ({"SGLANG_DDTREE_TREE_ATTENTION": "0"}, False,
     "tree kernel off (SGLANG_DDTREE_TREE_ATTENTION=0); eager (CUDA graphs are off)"),
])
def test_prepare_keeps_sglangs_kernel_and_the_eager_verify_when_switched_off(
        env: dict[str, str], graphs_on: bool, said: str,
        caplog: pytest.LogCaptureFixture) -> None:
    extend = object()
    backend = type(target_attention.BACKEND_CLASS, (), {"extend_attention_fwd": extend})()
    runner = types.SimpleNamespace(attn_backend=backend, decode_attn_backend=None)
    with caplog.at_level(logging.INFO, logger=target_attention.__name__):
        assert _prepare(runner, env, graphs_on=graphs_on) is False
    assert f"DDTREE target verify: {said}" in caplog.text
    assert type(backend).__name__ == target_attention.BACKEND_CLASS  # graphs without the mask
    assert backend.extend_attention_fwd is extend  # SGLang's kernel, not even wrapped


def _kernel(monkeypatch: pytest.MonkeyPatch, verdict: str = "on") -> list[dict[str, Any]]:
    """The tree kernel's module as the plugin calls it (its kernel needs triton and a GPU; its
    own tests are tests/test_ddtree_tree_attention.py), whose check says ``verdict`` (``raise``:
    the check fails to run), and SGLang's first supported release's mask policy; the shapes the
    check was given."""
    checked: list[dict[str, Any]] = []

    def wrap(fwd: Any, on: bool | None = None) -> Any:
        def wrapped(*a: Any, **k: Any) -> Any:
            return fwd(*a, **k)
        # the core's own default reads the environment (an empty variable is off there)
        if on is None:
            on = os.environ.get("SGLANG_DDTREE_TREE_ATTENTION", "1") not in ("0", "")
        wrapped.ddtree_state = {"on": on, "checked": not on}  # type: ignore[attr-defined]
        return wrapped

    def self_check(fwd: Any, **shape: Any) -> str:
        if not fwd.ddtree_state["on"]:
            return "off"  # as the core's: no check runs
        checked.append(shape)
        if verdict == "raise":
            raise RuntimeError("no kernel")
        fwd.ddtree_state.update(checked=True, on=verdict == "on")
        return verdict

    kernel = types.ModuleType("ddtree.tree_attention")
    kernel.wrap, kernel.self_check = wrap, self_check  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, kernel.__name__, kernel)
    _packages(monkeypatch)
    utils = types.ModuleType("sglang.srt.speculative.dflash_utils")
    utils.resolve_dflash_verify_mask_policy = release_policy(SUPPORTED[0])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, utils.__name__, utils)
    monkeypatch.setattr(sys.modules["sglang.srt.speculative"], "dflash_utils", utils,
                        raising=False)
    return checked


def _runner(extend: Any) -> Any:
    backend = type(target_attention.BACKEND_CLASS, (), {"extend_attention_fwd": extend})()
    config = types.SimpleNamespace(get_num_attention_heads=lambda tp: 32,
                                   get_num_kv_heads=lambda tp: 8, head_dim=128)
    return types.SimpleNamespace(attn_backend=backend, decode_attn_backend=None,
                                 model_config=config, device="cuda", dtype="bfloat16")


@pytest.mark.parametrize(("env", "said"), [
    # plugin 0.3.4: both on by default (proven lossless on the H200, session 8 call 1)
    ({}, f"tree kernel on ({DEFAULT_ON}); CUDA graphs with the tree's mask ({GRAPHS_ON})"),
    ({"SGLANG_DDTREE_TREE_ATTENTION": "1", "SGLANG_DDTREE_VERIFY_GRAPH": "1"},
     "tree kernel on (SGLANG_DDTREE_TREE_ATTENTION=1); CUDA graphs with the tree's mask "
     "(SGLANG_DDTREE_VERIFY_GRAPH=1)"),
])
def test_prepare_serves_both_by_default_and_when_set(
        env: dict[str, str], said: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    checked = _kernel(monkeypatch)
    extend = object()
    runner = _runner(extend)
    backend = runner.attn_backend
    with caplog.at_level(logging.INFO, logger=target_attention.__name__):
        assert _prepare(runner, env) is True
    assert f"DDTREE target verify: {said}" in caplog.text
    assert backend.extend_attention_fwd is not extend and checked == [
        {"device": "cuda", "heads": 32, "kv_heads": 8, "head_dim": 128, "n": 16,
         "dtype": "bfloat16"}]
    assert backend.extend_attention_fwd.ddtree_state["on"]
    assert type(backend).__name__ == target_attention.GRAPH_CLASS

    # the graphs alone: SGLang's kernel unwrapped, the verify graphs with the mask
    plain = type(target_attention.BACKEND_CLASS, (), {"extend_attention_fwd": extend})()
    runner = types.SimpleNamespace(attn_backend=plain, decode_attn_backend=None)
    assert _prepare(runner, {**env, "SGLANG_DDTREE_TREE_ATTENTION": "0"}) is True
    assert plain.extend_attention_fwd is extend
    assert type(plain).__name__ == target_attention.GRAPH_CLASS


def test_the_default_tree_kernel_is_checked_against_sglangs_real_kernel_then_serves(
        sglang_extend_kernel: Any, kernel_device: str,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    """The tree kernel's path of prepare with the real kernels (on a GPU, or on the CPU in
    Triton's interpreter): SGLang 0.5.17's extend kernel (the wheel's file) on a triton backend,
    the payload's tree kernel wrapped before it and self-checked against it at the model's shape,
    then a verify block through the backend served by the tree kernel alone; a backend whose
    kernel the tree kernel disagrees with keeps its own."""
    import torch
    from test_ddtree_tree_attention import BLOCK, _args, make

    calls: list[int] = []

    def sglangs(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return sglang_extend_kernel(*a, **k)

    n, heads, kv_heads, dim = BLOCK
    dtype = torch.bfloat16 if kernel_device == "cuda" else torch.float32
    config = types.SimpleNamespace(get_num_attention_heads=lambda tp: heads,
                                   get_num_kv_heads=lambda tp: kv_heads, head_dim=dim)

    def runner(extend: Any) -> Any:
        backend = type(target_attention.BACKEND_CLASS, (), {})()
        backend.extend_attention_fwd = extend  # an attribute of SGLang's backend object
        return types.SimpleNamespace(attn_backend=backend, decode_attn_backend=None,
                                     model_config=config, device=kernel_device, dtype=dtype)

    env: dict[str, str] = {}  # the default (plugin 0.3.4): the tree kernel on
    served = runner(sglangs)
    with caplog.at_level(logging.INFO, logger=target_attention.__name__):
        assert target_attention.prepare(served, tree_mode=True, n=n, tp_size=1, graphs_on=False,
                                        **_switches(env)) is False  # no graphs: eager verifies
    assert f"DDTREE target verify: tree kernel on ({DEFAULT_ON}); eager (CUDA graphs are off)" \
        in caplog.text
    assert calls == [1]  # the self-check ran SGLang's kernel once
    d = make(2, *BLOCK, [5, 130], seed=23)
    o = torch.zeros_like(d["q"])
    served.attn_backend.extend_attention_fwd(*_args(d, o, n))
    assert calls == [1]  # the verify block went to the tree kernel alone
    assert float((o.float().cpu() - d["want"]).abs().max()) < (2e-2 if dtype != torch.float32
                                                               else 1e-4)

    caplog.clear()
    kept = runner(lambda *a, **k: a[3].fill_(7.0))  # a kernel the tree kernel disagrees with
    with caplog.at_level(logging.INFO, logger=target_attention.__name__):
        target_attention.prepare(kept, tree_mode=True, n=n, tp_size=1, graphs_on=False,
                                 **_switches(env))
    assert "DDTREE target verify: tree kernel off (its start-up check failed: SGLang's extend " \
           f"kernel serves; {DEFAULT_ON})" in caplog.text
    assert kept.attn_backend.extend_attention_fwd.ddtree_state == {"on": False, "checked": True}


def test_an_empty_switch_is_the_default_and_the_kernel_is_checked_and_serves(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """``SGLANG_DDTREE_TREE_ATTENTION=`` (a unit's empty Environment= value) is the default, on:
    the kernel is wrapped on, checked and serves; the core's own reading of the environment (an
    empty value is off for the patch set) must not turn it off behind the log's back."""
    monkeypatch.setenv("SGLANG_DDTREE_TREE_ATTENTION", "")
    checked = _kernel(monkeypatch)
    runner = _runner(object())
    with caplog.at_level(logging.INFO, logger=target_attention.__name__):
        _prepare(runner, {"SGLANG_DDTREE_TREE_ATTENTION": ""})
    assert len(checked) == 1
    assert f"DDTREE target verify: tree kernel on ({DEFAULT_ON})" in caplog.text
    assert runner.attn_backend.extend_attention_fwd.ddtree_state == {"on": True, "checked": True}


@pytest.mark.parametrize(("verdict", "said"), [
    ("off", "off (its start-up check failed: SGLang's extend kernel serves"),
    ("raise", "off (the check could not run: RuntimeError: no kernel"),
])
def test_a_failed_start_up_check_leaves_sglangs_kernel_serving_by_default(
        verdict: str, said: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    _kernel(monkeypatch, verdict)
    runner = _runner(object())
    with caplog.at_level(logging.INFO, logger=target_attention.__name__):
        assert _prepare(runner, {}) is True  # the verify graphs do not depend on the kernel
    assert f"DDTREE target verify: tree kernel {said}; {DEFAULT_ON}); CUDA graphs with the " \
           f"tree's mask ({GRAPHS_ON})" in caplog.text
    # the wrapper stays in place, off: every call goes to SGLang's kernel
    assert runner.attn_backend.extend_attention_fwd.ddtree_state["on"] is False


def test_prepare_leaves_shadow_linear_to_dflash() -> None:
    backend = type(target_attention.BACKEND_CLASS, (), {})()
    runner = types.SimpleNamespace(attn_backend=backend, decode_attn_backend=None)
    env = {"SGLANG_DDTREE_TREE_ATTENTION": "1", "SGLANG_DDTREE_VERIFY_GRAPH": "1"}
    assert _prepare(runner, env, tree_mode=False) is False
    assert type(backend).__name__ == target_attention.BACKEND_CLASS


def test_graphs_captured_on_another_backend_are_not_trusted_with_the_mask() -> None:
    triton_cls = type(target_attention.BACKEND_CLASS, (), {})
    changed = type(target_attention.GRAPH_CLASS, (triton_cls,), {})()
    no_graphs = types.SimpleNamespace(attn_backend=changed, decode_cuda_graph_runner=None)
    assert target_attention.graphs_hold_mask(no_graphs) is None  # eager verifies: the mask
    good = types.SimpleNamespace(attn_backend=changed,
                                 decode_cuda_graph_runner=types.SimpleNamespace(attn_backend=changed))
    assert target_attention.graphs_hold_mask(good) is None
    stale = types.SimpleNamespace(
        attn_backend=changed, decode_cuda_graph_runner=types.SimpleNamespace(
            attn_backend=triton_cls()))
    assert target_attention.graphs_hold_mask(stale) == \
        "the target's graphs were captured on TritonAttnBackend"
