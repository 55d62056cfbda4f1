"""The DDTree payload against the REAL sglang 0.5.11 wheel, on CPU.

The wheel's ``sglang/`` is extracted, payload.yaml's patches are applied with ``patch -p1`` and its
new files copied, exactly as the deploy tool maps them. Then:
* spec_info.py (imports nothing heavy) is loaded by file: DDTREE is DFLASH and DDTREE, DFLASH is
  unchanged;
* server_args.py imports torch and much more, so it is not imported: its patched
  ``_handle_speculative_decoding`` is compiled alone from the patched source and run on a
  namespace holding the dataclass's own defaults, and the flags parse through ``ddtree_args``;
* the verify path runs for real: the wheel's dflash_info.py and our ddtree_info.py are imported
  with the GPU-only modules they name replaced by small fakes (allocator, req->token writer), and
  a fake target model that reads the verify block through the custom mask and the KV store.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import shutil
import subprocess
import sys
import types
import zipfile
from collections.abc import Iterator
from enum import IntEnum
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from wheelcache import wheel

PAYLOAD = Path(__file__).resolve().parents[1] / "payload"
SPEC = yaml.safe_load((PAYLOAD / "payload.yaml").read_text())["sglang"]["0.5.11"]


def _wheel() -> Path:
    return wheel("sglang", "0.5.11")  # tests/wheels.toml


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("upstream")
    with zipfile.ZipFile(_wheel()) as zf:
        zf.extractall(root, [n for n in zf.namelist() if n.startswith("sglang/")])
    return root / "sglang"


@pytest.fixture(scope="module")
def patched(upstream: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pkg = tmp_path_factory.mktemp("patched") / "sglang"
    shutil.copytree(upstream, pkg)
    for item in SPEC["patches"]:
        subprocess.run(["patch", "-p1", "--forward", "--batch", "-i", str(PAYLOAD / item["patch"])],
                       cwd=pkg, check=True, capture_output=True)
    for item in SPEC["files"]:
        shutil.copyfile(PAYLOAD / item["source"], pkg / item["target"])
    return pkg


@pytest.fixture()
def sglang_path(patched: Path) -> Iterator[Path]:
    """``sglang`` resolves to the patched folder without running sglang/__init__.py."""
    before = set(sys.modules)
    pkg = types.ModuleType("sglang")
    pkg.__path__ = [str(patched)]
    sys.modules["sglang"] = pkg
    try:
        yield patched
    finally:
        for name in set(sys.modules) - before:
            if name == "sglang" or name.startswith("sglang."):
                del sys.modules[name]


def test_upstream_hashes_match_the_wheel(upstream: Path) -> None:
    for item in SPEC["patches"]:
        digest = hashlib.sha256((upstream / item["target"]).read_bytes()).hexdigest()
        assert digest == item["sha256"], item["target"]


def test_patches_stay_small() -> None:
    for item in SPEC["patches"]:
        lines = (PAYLOAD / item["patch"]).read_text().splitlines()
        changed = [x for x in lines[2:] if x[:1] in "+-"]
        assert 0 < len(changed) <= 30, (item["patch"], len(changed))


def _load_by_file(path: Path, name: str) -> types.ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[name]
    return module


def test_spec_info_registers_ddtree_as_dflash(upstream: Path, patched: Path) -> None:
    rel = "srt/speculative/spec_info.py"
    old = _load_by_file(upstream / rel, "_up_spec_info").SpeculativeAlgorithm
    new = _load_by_file(patched / rel, "_pt_spec_info").SpeculativeAlgorithm
    ddtree, dflash = new.from_string("DDTREE"), new.from_string("ddtree")
    assert ddtree is dflash and ddtree.is_ddtree() and ddtree.is_dflash()
    assert ddtree.is_speculative() and not ddtree.is_eagle()
    assert new.DFLASH.is_dflash() and not new.DFLASH.is_ddtree()
    assert {m.name: m.value for m in old} == {m.name: m.value for m in new if m.name != "DDTREE"}
    with pytest.raises(ValueError, match="DDTREE does not support overlap"):
        ddtree.create_worker(types.SimpleNamespace(disable_overlap_schedule=False))


def test_verify_snippets_light(patched: Path, upstream: Path) -> None:
    verify = yaml.safe_load((PAYLOAD / "payload.yaml").read_text())["verify"]
    results = {}
    for item in verify:
        if item["mode"] == "light":
            out = subprocess.run([sys.executable, "-c", item["code"], str(patched)],
                                 capture_output=True, text=True, check=True).stdout
            results[item["name"]] = yaml.safe_load(out)
    assert results["spec_info"] == {"loaded": "file", "ddtree": True, "dflash": True}
    assert results["server_flags"]["server_args_wired"] is True
    assert results["server_flags"]["budget"] == 8 and results["dflash_hook"]["hook"] is True
    assert set(results["admission_hooks"]["hooked"].values()) == {True}  # all three routes
    hooks = next(i for i in verify if i["name"] == "admission_hooks")
    bare = subprocess.run([sys.executable, "-c", hooks["code"], str(upstream)],
                          capture_output=True, text=True, check=False)
    assert bare.returncode == 1  # upstream files: the check fails (the deploy rolls back)
    core = next(i for i in verify if i["name"] == "core")
    stub = "import sys,types\nm=types.ModuleType('sglang');m.__path__=[sys.argv[1]]\n"
    stub += "sys.modules['sglang']=m\n"
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", stub + core["code"],
                          str(patched)], capture_output=True, text=True, check=True).stdout
    assert yaml.safe_load(out)["tree_tokens"] == [5, 8, 9, 11]


# --- server_args: the patched method, compiled alone ------------------------------------------

def _server_args(patched: Path) -> tuple[dict[str, Any], Any, ast.Module]:
    tree = ast.parse((patched / "srt/server_args.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    defaults: dict[str, Any] = {}
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
            with contextlib.suppress(ValueError):
                defaults[node.target.id] = ast.literal_eval(node.value)
    method = next(n for n in cls.body
                  if isinstance(n, ast.FunctionDef) and n.name == "_handle_speculative_decoding")
    return defaults, method, tree


def _run_handle(patched: Path, monkeypatch: pytest.MonkeyPatch, **over: Any) -> Any:
    import logging

    defaults, method, _ = _server_args(patched)
    moe = types.ModuleType("sglang.srt.layers.moe.utils")
    moe.__dict__["MoeRunnerBackend"] = lambda name: types.SimpleNamespace(
        is_flashinfer_trtllm=lambda: False)
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.moe.utils", moe)
    scope: dict[str, Any] = {"logger": logging.getLogger("t"), "json": __import__("json")}
    exec(compile(ast.Module(body=[method], type_ignores=[]), "server_args.py", "exec"), scope)
    args = types.SimpleNamespace(**{**defaults, "speculative_draft_model_path": "/m",
                                    "speculative_num_draft_tokens": 16, **over})
    scope["_handle_speculative_decoding"](args)
    return args


def test_server_args_fields_and_choices(patched: Path) -> None:
    defaults, _, tree = _server_args(patched)
    assert defaults["speculative_ddtree_budget"] is None
    assert defaults["speculative_ddtree_shadow_linear"] is False
    choices = [n for n in ast.walk(tree) if isinstance(n, ast.keyword) and n.arg == "choices"
               and isinstance(n.value, ast.List) and "DFLASH" in ast.literal_eval(n.value)]
    assert len(choices) == 1 and "DDTREE" in ast.literal_eval(choices[0].value)


def test_server_args_ddtree_full_tree(sglang_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    args = _run_handle(sglang_path, monkeypatch, speculative_algorithm="DDTREE",
                       speculative_ddtree_budget=24)
    assert args.speculative_num_draft_tokens == 25 and args.speculative_dflash_block_size == 16
    assert args.attention_backend == "triton" and args.page_size == 1
    assert args.disable_overlap_schedule is True and args.speculative_ddtree_topk == 24
    dflash = _run_handle(sglang_path, monkeypatch, speculative_algorithm="DFLASH")
    assert dflash.speculative_num_draft_tokens == 16 and dflash.attention_backend is None


def test_server_args_ddtree_refusals(sglang_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="needs the triton attention backend.*shadow-linear"):
        _run_handle(sglang_path, monkeypatch, speculative_algorithm="DDTREE",
                    attention_backend="flashinfer")
    shadow = _run_handle(sglang_path, monkeypatch, speculative_algorithm="DDTREE",
                         attention_backend="flashinfer", speculative_ddtree_shadow_linear=True)
    assert shadow.speculative_num_draft_tokens == 16 and shadow.attention_backend == "flashinfer"
    with pytest.raises(ValueError, match="--page-size 1"):
        _run_handle(sglang_path, monkeypatch, speculative_algorithm="DDTREE", page_size=16)
    with pytest.raises(ValueError, match="relaxed thresholds"):
        _run_handle(sglang_path, monkeypatch, speculative_algorithm="DDTREE",
                    speculative_accept_threshold_single=0.5)
    with pytest.raises(ValueError, match="budget must be between"):
        _run_handle(sglang_path, monkeypatch, speculative_algorithm="DDTREE",
                    speculative_ddtree_budget=0)
    with pytest.raises(ValueError, match="DDTREE does not support --enable-deterministic-inf"):
        _run_handle(sglang_path, monkeypatch, speculative_algorithm="DDTREE",
                    enable_deterministic_inference=True)


def test_cli_flags_parse(sglang_path: Path) -> None:
    from sglang.srt.speculative.ddtree_args import add_ddtree_cli_args

    parser = argparse.ArgumentParser()
    add_ddtree_cli_args(parser)
    ns = parser.parse_args(["--speculative-ddtree-budget", "64", "--speculative-ddtree-topk", "8"])
    assert (ns.speculative_ddtree_budget, ns.speculative_ddtree_topk) == (64, 8)
    assert ns.speculative_ddtree_shadow_linear is False
    with pytest.raises(SystemExit):
        parser.parse_args(["--speculative-ddtree-budget", "many"])


def test_new_modules_import_only_what_0_5_11_has(patched: Path) -> None:
    for item in SPEC["files"]:
        source = (patched / item["target"]).read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith("sglang."):
                base = patched / node.module.removeprefix("sglang.").replace(".", "/")
                files = [base.with_suffix(".py")] if base.with_suffix(".py").is_file() else \
                    sorted(base.glob("*.py"))  # a package re-exporting its modules
                assert files, node.module
                text = "".join(f.read_text() for f in files)
                for alias in node.names:
                    assert f"def {alias.name}" in text or f"class {alias.name}" in text \
                        or f"{alias.name} =" in text or f"import {alias.name}" in text \
                        or f"    {alias.name},\n" in text, (node.module, alias.name)
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""]
                # triton ships with torch's CUDA builds (the core's fast path, guarded);
                # ddtree is the core's own fallback name when used outside sglang (guarded).
                assert all(n.split(".")[0] in {"torch", "__future__", "argparse", "copy",
                                              "dataclasses", "logging", "typing", "triton",
                                              "os", "collections", "contextlib",
                                              "ddtree"} for n in names), names


# --- the verify path, driven end to end -------------------------------------------------------

TRUE = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]  # the target's greedy text
VOCAB = 32


def _oracle(context: list[int]) -> int:
    return TRUE[len(context)] if context == TRUE[: len(context)] else 1


def _stub(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


class _Alloc:
    def __init__(self) -> None:
        self.next, self.freed = 100, []  # type: ignore[var-annotated]

    def take(self, n: int) -> torch.Tensor:
        out = torch.arange(self.next, self.next + n)
        self.next += n
        return out

    def free(self, locs: torch.Tensor) -> None:
        self.freed.extend(locs.tolist())


def _assign(pool_idx: Any, req_to_token: Any, start: Any, end: Any, locs: Any, bs: int) -> None:
    offset = 0
    for b in range(bs):
        n = int(end[b] - start[b])
        req_to_token[int(pool_idx[b]), int(start[b]) : int(end[b])] = locs[offset : offset + n]
        offset += n


_BACKEND = types.SimpleNamespace(sampling_backend="flashinfer")  # what get_global_server_args gives


@pytest.fixture()
def verify_mods(sglang_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    class Capture(IntEnum):
        NULL = 0
        FULL = 1

    def unused(*a: Any, **k: Any) -> None:
        raise AssertionError("not on the page_size 1 greedy path")

    stubs: dict[str, dict[str, Any]] = {
        "sglang.srt.layers.attention.utils": {"create_flashinfer_kv_indices_triton": unused},
        "sglang.srt.layers.logits_processor": {"LogitsProcessorOutput": object},
        "sglang.srt.layers.sampler": {"apply_custom_logit_processor": unused},
        "sglang.srt.managers.schedule_batch": {"ScheduleBatch": object},
        "sglang.srt.mem_cache.common": {"alloc_token_slots": lambda cache, n: cache.take(n),
                                        "alloc_paged_token_slots_extend": unused,
                                        "get_last_loc": unused},
        "sglang.srt.model_executor.forward_batch_info": {"CaptureHiddenMode": Capture},
        "sglang.srt.speculative.dflash_utils": {
            "compute_dflash_accept_len_and_bonus": unused,
            "compute_dflash_sampling_accept_len_and_bonus": unused,
            "is_dflash_sampling_verify_available": lambda: False},
        "sglang.srt.speculative.spec_utils": {"assign_req_to_token_pool_func": _assign},
        "sglang.srt.server_args": {"get_global_server_args": lambda: _BACKEND},
    }
    for name, attrs in stubs.items():
        monkeypatch.setitem(sys.modules, name, _stub(name, **attrs))
    import sglang.srt.speculative.ddtree_info as info
    import sglang.srt.speculative.ddtree_verify as verify

    return info, verify


class _Req:
    def __init__(self, prompt: list[int], root: int) -> None:
        self.origin_input_ids, self.output_ids = prompt, [root]
        self.grammar, self.spec_verify_ct, self.spec_accepted_drafts = None, 0, 0
        self.kv_committed_len = self.kv_allocated_len = len(prompt)
        self.require_reasoning, self.reasoning_seen = root == TRUE[4], []  # the first request

    def update_reasoning_tokens(self, token_id: list[int], think_end_id: int) -> None:
        self.reasoning_seen.append((list(token_id), think_end_id))

    def check_finished(self) -> None:
        pass

    def finished(self) -> bool:
        return False


def _batch(prompts: list[list[int]], kv: dict[int, tuple[int, int]], alloc: _Alloc) -> Any:
    bs = len(prompts)
    req_to_token = torch.zeros(bs, 64, dtype=torch.long)
    for b, prompt in enumerate(prompts):  # prefill: the prompt's KV at positions 0..len-1
        locs = alloc.take(len(prompt))
        req_to_token[b, : len(prompt)] = locs
        pairs = enumerate(zip(locs.tolist(), prompt, strict=True))
        kv.update({loc: (tok, pos) for pos, (loc, tok) in pairs})
    lens = torch.tensor([len(p) for p in prompts])
    return types.SimpleNamespace(
        forward_mode=types.SimpleNamespace(is_idle=lambda: False), device="cpu",
        reqs=[_Req(p, TRUE[len(p)]) for p in prompts], batch_size=lambda: bs,
        sampling_info=None, seq_lens=lens.clone(), seq_lens_cpu=lens.clone(),
        seq_lens_sum=int(lens.sum()), req_pool_indices=torch.arange(bs), tree_cache=alloc,
        req_to_token_pool=types.SimpleNamespace(req_to_token=req_to_token),
        token_to_kv_pool_allocator=alloc, model_config=types.SimpleNamespace(think_end_id=77))


def _target_forward(batch: Any, spec: Any, kv: dict[int, tuple[int, int]]) -> Any:
    """A fake target: per query, the context is what the custom mask lets it see in the KV."""
    n, bs = spec.draft_token_num, batch.batch_size()
    ids, pos = batch.input_ids.view(bs, n), spec.positions.view(bs, n)
    locs = batch.out_cache_loc.view(bs, n)
    for b in range(bs):
        for i in range(n):
            kv[int(locs[b, i])] = (int(ids[b, i]), int(pos[b, i]))
    logits = torch.zeros(bs * n, VOCAB)
    hidden = torch.zeros(bs * n, 2)
    offset = 0
    for b in range(bs):
        prefix = int(batch.seq_lens[b])
        keys = batch.req_to_token_pool.req_to_token[b, : prefix + n]
        rows = spec.custom_mask[offset : offset + n * (prefix + n)].view(n, prefix + n)
        offset += n * (prefix + n)
        for i in range(n):
            seen = sorted(kv[int(k)][::-1] for k, ok in zip(keys, rows[i], strict=True) if ok)
            assert [p for p, _ in seen] == list(range(int(pos[b, i]) + 1))  # one whole path
            logits[b * n + i, _oracle([t for _, t in seen])] = 1.0
            hidden[b * n + i] = torch.tensor([float(pos[b, i]), float(ids[b, i])])
    return types.SimpleNamespace(next_token_logits=logits, hidden_states=hidden)


def _draft_logits() -> torch.Tensor:
    """4 depths after the root. Request 0: depth 2's top-1 (30) is wrong, its rank 2 is right."""
    logits = torch.full((2, 4, VOCAB), -20.0)
    for depth, tok in enumerate(TRUE[5:9]):
        logits[0, depth, tok] = 4.0
    logits[0, 1, 30] = 5.0
    for depth, tok in enumerate(TRUE[7:11]):
        logits[1, depth, tok] = 4.0
    return logits


