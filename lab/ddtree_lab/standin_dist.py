"""The lab-only distribution ``ddtree-lab-standin`` and the files lab hosts get outside venvs.

:func:`build_standin_wheel` packs ``standin_server/`` (package
``ddtree_lab_standin`` + its ``.pth``) into a content-stable wheel: same sources,
same bytes (fixed timestamps, sorted entries, a correct RECORD).

:func:`host_files` lists what the lab writes into a container's root fs: the two
model folders (stand-in configs; weights are never needed) and a tmpfiles.d rule
copying them to /dev/shm at boot; for ct200 also the story's GPU0 wrapper
(program, its package copy, and ``qwen-wrapper.service``, which the lab enables).
"""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile
from pathlib import Path

from ddtree_lab.errors import LabError

SOURCE = Path(__file__).resolve().parent / "standin_server"
PACKAGE = "ddtree_lab_standin"
DIST = "ddtree_lab_standin"
VERSION = "0.1.0"
WHEEL_NAME = f"{DIST}-{VERSION}-py3-none-any.whl"
_EPOCH = (1980, 1, 1, 0, 0, 0)

LIB_DIR = "/usr/local/lib/ddtree-lab"
WRAPPER_PATH = f"{LIB_DIR}/wrapper.py"
WRAPPER_UNIT = "qwen-wrapper.service"
MODELS_DIR = "/usr/share/ddtree-lab/models"
TARGET_MODEL = "Qwen3.6-27B"
DRAFT_MODEL = "Qwen3.6-27B-DFlash-b16"

METADATA = f"""Metadata-Version: 2.1
Name: ddtree-lab-standin
Version: {VERSION}
Summary: LAB STAND-IN, never for real hosts: serves a light sglang init and a stand-in
 sglang.launch_server in ddtree-deploy's GPU-less lab containers (real sglang files untouched)
Requires-Python: >=3.10
"""

WHEEL = """Wheel-Version: 1.0
Generator: ddtree-deploy standin_dist
Root-Is-Purelib: true
Tag: py3-none-any
"""


def _sources() -> list[tuple[str, bytes]]:
    """(archive name, bytes) of the package and the .pth file, sorted."""
    package = SOURCE / PACKAGE
    pth = SOURCE / f"{PACKAGE}.pth"
    if not package.is_dir() or not pth.is_file():
        raise LabError(f"the lab stand-in server sources are missing under {SOURCE}")
    entries = [(f"{PACKAGE}/{p.name}", p.read_bytes()) for p in package.glob("*.py")]
    entries.append((pth.name, pth.read_bytes()))
    return sorted(entries)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def wheel_entries() -> list[tuple[str, bytes]]:
    """Every file of the wheel in archive order, RECORD last."""
    info = f"{DIST}-{VERSION}.dist-info"
    entries = _sources() + [
        (f"{info}/METADATA", METADATA.encode()),
        (f"{info}/WHEEL", WHEEL.encode()),
        (f"{info}/top_level.txt", f"{PACKAGE}\n".encode()),
    ]
    record = [_record_line(name, data) for name, data in entries] + [f"{info}/RECORD,,"]
    entries.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    return entries


def build_standin_wheel(out_dir: Path) -> Path:
    """Write the wheel into ``out_dir`` (rewritten only when its bytes change)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / WHEEL_NAME
    scratch = target.with_suffix(".partial")
    with zipfile.ZipFile(scratch, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in wheel_entries():
            item = zipfile.ZipInfo(name, date_time=_EPOCH)
            item.external_attr = 0o644 << 16
            item.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(item, data)
    new = scratch.read_bytes()
    if target.is_file() and target.read_bytes() == new:
        scratch.unlink()
    else:
        scratch.replace(target)
    return target


# -- files outside venvs ---------------------------------------------------------------


def target_config() -> dict[str, object]:
    """Stand-in config of the story's 27B target (Qwen3 dense layout, 64 x 5120)."""
    return {
        "_comment": "ddtree-deploy lab stand-in: config only, no weights",
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    }


def draft_config() -> dict[str, object]:
    """Stand-in DFlash drafter config (block 16, taps 5 target layers: 5 x 5120 = 25600)."""
    return {
        "_comment": "ddtree-deploy lab stand-in of a z-lab style DFlash drafter: config only",
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "num_hidden_layers": 5,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
        "torch_dtype": "bfloat16",
        "block_size": 16,
        "num_target_layers": 64,
        "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 16, 31, 46, 61]},
    }


def _json(value: object) -> bytes:
    return (json.dumps(value, indent=2) + "\n").encode()


TMPFILES = f"""# ddtree-deploy lab: /dev/shm is a fresh tmpfs in a booted container; copy the
# stand-in model folders there at boot, as the story's hosts keep models in /dev/shm.
C /dev/shm/{TARGET_MODEL} - - - - {MODELS_DIR}/{TARGET_MODEL}
C /dev/shm/{DRAFT_MODEL} - - - - {MODELS_DIR}/{DRAFT_MODEL}
"""

UNIT = f"""[Unit]
Description=Temporary Qwen server wrapper on GPU0 (ddtree-deploy lab stand-in)
After=network.target

[Service]
Type=simple
Environment=CUDA_VISIBLE_DEVICES=0
Environment=PYTHONUNBUFFERED=1
ExecStart=/usr/bin/python3 {WRAPPER_PATH} --host 0.0.0.0 --port 30000
Restart=on-failure
RestartSec=2

[Install]
WantedBy=multi-user.target
"""


def ct200_files() -> list[tuple[str, bytes, int]]:
    """The GPU0 wrapper: program, the package it imports, and its unit."""
    package = SOURCE / PACKAGE
    files = [(WRAPPER_PATH, (package / "wrapper.py").read_bytes(), 0o755)]
    for name in ("__init__.py", "gpu.py", "http.py", "wrapper.py"):
        files.append((f"{LIB_DIR}/python/{PACKAGE}/{name}", (package / name).read_bytes(), 0o644))
    files.append((f"/etc/systemd/system/{WRAPPER_UNIT}", UNIT.encode(), 0o644))
    return files


def host_files(kind: str | None = None) -> list[tuple[str, bytes, int]]:
    """(container path, content, mode) outside venvs; ``kind="ct200"`` adds the wrapper."""
    files = [
        (f"{MODELS_DIR}/{TARGET_MODEL}/config.json", _json(target_config()), 0o644),
        (f"{MODELS_DIR}/{DRAFT_MODEL}/config.json", _json(draft_config()), 0o644),
        ("/etc/tmpfiles.d/ddtree-lab-models.conf", TMPFILES.encode(), 0o644),
    ]
    if kind == "ct200":
        files += ct200_files()
    return files
