"""The story's ct200 as facts data (8 free GPUs, the cu130 venv with SGLang 0.5.11 or none, the
deployment's unit active or not): one fixture for tests/test_converge_plan.py and the golden
files' fact scenarios (tests/golden.py)."""

from __future__ import annotations

from typing import Any

V = "/root/venv_sglang211"
SP = f"{V}/lib/python3.11/site-packages"
CU130 = {"torch": "2.11.0", "sglang": "0.5.11", "soundfile": "0.13.1",
         "flashinfer-python": "0.6.8.post1"}


def story_facts(venv_exists: bool, dists: dict[str, str] | None = None, ddtree: bool = True,
                active: bool = True) -> dict[str, Any]:
    venvs: list[dict[str, Any]] = [{"path": "/root/venv",
                                    "distributions": {"torch": "2.11.0+cu128"},
                                    "torch": {"version": "2.11.0+cu128", "cuda": "12.8"}}]
    if venv_exists:
        venvs.append({"path": V, "distributions": dists if dists is not None else CU130,
                      "torch": {"version": "2.11.0+cu130", "cuda": "13.0"},
                      "sglang": {"version": "0.5.11", "knows_ddtree": ddtree,
                                 "ddtree_is_dflash": ddtree},
                      "nvidia": {"cu13": True, "lib_dirs": [f"{SP}/nvidia/cu13/lib"]}})
    return {
        "host": "ct200",
        "nvidia": {"present": True, "gpus": [{"index": i, "processes": []} for i in range(8)]},
        "venvs": venvs,
        "models": [{"path": "/dev/shm/Qwen3.6-27B"}, {"path": "/dev/shm/Qwen3.6-27B-DFlash-b16"}],
        "services": {"units": [{"name": "sglang-ddtree.service", "active": "active"}]
                     if active else []},
    }
