"""SGLang 0.5.11 for benchmarks/ddtree_host_ops.py: the wheel, patched as deployed, over fakes.

The real wheel's files with payload.yaml's patches applied and files copied; the payload's
modules and 0.5.11's ``dflash_info``/``dflash_utils`` imported over small fakes of SGLang's
GPU-only modules (as in tests/test_payload_integration.py's ``verify_mods``); DFLASH's round
tail and methods compiled from the patched ``dflash_worker.py``. The allocator does what
0.5.11's page-size-1 allocator does; the req->token writer and ``_fused_norm_rope`` count as
their one Triton launch each.
"""

from __future__ import annotations

import ast
import logging
import shutil
import subprocess
import sys
import types
import zipfile
from enum import IntEnum
from pathlib import Path
from typing import Any

import torch
import yaml
from host_ops_counter import Session

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = ROOT / "payload"
WHEEL = "sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl"


def find_wheel(given: str | None) -> Path:
    sys.path.insert(0, str(ROOT))
    from ddtree_deploy import xdg as paths

    places = [Path(given)] if given else []
    places += [paths.cache_dir() / "lab" / "wheels" / "real" / WHEEL, Path("/tmp/wh") / WHEEL,  # noqa: S108 (read only)
               paths.cache_dir() / "ddtree-deploy" / "real-wheels" / "wheelhouse" / "cp311" / WHEEL]
    for place in places:
        if place.is_file():
            return place
    raise SystemExit(f"{WHEEL} not found (looked in {', '.join(map(str, places))}); "
                     "pass --wheel PATH")


def patched_package(wheel: Path, root: Path, payload: Path = PAYLOAD) -> Path:
    """The wheel's sglang/ with payload.yaml's patches applied and files copied (as deployed)."""
    spec = yaml.safe_load((payload / "payload.yaml").read_text())["sglang"]["0.5.11"]
    with zipfile.ZipFile(wheel) as zf:
        # the whole package: a list of folders goes stale as the payload patches more files
        zf.extractall(root, [n for n in zf.namelist() if n.startswith("sglang/")])
    pkg = root / "sglang"
    for item in spec["patches"]:
        subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(payload / item["patch"])],
                       cwd=pkg, check=True, capture_output=True)
    for item in spec["files"]:
        shutil.copyfile(payload / item["source"], pkg / item["target"])
    return pkg


def _stub(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def _method_source(path: Path, cls: str, name: str) -> ast.FunctionDef:
    tree = ast.parse(path.read_text())
    klass = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    return next(n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name)


def dflash_tail(path: Path, env: dict[str, Any]) -> Any:
    """The patched ``_prepare_for_speculative_decoding`` from the draft forward's output on
    (``draft_hidden = draft_logits_output.hidden_states`` to the end), as a function."""
    method = _method_source(path, "DFlashWorker", "_prepare_for_speculative_decoding")
    first = next(i for i, s in enumerate(method.body)
                 if ast.unparse(s).startswith("draft_hidden = draft_logits_output.hidden_states"))
    fn = ast.parse("def _tail(self, batch, draft_logits_output, bs, block_ids, positions_2d, "
                   "lm_head):\n    pass\n").body[0]
    assert isinstance(fn, ast.FunctionDef)
    fn.body = method.body[first:]
    module = ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))
    exec(compile(module, str(path), "exec"), env)
    return env["_tail"]


def fused_norm_rope(session: Session) -> Any:
    """0.5.11's ``_fused_norm_rope`` (one Triton launch: K's RMSNorm and RoPE, V copied) as its
    launch, with a CPU stand-in's outputs (``[tokens, kv_heads, head_dim]`` K and V)."""
    def fn(kv: torch.Tensor, weight: Any, cos_sin: Any, positions: torch.Tensor,
           heads: int, head_dim: int, *rest: Any) -> tuple[torch.Tensor, torch.Tensor]:
        session.launch("fused_norm_rope")
        with session.function.pause():
            k, v = kv.view(kv.shape[0], 2, heads, head_dim).unbind(1)
            out = (k + positions.view(-1, 1, 1).to(k.dtype), v.clone())
        session.tracker.add(out)
        return out
    return fn


def dflash_method(path: Path, name: str, env: dict[str, Any]) -> Any:
    fn = _method_source(path, "DFlashWorker", name)
    module = ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))
    exec(compile(module, str(path), "exec"), env)
    return env[name]


class TritonAttnBackend:  # the name resolve_dflash_verify_mask_policy reads
    pass


class Alloc:
    """0.5.11's page-size-1 TokenToKVPoolAllocator: alloc = two slices, free = one cat."""

    def __init__(self, size: int) -> None:
        self.free_pages = torch.arange(1, size + 1, dtype=torch.int64)
        self.token_to_kv_pool_allocator = self

    def alloc(self, need: int) -> torch.Tensor:
        select = self.free_pages[:need]
        self.free_pages = self.free_pages[need:]
        return select

    def free(self, index: torch.Tensor) -> None:
        if index.numel() == 0:
            return
        self.free_pages = torch.cat((self.free_pages, index))


