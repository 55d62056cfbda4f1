"""The DDTree plugin against every SGLang release it supports, each from its real wheel.

Each release's wheel (tests/wheels.toml) is installed --no-deps into a folder of its own, with
the plugin's wheel built from this checkout. Then, per release:

* its ``spec_registry.py`` and ``spec_info.py`` are loaded by file in a fresh interpreter with
  the fakes listed in ``FAKES`` (the packages above them, emptied, and the two helpers they
  import: no torch-heavy SGLang import), and the plugin registers DDTREE through
  ``SpeculativeAlgorithm.register``: SGLang's own conformance check passes, the spec class answers
  DFLASH's identity and has the methods the scheduler calls (the enum's own);
* the worker's contract is read from the release's files (``ast``): DFlashWorkerV2's constructor
  is the one ``releases`` records and the one the scheduler passes, and every method, field,
  name and keyword the worker uses exists there;
* an SGLang with its own DDTREE (the release's spec_info.py with the member added) keeps DDTREE
  and gets the plugin as DDTREE_PLUGIN, saying so; a release outside the matrix is refused with
  the supported list when DDTREE is asked for;
* ``python -m ddtree_sglang.check`` answers supported, entry point listed, constructor matching.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from wheelcache import wheel

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "payload" / "plugin"))

from ddtree_sglang import __version__, releases  # noqa: E402

SUPPORTED = sorted(releases.SUPPORTED)

# What register() needs beyond the two files (loaded by file, nothing else of SGLang imported).
FAKES = r'''
import importlib.util, sys, types
def package(name):
    module = types.ModuleType(name); module.__path__ = []; sys.modules[name] = module
for name in ("sglang", "sglang.srt", "sglang.srt.speculative", "sglang.srt.arg_groups"):
    package(name)
overrides = types.ModuleType("sglang.srt.arg_groups.overrides")
overrides.resolving_view = overrides.resolved_view = lambda args: args
sys.modules[overrides.__name__] = overrides
context = types.ModuleType("sglang.srt.runtime_context")
context.get_spec = lambda: None
sys.modules[context.__name__] = context
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
'''

REGISTER = FAKES + r'''
import io, json, logging
site, version, spec_info_path = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, site)
log = io.StringIO()
logging.basicConfig(stream=log, level=logging.INFO)
registry = load("sglang.srt.speculative.spec_registry",
                f"{site}/sglang/srt/speculative/spec_registry.py")
info = load("sglang.srt.speculative.spec_info", spec_info_path)
from ddtree_sglang import plugin
name = plugin.register(version, info.SpeculativeAlgorithm, registry)
algo = info.SpeculativeAlgorithm.from_string(name)
ddtree = info.SpeculativeAlgorithm.from_string("DDTREE")
out = {"name": name, "class": type(algo).__name__, "ddtree_is": type(ddtree).__name__,
       "log": log.getvalue()}
try:
    algo.validate_server_args(types.SimpleNamespace())
    out["validate"] = "ok"
except ValueError as exc:
    out["validate"] = str(exc)
try:
    algo.validate_server_args(types.SimpleNamespace(tokenizer_worker_num=2))
    out["workers"] = "ok"
except ValueError as exc:
    out["workers"] = str(exc)
if out["class"] == "DDTreeSpec":
    enum = info.SpeculativeAlgorithm
    out.update(
        dflash=algo.is_dflash(), family=algo.is_dflash_family(),
        target_verify_for_draft=algo.supports_target_verify_for_draft(),
        eagle=algo.is_eagle(), need_topk=algo.need_topk(),
        carries=algo.carries_draft_hidden_states(),
        future_map_is_enums=type(algo).create_future_map is vars(enum)["create_future_map"],
        factory=algo.factory.__qualname__,
    )
    try:
        algo.create_worker(types.SimpleNamespace(disable_overlap_schedule=False))
        out["overlap"] = "accepted"
    except ValueError as exc:
        out["overlap"] = str(exc)
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def plugin_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = importlib.util.spec_from_file_location("ddtree_plugin_build",
                                                  ROOT / "payload" / "plugin" / "build.py")
    assert spec is not None and spec.loader is not None
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build.build_wheel(tmp_path_factory.mktemp("plugin"))


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory, plugin_wheel: Path) -> dict[str, Path]:
    """Per release: a folder with its sglang wheel and the plugin's, installed --no-deps."""
    out = {}
    for version in SUPPORTED:
        site = tmp_path_factory.mktemp(f"sglang-{version}")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-compile", "--disable-pip-version-check", "--target", str(site),
                        str(wheel("sglang", version)), str(plugin_wheel)], check=True)
        out[version] = site
    return out