def _round(mods: Any, shadow: bool) -> tuple[Any, Any, dict[int, tuple[int, int]], _Alloc]:
    info, verify = mods
    kv: dict[int, tuple[int, int]] = {}
    alloc = _Alloc()
    batch = _batch([TRUE[:4], TRUE[:6]], kv, alloc)
    top_lp, top_tok = verify.draft_topk(_draft_logits(), 4)
    roots = torch.tensor([r.output_ids[-1] for r in batch.reqs])
    plan = verify.plan_round(top_lp, top_tok, roots, batch.seq_lens, budget=10,
                             shadow_linear=shadow)
    spec = info.DDTreeVerifyInput.from_round(plan)
    spec.prepare_for_verify(batch, 1, build_custom_mask=True)
    out = spec.verify(batch=batch, logits_output=_target_forward(batch, spec, kv), page_size=1)
    return batch, out, kv, alloc


def test_tree_round_commits_a_sibling_the_chain_misses(verify_mods: Any) -> None:
    tree_batch, (new_id, commit, hidden, accepted), kv, alloc = _round(verify_mods, False)
    chain_batch, (_, chain_commit, _, chain_accepted), _, _ = _round(verify_mods, True)
    assert tree_batch.reqs[0].output_ids == TRUE[4:10]  # 5, 6 (the sibling), 7, 8, bonus 9
    # reasoning tokens counted from the committed tokens, as SGLang's plain decode counts them
    assert tree_batch.reqs[0].reasoning_seen == [(TRUE[5:10], 77)]
    assert tree_batch.reqs[1].reasoning_seen == []  # require_reasoning not set
    assert chain_batch.reqs[0].output_ids == TRUE[4:7]  # 5, then 30 misses: bonus 6
    assert accepted == [4, 4] and chain_accepted == [1, 4]
    assert commit.tolist() == [5, 5] and chain_commit.tolist() == [2, 5]
    assert new_id.tolist() == [TRUE[9], TRUE[11]]
    # KV: every committed position links to the entry holding the right token at that position.
    for b, req in enumerate(tree_batch.reqs):
        length = int(tree_batch.seq_lens[b])
        assert length == len(req.origin_input_ids) + int(commit[b])
        links = tree_batch.req_to_token_pool.req_to_token[b, :length].tolist()
        assert [kv[loc] for loc in links] == [(TRUE[p], p) for p in range(length)]
    kept = set(tree_batch.out_cache_loc.tolist())
    block = set(range(110, alloc.next))  # the verify block's slots (after 4 + 6 prompt slots)
    assert kept | set(alloc.freed) == block and not kept & set(alloc.freed)
    assert len(alloc.freed) == 2 * 11 - 10
    assert hidden[:, 0].tolist() == [4, 5, 6, 7, 8, 6, 7, 8, 9, 10]  # hidden of the path, in order


