"""Stand-in for ``python -m sglang.launch_server`` in the lab (served by the import hook).

Why: the lab containers have no GPU and carry stand-in torch / sglang-kernel
wheels, so the real server cannot start. What is real: the flags (parsed from
the installed sglang's own server_args.py), the speculative algorithm lookup (the
installed ``sglang.srt.speculative.spec_info``; on 0.5.12+ first the venv's
``sglang.srt.plugins`` entry points, as ``load_plugins()`` reads them, where the
DDTree plugin's presence stands in for its registration), ``import sgl_kernel`` (a real
dlopen of the stand-in kernels against the venv's CUDA runtime), ``import
soundfile``, the names flashinfer and xgrammar define (read from the installed
files), flashinfer's CUDA-version lookup (nvcc, then torch.version.cuda), the
host's GPUs (/etc/ddtree-lab/gpus.json, CUDA_VISIBLE_DEVICES) and the model
folders. The checks run in the order listed in :func:`run_checks`; a failure
exits 1 with a traceback whose last line is the real error text. Then the GPU is
claimed (a claim file the lab's nvidia-smi reads) and an HTTP server answers
SGLang's endpoints until SIGTERM (exit 0).
"""

from __future__ import annotations

import argparse
import atexit
import logging
import os
import signal
import sys
import threading
import time
import warnings
from typing import Any

from ddtree_lab_standin import checks, gpu, models, realargs, serving
from ddtree_lab_standin import http as labhttp
from ddtree_lab_standin.speedmodel import SpeedModel

log = logging.getLogger("sglang.launch_server")
DEFAULT_MEM_FRACTION = 0.85
SPEC_WITH_DRAFT_CONFIG = ("DFLASH", "DDTREE")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, str(level).upper(), logging.INFO),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stdout,
    )


PLUGIN_GROUP = "sglang.srt.plugins"  # sglang/srt/plugins/__init__.py, 0.5.11 to 0.5.23
# What a plugin registers, by its distribution: the DDTree plugin registers DDTREE through
# SpeculativeAlgorithm.register (payload/plugin/ddtree_sglang/plugin.py). The real plugin cannot
# run on the lab's stand-in torch, so its registration is taken from its entry point's presence.
PLUGIN_ALGORITHMS = {"ddtree-sglang-plugin": ("DDTREE",)}


def plugin_algorithms() -> dict[str, str]:
    """Algorithm name -> the entry point registering it, as load_plugins() would load them:
    the venv's `sglang.srt.plugins` entry points, filtered by SGLANG_PLUGINS when it is set."""
    from importlib.metadata import entry_points

    allowed = os.environ.get("SGLANG_PLUGINS")
    names = None if not allowed else {n.strip() for n in allowed.split(",") if n.strip()}
    found: dict[str, str] = {}
    for ep in entry_points(group=PLUGIN_GROUP):
        if names is not None and ep.name not in names:
            continue
        dist = (ep.dist.metadata["Name"] if ep.dist is not None else "") or ""
        for algorithm in PLUGIN_ALGORITHMS.get(dist.lower().replace("_", "-"), ()):
            found[algorithm] = f"{ep.name} = {ep.value}"
    return found