def register(site: Path, version: str, spec_info: Path | None = None,
             env: dict[str, str] | None = None) -> dict:
    path = spec_info or site / "sglang" / "srt" / "speculative" / "spec_info.py"
    proc = subprocess.run([sys.executable, "-c", REGISTER, str(site), version, str(path)],
                          capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in {**os.environ, **(env or {})}.items()
                               if not k.startswith("SGLANG_DDTREE_") or k in (env or {})})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("version", SUPPORTED)
def test_registers_on_the_release(sites: dict[str, Path], version: str) -> None:
    got = register(sites[version], version)
    assert got["name"] == "DDTREE" and got["class"] == "DDTreeSpec" and got["ddtree_is"] == (
        "DDTreeSpec")
    assert got["validate"] == "ok"
    # the extra HTTP workers of --tokenizer-worker-num > 1 load no plugin: no admission there
    assert got["workers"].startswith("DDTREE needs --tokenizer-worker-num 1 (got 2)")
    assert got["dflash"] and got["family"] and got["target_verify_for_draft"]
    assert not got["eagle"] and not got["need_topk"] and not got["carries"]
    assert got["future_map_is_enums"]
    assert got["factory"] == "worker_factory"
    assert "does not support overlap scheduling" in got["overlap"]
    assert f"DDTREE registered on SGLang {version}" in got["log"]


def test_a_verify_path_switch_is_refused_at_start_unless_1_or_0(
        sites: dict[str, Path]) -> None:
    version = SUPPORTED[0]
    for name in ("SGLANG_DDTREE_TREE_ATTENTION", "SGLANG_DDTREE_VERIFY_GRAPH"):
        got = register(sites[version], version, env={name: "on"})
        assert got["validate"] == f"DDTREE: {name} must be 1 (on, the default) or 0 (off), " \
                                  "got 'on'."
        for good in ("1", "0"):
            assert register(sites[version], version, env={name: good})["validate"] == "ok"


def test_an_upstream_ddtree_keeps_its_name(sites: dict[str, Path], tmp_path: Path) -> None:
    version = SUPPORTED[-1]
    real = sites[version] / "sglang" / "srt" / "speculative" / "spec_info.py"
    text = real.read_text(encoding="utf-8")
    anchor = "    DFLASH = auto()\n"
    assert anchor in text
    patched = tmp_path / "spec_info.py"
    patched.write_text(text.replace(anchor, anchor + "    DDTREE = auto()\n", 1),
                       encoding="utf-8")
    got = register(sites[version], version, patched)
    assert got["name"] == "DDTREE_PLUGIN" and got["class"] == "DDTreeSpec"
    assert got["ddtree_is"] == "SpeculativeAlgorithm"  # SGLang's own serves DDTREE
    assert "has its own DDTREE" in got["log"] and "registered as DDTREE_PLUGIN" in got["log"]


def test_a_release_outside_the_matrix_is_refused_when_asked_for(sites: dict[str, Path]) -> None:
    got = register(sites[SUPPORTED[0]], "0.5.18")
    assert got["class"] == "CustomSpecAlgo"  # registered only to refuse with the reason
    assert "SGLang 0.5.18 is not supported" in got["validate"]
    assert all(v in got["validate"] for v in SUPPORTED)


# -- the worker's contract, read from each release's files -----------------------------------

# DFlashWorkerV2 methods the worker calls, with the keywords it passes.
PARENT_CALLS = {
    "_append_target_hidden_to_draft_kv_by_loc": {"target_hidden", "cache_loc", "positions",
                                                 "cache_loc_2d", "commit_lens"},
    "_make_next_draft_input_decode": {"bonus_tokens", "new_seq_lens"},
    "_maybe_build_draft_sampler": set(),
    "forward_batch_generation": set(),
    "init_attention_backends": set(),  # extended: the target's verify attention
}
PARENT_FIELDS = {"block_size", "_mask_token_id", "_draft_block_spec_info", "draft_model_runner",
                 "_need_mamba_verify_commit", "model_runner", "device", "server_args"}
MODULE_NAMES = {"CaptureHiddenMode", "DFlashVerifyInput", "ForwardBatch", "ForwardMode",
                "GenerationBatchResult", "SpeculativeAlgorithm",
                "apply_dflash_verify_logits_adjustments"}