def test_chain_mask_equals_dflash_causal_mask(verify_mods: Any) -> None:
    _, verify = verify_mods
    top_lp, top_tok = verify.draft_topk(_draft_logits(), 4)
    plan = verify.plan_round(top_lp, top_tok, torch.tensor([1, 2]), torch.tensor([3, 5]),
                             budget=6, shadow_linear=True)
    lens = [3, 5]
    n = plan.width
    got = verify.tree_custom_mask(plan.inputs.mask, torch.tensor(lens), sum(n * (p + n)
                                                                          for p in lens))
    want = torch.cat([(torch.arange(p + n)[None, :] <= p + torch.arange(n)[:, None]).flatten()
                      for p in lens])
    assert torch.equal(got, want)
    full = verify.plan_round(top_lp, top_tok, torch.tensor([1, 2]), torch.tensor([3, 5]),
                             budget=6)
    assert full.width == 7 and bool((full.expected_accept >= full.chain_expected_accept).all())


@pytest.mark.parametrize(("backend", "kept"), [("flashinfer", {0}), ("pytorch", {0, 1})])
def test_sampled_rows_follow_the_servers_sampling_backend_when_a_row_has_min_p(
        verify_mods: Any, monkeypatch: pytest.MonkeyPatch, backend: str, kept: set[int]) -> None:
    """probs 0.4, 0.3, 0.2, 0.1 with top-k 2, top-p 0.5, min-p 0.01. SGLang's flashinfer path
    (a batch with min-p: top-k renorm, then top-p renorm, then min-p) keeps 0.4 alone (4/7 of the
    top-2 mass reaches 0.5); its pytorch path (joint) keeps both (0.4 of the whole <= 0.5)."""
    info, _ = verify_mods
    monkeypatch.setattr(_BACKEND, "sampling_backend", backend)
    n = 600
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]])).expand(n, 4).contiguous()
    sampling_info = types.SimpleNamespace(
        is_all_greedy=False, need_min_p_sampling=True, need_top_p_sampling=True,
        temperatures=torch.ones(1, 1), top_ks=torch.tensor([2]), top_ps=torch.tensor([0.5]),
        min_ps=torch.tensor([0.01]))
    batch = types.SimpleNamespace(sampling_info=sampling_info, reqs=[
        types.SimpleNamespace(sampling_params=types.SimpleNamespace(top_k=2))])
    me = types.SimpleNamespace(draft_token_num=n)
    got = info.DDTreeVerifyInput._target_tokens(me, batch, logits, 1)
    assert set(got.view(-1).tolist()) == kept
