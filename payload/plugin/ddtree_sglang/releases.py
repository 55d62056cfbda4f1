"""The SGLang releases the plugin serves, and what each one's code looks like (stdlib only).

Read from the registry's wheels (``tests/test_plugin_releases.py`` checks every supported
release against its real wheel). A release not listed is refused at load with this list; the
ones read and refused say why. The tool reads this file by path (no import of sglang or torch).
"""

from __future__ import annotations

# DFlashWorkerV2.__init__'s parameters after ``self`` (the scheduler passes them by keyword).
CTOR_PS = ("server_args", "gpu_id", "ps", "nccl_port", "target_worker")
CTOR_NO_PS = ("server_args", "gpu_id", "nccl_port", "target_worker")

# Methods the scheduler calls on its algorithm that ``CustomSpecAlgo`` lacks in that release
# (the enum's own, taken over by the plugin's spec class; see ``spec``).
BORROWED_17 = ("carries_draft_hidden_states", "create_future_map", "need_topk")
BORROWED_23 = BORROWED_17 + ("get_platform_worker_cls",)

SUPPORTED: dict[str, dict[str, tuple[str, ...]]] = {
    "0.5.17": {"ctor": CTOR_PS, "borrowed": BORROWED_17},
    "0.5.19": {"ctor": CTOR_PS, "borrowed": BORROWED_17},
    "0.5.21": {"ctor": CTOR_NO_PS, "borrowed": BORROWED_17},
    "0.5.23": {"ctor": CTOR_NO_PS, "borrowed": BORROWED_23},
}

REFUSED: dict[str, str] = {
    "0.5.18": "read (torch 2.13.0, DFlashWorkerV2 with ps) but not in the tested matrix: "
              "use 0.5.17 (torch 2.11.0) or 0.5.19",
    "0.5.20": "read (torch 2.13.0, DFlashWorkerV2 with ps) but not in the tested matrix: "
              "use 0.5.19 or 0.5.21",
    "0.5.22": "read (torch 2.14.1, Python >= 3.11, DFlashWorkerV2 without ps) but not in the "
              "tested matrix: use 0.5.21 or 0.5.23",
}

# Proven on a GPU (the rehearsal on an H200); the others are checked on the CPU only.
GPU_PROVEN = ("0.5.17",)

# The plugin releases (``__version__``) whose verify paths a GPU run proved lossless, and how:
# the rehearsal's correctness (and request-params) phases on an H200, SGLang 0.5.17, SYNTHETIC
# designed models (benchmarks/RESULTS.md, "Device calls of session 8").
PLUGIN_GPU_PROVEN: dict[str, str] = {
    "0.3.3": "session 8 call 1 (main b070b48): SGLANG_DDTREE_TREE_ATTENTION=1 and "
             "SGLANG_DDTREE_VERIFY_GRAPH=1 on every DDTREE server but one, which ran both off",
    "0.3.4": "session 8 call 4 (main 9356722): the correctness phase with every DDTREE server "
             "on the default (both on) but one, which ran both 0",
}
# 0.3.5 is not listed: it differs from 0.3.4 only where SGLANG_DDTREE_TREE_ATTENTION is set to
# an empty value (0.3.4's settings read it as the default, on, while the shared kernel wrapper read
# it as off and the log blamed a failed check; 0.3.5 wraps the kernel on), a case no GPU run had.


def supported_list() -> str:
    return ", ".join(SUPPORTED)


def refusal(version: str) -> str | None:
    """Why ``version`` is not served, or None when it is."""
    if version in SUPPORTED:
        return None
    why = REFUSED.get(version, "not a release the plugin knows")
    return (f"SGLang {version} is not supported by the DDTree plugin ({why}); "
            f"supported: {supported_list()} (0.5.11: the ddtree-deploy patch set)")