FORWARD_BATCH_FIELDS = {"forward_mode", "batch_size", "input_ids", "req_pool_indices",
                        "seq_lens", "out_cache_loc", "seq_lens_sum", "seq_lens_cpu",
                        "positions", "input_embeds", "spec_algorithm", "spec_info",
                        "capture_hidden_mode"}
RESULT_FIELDS = {"logits_output", "next_token_ids", "accept_lens", "can_run_cuda_graph",
                 "next_draft_input", "speculative_num_draft_tokens", "new_seq_lens"}
BATCH_FIELDS = {"req_pool_indices", "seq_lens", "seq_lens_cpu", "seq_lens_sum", "out_cache_loc",
                "spec_info", "sampling_info", "reqs", "forward_mode", "is_extend_in_batch",
                "has_grammar"}
VERIFY_INPUT_FIELDS = {"draft_token", "positions", "draft_token_num", "custom_mask",
                       "capture_hidden_mode"}


def _tree(site: Path, rel: str) -> ast.Module:
    return ast.parse((site / "sglang" / "srt" / rel).read_text(encoding="utf-8"))


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    found = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    assert found, f"no class {name}"
    return found[0]


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    a = fn.args
    return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg != "self"]


def _methods(cls: ast.ClassDef) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}


def _fields(cls: ast.ClassDef) -> set[str]:
    return {n.target.id for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


@pytest.mark.parametrize("version", SUPPORTED)
def test_the_worker_contract_holds_on_the_release(sites: dict[str, Path], version: str) -> None:
    site = sites[version]
    worker_tree = _tree(site, "speculative/dflash_worker_v2.py")
    parent = _class(worker_tree, "DFlashWorkerV2")
    methods = _methods(parent)
    ctor = tuple(_params(methods["__init__"]))
    assert ctor == releases.SUPPORTED[version]["ctor"]
    # What the scheduler passes it (draft_worker_kwargs = dict(...)).
    scheduler = _tree(site, "managers/scheduler.py")
    passed = [n.value for n in ast.walk(scheduler) if isinstance(n, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == "draft_worker_kwargs" for t in n.targets)]
    assert len(passed) == 1 and isinstance(passed[0], ast.Call)
    assert tuple(k.arg for k in passed[0].keywords) == ctor
    for name, keywords in PARENT_CALLS.items():
        assert name in methods, f"{version}: DFlashWorkerV2.{name} is gone"
        assert not keywords - set(_params(methods[name])), (name, _params(methods[name]))
    assigned = {t.attr for n in ast.walk(parent) if isinstance(n, ast.Assign)
                for t in n.targets if isinstance(t, ast.Attribute)}
    assigned |= {n.target.attr for n in ast.walk(parent)
                 if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Attribute)}
    assigned |= {f for f in methods if any(isinstance(d, ast.Name) and d.id == "property"
                                           for d in methods[f].decorator_list)}
    assert not PARENT_FIELDS - assigned, PARENT_FIELDS - assigned
    bound = {a.asname or a.name for n in worker_tree.body
             if isinstance(n, ast.ImportFrom | ast.Import) for a in n.names}
    assert not MODULE_NAMES - bound, MODULE_NAMES - bound
    forward = _tree(site, "model_executor/forward_batch_info.py")
    assert not FORWARD_BATCH_FIELDS - _fields(_class(forward, "ForwardBatch"))
    result = _class(_tree(site, "managers/utils.py"), "GenerationBatchResult")
    assert not RESULT_FIELDS - _fields(result)
    batch = _class(_tree(site, "managers/schedule_batch.py"), "ScheduleBatch")
    assert not BATCH_FIELDS - _fields(batch) - set(_methods(batch))
    info = _class(_tree(site, "speculative/dflash_info.py"), "DFlashVerifyInput")
    assert not VERIFY_INPUT_FIELDS - _fields(info)
    assert _params(_methods(info)["prepare_for_verify"])[:2] == ["batch", "target_worker"]
    tp = _methods(_class(_tree(site, "managers/tp_worker.py"), "TpModelWorker"))
    wanted = {"forward_batch", "is_verify", "skip_attn_backend_init"}
    assert not wanted - set(_params(tp["forward_batch_generation"]))
    hook = _tree(site, "arg_groups/speculative_hook.py")
    assert any(isinstance(n, ast.FunctionDef) and n.name == "_handle_dflash" for n in hook.body)
    manager = _methods(_class(_tree(site, "managers/tokenizer_manager.py"), "TokenizerManager"))
    assert "generate_request" in manager
    assert (site / "sglang" / "srt" / "plugins" / "hook_registry.py").is_file()