def load(pkg: Path, session: Session) -> types.SimpleNamespace:
    """Import the payload's modules and 0.5.11's dflash_info/dflash_utils over small fakes."""

    class Capture(IntEnum):
        NULL = 0
        FULL = 1

    def unused(*a: Any, **k: Any) -> None:
        raise AssertionError("not on the page_size 1 greedy path")

    def assign(pool_idx: Any, req_to_token: Any, start: Any, end: Any, locs: Any, bs: int) -> None:
        session.launch("assign_req_to_token_pool")  # one Triton kernel in SGLang
        with session.function.pause():
            s, e = start.tolist(), end.tolist()
            offset = 0
            for b in range(bs):
                req_to_token[int(pool_idx[b]), s[b]:e[b]] = locs[offset:offset + e[b] - s[b]]
                offset += e[b] - s[b]

    mode = types.SimpleNamespace(is_idle=lambda: False)
    forward_mode = types.SimpleNamespace(TARGET_VERIFY=mode, IDLE=None)
    group = types.SimpleNamespace(world_size=1)
    stubs: dict[str, dict[str, Any]] = {
        "sglang.srt.layers.attention.utils": {"create_flashinfer_kv_indices_triton": unused},
        "sglang.srt.layers.logits_processor": {"LogitsProcessorOutput": object},
        "sglang.srt.layers.sampler": {"apply_custom_logit_processor": unused},
        "sglang.srt.layers.quantization.unquant": {"UnquantizedLinearMethod": object},
        "sglang.srt.utils": {"is_cuda": lambda: False, "is_musa": lambda: False},
        "sglang.srt.managers.schedule_batch": {"ScheduleBatch": object},
        "sglang.srt.mem_cache.common": {"alloc_token_slots": lambda cache, n: cache.alloc(n),
                                        "alloc_paged_token_slots_extend": unused,
                                        "get_last_loc": unused},
        "sglang.srt.model_executor.forward_batch_info": {"CaptureHiddenMode": Capture,
                                                         "ForwardMode": forward_mode},
        "sglang.srt.speculative.spec_utils": {"assign_req_to_token_pool_func": assign},
        "sglang.srt.distributed": {"get_tp_group": lambda: group},
        "sglang.srt.server_args": {"ServerArgs": object, "get_global_server_args":
                                   lambda: types.SimpleNamespace(sampling_backend="pytorch")},
    }
    root = types.ModuleType("sglang")
    root.__path__ = [str(pkg)]
    sys.modules["sglang"] = root
    for name, attrs in stubs.items():
        sys.modules[name] = _stub(name, **attrs)
    import sglang.srt.speculative.dflash_info as dflash_info
    import sglang.srt.speculative.dflash_utils as dflash_utils

    worker_py = pkg / "srt/speculative/dflash_worker.py"
    env: dict[str, Any] = {"torch": torch, "get_tp_group": lambda: group,
                           "ForwardMode": forward_mode,
                           "DFlashVerifyInput": dflash_info.DFlashVerifyInput,
                           "resolve_dflash_verify_mask_policy":
                               dflash_utils.resolve_dflash_verify_mask_policy,
                           "List": list, "Optional": Any}
    tail = dflash_tail(worker_py, env)
    env["logger"] = logging.getLogger("dflash_worker")
    names = ("_greedy_sample_from_vocab_parallel_head", "_append_target_hidden_to_draft_kv",
             "_gather_req_to_token_masked", "_append_target_hidden_fused")
    base = type("DFlashWorker", (), {"draft_tail": tail,
                                     **{n: dflash_method(worker_py, n, env) for n in names}})
    sys.modules["sglang.srt.speculative.triton_ops.fused_kv_materialize"] = _stub(
        "sglang.srt.speculative.triton_ops.fused_kv_materialize",
        _fused_norm_rope=fused_norm_rope(session))
    sys.modules["sglang.srt.speculative.dflash_worker"] = _stub(
        "sglang.srt.speculative.dflash_worker", DFlashWorker=base)
    import sglang.srt.speculative.ddtree_info as ddtree_info
    import sglang.srt.speculative.ddtree_verify as ddtree_verify
    import sglang.srt.speculative.ddtree_worker as ddtree_worker

    for name in ("build_tree", "compile_tree", "walk_tree"):
        setattr(ddtree_verify, name, session.triton(name, getattr(ddtree_verify, name)))
    ddtree_worker.draft_topk = session.triton("draft_topk", ddtree_worker.draft_topk)
    return types.SimpleNamespace(base=base, worker=ddtree_worker, info=ddtree_info,
                                 verify=ddtree_verify, dflash_info=dflash_info)

