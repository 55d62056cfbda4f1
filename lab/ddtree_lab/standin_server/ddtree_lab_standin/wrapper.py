"""The story's temporary GPU0 wrapper on CT200, as a lab stand-in (stdlib only).

On the real CT200 another team's model server held GPU0 and answered on port
30000. In the lab this program plays that part: run by the system python3 (not a
venv) from /usr/local/lib/ddtree-lab/wrapper.py by qwen-wrapper.service, it
claims every GPU in CUDA_VISIBLE_DEVICES (claim files the lab's nvidia-smi
reads, so the GPU shows as busy with a python3 process) and answers /health and
/v1/models until SIGTERM. It fails like a CUDA process would when the GPUs it is
given are missing or dead.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

if __package__:
    from . import gpu
    from . import http as labhttp
else:  # run as a script: the package lies under ./python next to this file
    sys.path.insert(0, str(Path(__file__).resolve().parent / "python"))
    from ddtree_lab_standin import gpu  # type: ignore[no-redef]
    from ddtree_lab_standin import http as labhttp  # type: ignore[no-redef]

DEFAULT_MODEL = "Qwen3.6-27B"
DEFAULT_FRACTION = 0.88


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="wrapper.py", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--served-model-name", default=DEFAULT_MODEL)
    parser.add_argument("--mem-fraction", type=float, default=DEFAULT_FRACTION)
    args = parser.parse_args(argv)
    if not 0.0 < args.mem_fraction <= 1.0:
        parser.error(f"--mem-fraction must be in (0, 1], got {args.mem_fraction}")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        spec = gpu.load_spec()
    except gpu.GpuSpecError as exc:
        print(f"wrapper: cannot read the GPU spec: {exc}", file=sys.stderr)
        return 1
    visible = gpu.visible_gpus(spec, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if not visible:
        print("RuntimeError: No CUDA GPUs are available", file=sys.stderr)
        return 1
    if any(g.dead for g in visible):
        print("RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
              file=sys.stderr)
        return 1
    used = int(min(g.memory_total_mib for g in visible) * args.mem_fraction)
    claims = gpu.write_claims([g.index for g in visible], used)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    created = int(time.time())

    def health(_: labhttp.Request) -> labhttp.Response:
        return labhttp.Response(200, b"")

    def models(_: labhttp.Request) -> labhttp.Response:
        return labhttp.Response(200, {"object": "list", "data": [{
            "id": args.served_model_name, "object": "model", "created": created,
            "owned_by": "sglang", "root": args.served_model_name}]})

    try:
        server = labhttp.make_server(args.host, args.port, {
            ("GET", "/health"): health, ("GET", "/v1/models"): models}, access_log=False)
    except OSError as exc:
        gpu.remove_claims(claims)
        print(f"wrapper: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    try:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        names = ",".join(str(g.index) for g in visible)
        print(f"wrapper: GPU(s) {names} claimed ({used} MiB each); serving "
              f"{args.served_model_name} on {args.host}:{args.port}", flush=True)
        while not stop.wait(0.5):
            pass
        server.shutdown()
        server.server_close()
    finally:
        gpu.remove_claims(claims)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
