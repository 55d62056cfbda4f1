"""Sliding-window targets: refused by the window SGLang 0.5.11 applies, never by config.json.

The window SGLang's attention applies is ``ModelRunner.sliding_window_size``; the payload's worker
passes it to ``check_target`` (payload/ddtree/admission.py). Here the real wheel's code decides
it: ModelRunner's own statements that set it (``model_runner.py``), ``is_hybrid_swa_model``
(``configs/model_config.py``) and, per architecture, whether the wheel's model class has
``get_attention_sliding_window_size`` (and that function's body, for gpt-oss), each compiled
alone from the wheel's source. The configs are the public ones' relevant keys (Qwen2.5-7B-Instruct
and Qwen3-8B carry ``sliding_window`` with ``use_sliding_window: false``; gpt-oss-20b's window
is 128).
"""

from __future__ import annotations

import ast
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "payload"))
from ddtree import admission  # noqa: E402
from wheelcache import wheel  # noqa: E402

CONFIGS = {
    "Qwen2.5-7B-Instruct": {"architectures": ["Qwen2ForCausalLM"], "sliding_window": 131072,
                            "use_sliding_window": False, "max_window_layers": 28},
    "Qwen3-8B": {"architectures": ["Qwen3ForCausalLM"], "sliding_window": None,
                 "use_sliding_window": False, "max_window_layers": 36},
    "gpt-oss-20b": {"architectures": ["GptOssForCausalLM"], "sliding_window": 128},
}
MODEL_FILES = {"Qwen2ForCausalLM": "qwen2.py", "Qwen3ForCausalLM": "qwen3.py",
               "GptOssForCausalLM": "gpt_oss.py"}


def _source(zf: zipfile.ZipFile, rel: str) -> ast.Module:
    return ast.parse(zf.read(f"sglang/srt/{rel}").decode())


def _top(tree: ast.Module, name: str) -> ast.stmt:
    return next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Assign))
                and (getattr(n, "name", None) == name
                     or any(getattr(t, "id", None) == name for t in getattr(n, "targets", []))))


def _compiled(nodes: list[ast.stmt], where: str, scope: dict[str, Any]) -> dict[str, Any]:
    exec(compile(ast.fix_missing_locations(ast.Module(body=nodes, type_ignores=[])), where,
                 "exec"), scope)
    return scope


def _applied_window(config: dict[str, Any]) -> int | None:
    """ModelRunner.sliding_window_size for ``config``, by the wheel's own code."""
    with zipfile.ZipFile(wheel("sglang", "0.5.11")) as zf:
        runner = _source(zf, "model_executor/model_runner.py")
        model_config = _source(zf, "configs/model_config.py")
        arch = config["architectures"][0]
        model_file = _source(zf, f"models/{MODEL_FILES[arch]}")
    # ModelRunner's statements: from `self.sliding_window_size = None` through the if/elif chain
    body = next(f for n in ast.walk(runner) if isinstance(n, ast.FunctionDef)
                for f in [n] if any(isinstance(s, ast.Assign) and ast.unparse(s).startswith(
                    "self.sliding_window_size = None") for s in n.body))
    start = next(i for i, s in enumerate(body.body)
                 if ast.unparse(s).startswith("self.sliding_window_size = None"))
    fn = ast.FunctionDef(name="applied", args=ast.arguments(
        posonlyargs=[], args=[ast.arg(arg="self")], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=[*body.body[start:start + 2], ast.parse("return self.sliding_window_size").body[0]],
        decorator_list=[], returns=None, type_params=[])
    scope = _compiled([fn], "model_runner.py", {"logger": types.SimpleNamespace(
        info=lambda *a: None)})
    swa = _compiled([_top(model_config, "MIMO_V2_MODEL_ARCHS"),
                     _top(model_config, "is_hybrid_swa_model")], "model_config.py",
                    {"List": list})["is_hybrid_swa_model"]
    hf = types.SimpleNamespace(**config)
    cls = _top(model_file, arch)
    assert isinstance(cls, ast.ClassDef)
    model = types.SimpleNamespace()
    if any(isinstance(n, ast.FunctionDef) and n.name == "get_attention_sliding_window_size"
           for n in cls.body):
        helper = _compiled([_top(model_file, "get_attention_sliding_window_size")],
                           MODEL_FILES[arch], {})["get_attention_sliding_window_size"]
        model.get_attention_sliding_window_size = lambda: helper(hf)
    mc = types.SimpleNamespace(
        is_hybrid_swa=swa(config["architectures"]),
        sliding_window_size=config.get("sliding_window_size", config.get("sliding_window")),
        attention_chunk_size=config.get("attention_chunk_size"))
    return scope["applied"](types.SimpleNamespace(model=model, model_config=mc))


@pytest.mark.parametrize(("model", "window"), [
    ("Qwen2.5-7B-Instruct", None), ("Qwen3-8B", None), ("gpt-oss-20b", 127)])
def test_the_refusal_keys_on_the_window_sglang_applies(model: str, window: int | None) -> None:
    applied = _applied_window(CONFIGS[model])
    assert applied == window
    why = admission.check_target(model, applied, shadow_linear=False)
    if window is None:
        assert why is None  # served, whatever config.json's sliding_window says
    else:
        assert why is not None and model in why and f"sliding window of {window}" in why
        assert admission.check_target(model, applied, shadow_linear=True) is None


def test_the_worker_passes_the_applied_window() -> None:
    """The 0.5.11 worker calls check_target with ModelRunner.sliding_window_size of its target
    and raises its text at start."""
    src = (ROOT / "payload" / "sglang-0.5.11" / "srt" / "speculative" / "ddtree_worker.py")
    tree = ast.parse(src.read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) == "check_target"]
    assert len(calls) == 1
    assert "self.target_worker.model_runner, 'sliding_window_size'" in ast.unparse(calls[0])
    assert "config" not in ast.unparse(calls[0])