def resolve_algorithm(ns: argparse.Namespace) -> str:
    """Step 1: plugins (a release with SpeculativeAlgorithm.register, 0.5.12+), then the
    installed SpeculativeAlgorithm.from_string, then draft-config needs."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    name = ns.speculative_algorithm
    if name == "NEXTN":  # server_args maps NEXTN to EAGLE before use
        name = "EAGLE"
    registered = plugin_algorithms() if hasattr(SpeculativeAlgorithm, "register") else {}
    upper = (name or "").upper()
    if upper in registered and upper not in SpeculativeAlgorithm.__members__:
        log.info("plugin %s registered speculative algorithm %s", registered[upper], upper)
        algorithm = upper
    else:
        algorithm = SpeculativeAlgorithm.from_string(name).name
    if algorithm in SPEC_WITH_DRAFT_CONFIG:
        if ns.speculative_draft_model_path is None:
            raise ValueError(
                f"{algorithm} speculative decoding requires setting "
                "--speculative-draft-model-path."
            )
        if getattr(ns, "speculative_num_draft_tokens", None) is None:
            block = None
            try:
                block = models.draft_block_size(models.load_model(ns.speculative_draft_model_path))
            except (OSError, ValueError) as exc:
                log.warning(
                    "Failed to infer %s block_size from draft model config; defaulting "
                    "speculative_num_draft_tokens to 16. Error: %s", algorithm, exc)
            ns.speculative_num_draft_tokens = block or 16
    return str(algorithm)


def _uses_flashinfer_attention(ns: argparse.Namespace) -> bool:
    base = getattr(ns, "attention_backend", None)
    prefill = getattr(ns, "prefill_attention_backend", None) or base or "flashinfer"
    decode = getattr(ns, "decode_attention_backend", None) or base or "flashinfer"
    return "flashinfer" in (prefill, decode)


def _tp_size(ns: argparse.Namespace) -> int:
    return int(getattr(ns, "tp_size", None) or getattr(ns, "tensor_parallel_size", 1) or 1)


def run_checks(ns: argparse.Namespace) -> dict[str, Any]:
    """The real start-up checks, in order; returns what serving needs."""
    root = checks.sglang_dir()
    algorithm = resolve_algorithm(ns)  # 1. speculative algorithm (+ draft block size)
    checks.check_sgl_kernel()  # 2. import sgl_kernel (real dlopen)
    spec = gpu.load_spec()
    visible = gpu.visible_gpus(spec, os.environ.get("CUDA_VISIBLE_DEVICES"))
    torch_cuda = checks.torch_cuda_version()
    capability = visible[0].capability if visible else None
    if checks.is_blackwell(capability, torch_cuda):  # 3. fp8_utils' flashinfer imports
        checks.check_flashinfer_blackwell_imports(root)
    checks.check_soundfile(root)  # 4. soundfile (imported by the HTTP server)
    checks.check_grammar_backend(root, getattr(ns, "grammar_backend", None))  # 5. xgrammar
    if visible and _uses_flashinfer_attention(ns):  # 6. flashinfer's SM guard
        checks.check_flashinfer_arch([g.capability for g in visible], torch_cuda)
    tp = _tp_size(ns)  # 7. the GPUs CUDA would give this process
    if not visible:
        raise RuntimeError("No CUDA GPUs are available")
    if any(g.dead for g in visible[:tp]):
        raise checks.cuda_busy_error()
    if len(visible) < tp:
        raise checks.cuda_ordinal_error()
    target = models.load_model(ns.model_path)  # 8. model folders
    width = 0
    block = None
    if algorithm in SPEC_WITH_DRAFT_CONFIG:
        draft = models.load_model(ns.speculative_draft_model_path)
        width = models.check_draft_fits(draft, target)
        block = models.draft_block_size(draft)
    fraction = float(getattr(ns, "mem_fraction_static", None) or DEFAULT_MEM_FRACTION)
    for g in visible[:tp]:  # memory another live process already holds
        rest = g.memory_total_mib * fraction - gpu.used_mib(g.index, exclude_pid=os.getpid())
        if rest <= 0:
            raise RuntimeError(
                "Not enough memory. Please try to increase --mem-fraction-static. "
                f"Current value: mem_fraction_static={fraction}")
    return {"algorithm": algorithm, "gpus": visible[:tp], "target": target,
            "fraction": fraction, "width": width, "block": block}


def _server_state(ns: argparse.Namespace, found: dict[str, Any]) -> serving.ServerState:
    target: models.ModelInfo = found["target"]
    args = {k: v for k, v in vars(ns).items() if isinstance(v, (str, int, float, bool, type(None)))}
    args.update(tp_size=_tp_size(ns), mem_fraction_static=found["fraction"],
                speculative_algorithm=None if found["algorithm"] == "NONE" else found["algorithm"])
    context = getattr(ns, "context_length", None) or int(
        target.text.get("max_position_embeddings", 32768))
    from ddtree_lab_standin.sglang_init import installed_version

    return serving.ServerState(
        args=args, version=installed_version(), model_path=ns.model_path,
        served_model_name=getattr(ns, "served_model_name", None) or ns.model_path,
        model_type=target.model_type, architectures=target.architectures,
        algorithm=found["algorithm"], context_length=int(context),
        skip_tokenizer_init=bool(getattr(ns, "skip_tokenizer_init", False)),
        vocab_size=int(target.text.get("vocab_size") or 151936),
        speed=speed_model(found["algorithm"], ns, found.get("block")))


def speed_model(algorithm: str, ns: argparse.Namespace, block: int | None) -> SpeedModel:
    """The stand-in's SYNTHETIC cost model for the flags it was started with."""
    block = block or getattr(ns, "speculative_num_draft_tokens", None) or 16
    env = os.environ  # the plugin form's settings (SGLang >= 0.5.17 has no DDTree flags)
    budget = getattr(ns, "speculative_ddtree_budget", None) or env.get("SGLANG_DDTREE_BUDGET")
    topk = getattr(ns, "speculative_ddtree_topk", None) or env.get("SGLANG_DDTREE_TOPK")
    shadow = bool(getattr(ns, "speculative_ddtree_shadow_linear", False)) or \
        env.get("SGLANG_DDTREE_SHADOW_LINEAR") == "1"
    return SpeedModel(
        algorithm=algorithm if algorithm in ("NONE", "DFLASH", "DDTREE") else "DFLASH",
        block=int(block), budget=int(budget or 0), topk=int(topk or 1), shadow_linear=shadow)