@pytest.mark.parametrize("version", SUPPORTED)
def test_check_answers_for_the_release(sites: dict[str, Path], version: str) -> None:
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from ddtree_sglang.check import main; "
            "sys.exit(main([]))")
    proc = subprocess.run([sys.executable, "-c", code, str(sites[version])],
                          capture_output=True, text=True, timeout=60)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, got
    assert got["sglang"] == version and got["supported"] and got["entry_point"]
    assert got["ctor_matches"] and got["serves"] == "plugin" and got["loaded"] == "file"
    assert got["worker_ctor"] == ("ps" if "ps" in releases.SUPPORTED[version]["ctor"] else
                                  "no_ps")
    # the wheel built from this checkout, and whether a GPU run proved it and this release
    assert got["plugin"] == __version__ and got["gpu_proven"] is (version in releases.GPU_PROVEN)
    assert got["plugin_gpu_proven"] is (__version__ in releases.PLUGIN_GPU_PROVEN)


LOAD = FAKES + r"""
import io, json, logging
site, mode = sys.argv[1], sys.argv[2]
sys.path.insert(0, site)
log = io.StringIO()
logging.basicConfig(stream=log, level=logging.INFO)
load("sglang.srt.speculative.spec_registry", f"{site}/sglang/srt/speculative/spec_registry.py")
info = load("sglang.srt.speculative.spec_info",
            f"{site}/sglang/srt/speculative/spec_info.py")
if mode != "no-registry":  # the real hook registry (stdlib only), loaded by file
    package("sglang.srt.plugins")
    hooks = load("sglang.srt.plugins.hook_registry",
                 f"{site}/sglang/srt/plugins/hook_registry.py")
if mode == "applied":  # the hooks' target, as load_plugins finds it in SGLang's processes
    package("sglang.srt.managers")
    tm = types.ModuleType("sglang.srt.managers.tokenizer_manager")
    class TokenizerManager:
        def __init__(self, server_args): self.server_args = server_args
        async def generate_request(self, obj, request=None): yield obj
    tm.TokenizerManager = TokenizerManager
    sys.modules[tm.__name__] = tm
from ddtree_sglang import plugin
plugin.load()
if mode != "no-registry":
    hooks.HookRegistry.apply_hooks()  # what load_plugins does after the plugins' load()
algo = info.SpeculativeAlgorithm.from_string("DDTREE")
out = {"class": type(algo).__name__, "log": log.getvalue()}
try:
    algo.validate_server_args(types.SimpleNamespace())
    out["validate"] = "ok"
except ValueError as exc:
    out["validate"] = str(exc)
if mode != "no-registry":
    prefix = "sglang.srt.managers.tokenizer_manager.TokenizerManager."
    out["hooks"] = [len(hooks.HookRegistry._hooks.get(prefix + m, []))
                    for m in ("generate_request", "__init__")]
print(json.dumps(out))
"""


@pytest.mark.parametrize("mode", ["applied", "unapplied", "no-registry"])
def test_ddtree_is_refused_at_start_when_its_admission_cannot_be_installed(
        sites: dict[str, Path], mode: str) -> None:
    # Without the admission hooks a request DDTREE would serve differently (a penalty, logprobs)
    # would be served: the plugin registers DDTREE only to refuse it (fail closed), and refuses
    # it when SGLang could not apply them (SGLang only logs that).
    version = SUPPORTED[-1]
    proc = subprocess.run([sys.executable, "-c", LOAD, str(sites[version]), mode],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if mode == "applied":
        assert got["class"] == "DDTreeSpec" and got["validate"] == "ok", got
        assert got["hooks"] == [1, 1]
    elif mode == "unapplied":
        assert got["class"] == "DDTreeSpec" and got["hooks"] == [1, 1], got
        assert got["validate"].startswith(
            "DDTREE refused: SGLang did not apply its request admission hooks to "
            "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request, "
            "sglang.srt.managers.tokenizer_manager.TokenizerManager.__init__"), got
    else:
        assert got["class"] == "CustomSpecAlgo", got
        assert "request admission cannot be installed" in got["validate"], got