def serve(ns: argparse.Namespace, found: dict[str, Any]) -> int:
    gpus: list[gpu.Gpu] = found["gpus"]
    used = int(found["fraction"] * gpus[0].memory_total_mib)
    claims = gpu.write_claims([g.index for g in gpus], used)
    atexit.register(gpu.remove_claims, claims)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    target: models.ModelInfo = found["target"]
    avail = gpus[0].memory_total_mib / 1024
    log.info("Load weight begin. avail mem=%.2f GB", avail)
    if found["width"]:
        log.info("%s draft expects target hidden states of width %d (%d layers x %d)",
                 found["algorithm"], found["width"], found["width"] // target.hidden_size,
                 target.hidden_size)
    log.info("Load weight end. elapsed=0.01 s, type=%s, avail mem=%.2f GB, mem usage=0.01 GB.",
             (target.architectures or ["?"])[0], avail)
    state = _server_state(ns, found)
    _log_speculative(state)
    log.info("max_total_num_tokens=%d, chunked_prefill_size=8192, max_prefill_tokens=16384, "
             "max_running_requests=%s, context_len=%d, available_gpu_mem=%.2f GB",
             state.context_length * 16, getattr(ns, "max_running_requests", None),
             state.context_length, avail * (1 - found["fraction"]))
    try:
        server = labhttp.make_server(ns.host, int(ns.port), serving.routes(state),
                                     timestamps=True)
    except OSError as exc:
        # uvicorn logs asyncio's create_server error as it is (uvicorn/server.py startup())
        reason = (exc.strerror or str(exc)).lower()
        print(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
              f"{(ns.host, int(ns.port))!r}: {reason}", file=sys.stderr, flush=True)
        gpu.remove_claims(claims)
        return 1
    state.started = time.monotonic()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stamp = labhttp.stamp
    print(f"{stamp()}INFO:     Started server process [{os.getpid()}]", flush=True)
    print(f"{stamp()}INFO:     Waiting for application startup.", flush=True)
    print(f"{stamp()}INFO:     Application startup complete.", flush=True)
    print(f"{stamp()}INFO:     Uvicorn running on http://{ns.host}:{ns.port} "
          "(Press CTRL+C to quit)", flush=True)
    announced = False
    while not stop.wait(0.1):
        if not announced and state.ready():
            log.info("The server is fired up and ready to roll!")
            announced = True
    log.info("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
    server.shutdown()
    server.server_close()
    gpu.remove_claims(claims)
    log.info("Gracefully exiting... Remaining number of requests %d. Remaining requests "
             "remaining_rids=[].", state.active())
    return 0


def _log_speculative(state: serving.ServerState) -> None:
    """The draft runner's ready lines, as DFLASH (sglang 0.5.11) and the DDTree payload log."""
    speed = state.speed
    if state.algorithm not in SPEC_WITH_DRAFT_CONFIG:
        return
    log.info("Initialized DFLASH draft runner. attention_backend=%s, model=DFlashDraftModel, "
             "block_size=%d, draft_window_size=None, compact_cache=False",
             state.args.get("attention_backend"), speed.block)
    log.info("DFLASH draft runner ready. mask_token=<|MASK|>, mask_token_id=%s, "
             "mask_token_id_override=%s", None, None)
    if state.algorithm == "DDTREE":
        mode = "shadow-linear" if speed.shadow_linear else "full-tree"
        log.info("DDTREE ready: budget=%d topk=%d block=%d mode=%s", speed.budget, speed.topk,
                 speed.block, mode)


def main(argv: list[str]) -> int:
    root = checks.sglang_dir()
    real_launcher = root / "launch_server.py"
    if real_launcher.is_file() and "is still supported" in real_launcher.read_text("utf-8"):
        warnings.warn(
            "'python -m sglang.launch_server' is still supported, but 'sglang serve' is the "
            "recommended entrypoint.\n  Example: sglang serve --model-path <model> [options]",
            UserWarning, stacklevel=1)
    parser = realargs.build_parser(root / "srt" / "server_args.py")
    ns = parser.parse_args(argv)
    _setup_logging(getattr(ns, "log_level", "info") or "info")
    shown = ", ".join(f"{k}={v!r}" for k, v in sorted(vars(ns).items()) if v not in (None, False))
    log.info("server_args=ServerArgs(%s)", shown)
    found = run_checks(ns)
    _hold_at_gate()
    return serve(ns, found)


def _hold_at_gate() -> None:
    """A lab-only gate for tests that must catch a caller mid-way (bench's Ctrl-C test): with
    DDTREE_LAB_STANDIN_GATE=PATH, every start appends a line to PATH.starts; from the second
    start on, the server waits before it listens while PATH exists (the test removes it)."""
    gate = os.environ.get("DDTREE_LAB_STANDIN_GATE")
    if not gate:
        return
    with open(gate + ".starts", "a", encoding="utf-8") as fh:
        fh.write(f"{os.getpid()}\n")
    with open(gate + ".starts", encoding="utf-8") as fh:
        starts = len(fh.read().splitlines())
    if starts < 2:
        return
    log.info("lab gate %s: start %d waits while it exists", gate, starts)
    while os.path.exists(gate):
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
