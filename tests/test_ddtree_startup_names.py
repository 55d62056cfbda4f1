"""A DDTREE server's start-up errors name DDTREE, against the REAL sglang 0.5.11 wheel, on CPU.

DDTREE is DFLASH plus a tree verifier: the scheduler builds the target (whose model runner checks
the DFlash drafter's config and the layers it reads) and then the DDTree worker, whose
``DFlashWorker.__init__`` loads the drafter and resolves its mask token. Those checks are the
release's own and say DFLASH. The patched ``Scheduler.init_model_worker`` is compiled alone from
the patched scheduler.py and run with the real ``maybe_init_draft_worker``, the real patched
``SpeculativeAlgorithm``, the real ``DDTreeWorker`` and ``DFlashWorker`` classes and the real
``dflash_utils`` (only the modules that need a GPU stack are replaced: the drafter's model
runner, the batch and forward-batch types). A DDTREE user reads DDTREE, with the same exception
type; a DFLASH user reads the release's text word for word.
"""

from __future__ import annotations

import ast
import sys
import traceback
import types
from pathlib import Path
from typing import Any

import pytest
from test_payload_integration import (
    _stub,
    patched,  # noqa: F401  (fixture)
    sglang_path,  # noqa: F401  (fixture)
    upstream,  # noqa: F401  (fixture)
)

MASK = "<|MASK|>"


def _methods(pkg: Path) -> dict[str, Any]:
    """``init_model_worker`` and ``maybe_init_draft_worker`` of the Scheduler in ``pkg``."""
    tree = ast.parse((pkg / "srt/managers/scheduler.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler")
    wanted = [n for n in cls.body if isinstance(n, ast.FunctionDef)
              and n.name in ("init_model_worker", "maybe_init_draft_worker")]
    scope: dict[str, Any] = {}
    exec(compile(ast.Module(body=wanted, type_ignores=[]), "scheduler.py", "exec"), scope)
    return scope


class _Vocab:
    """A tokenizer's vocabulary: what ``DFlashWorker`` asks of it."""

    def __init__(self, vocab: dict[str, int]) -> None:
        self.vocab = vocab

    def get_vocab(self) -> dict[str, int]:
        return self.vocab


def _install(monkeypatch: pytest.MonkeyPatch, draft_config: dict[str, Any]) -> None:
    """The modules the worker classes import that need a GPU stack; the drafter's model runner
    reads ``draft_config`` as its HF config."""

    class DraftRunnerWorker:  # the drafter's TpModelWorker: its model and HF config
        def __init__(self, **kwargs: Any) -> None:
            self.model_runner = types.SimpleNamespace(
                model=types.SimpleNamespace(),
                model_config=types.SimpleNamespace(hf_config=draft_config))

    stubs: dict[str, dict[str, Any]] = {
        "sglang.srt.distributed": {"get_tp_group": lambda: types.SimpleNamespace(world_size=1)},
        "sglang.srt.managers.schedule_batch": {"ScheduleBatch": object,
                                               "ModelWorkerBatch": object},
        "sglang.srt.managers.scheduler": {"GenerationBatchResult": object},
        "sglang.srt.managers.tp_worker": {"TpModelWorker": DraftRunnerWorker},
        "sglang.srt.mem_cache.common": {"get_last_loc": None},
        "sglang.srt.model_executor.forward_batch_info": {
            "ForwardMode": object, "ForwardBatch": object, "CaptureHiddenMode": object},
        "sglang.srt.server_args": {"ServerArgs": object,
                                   "get_global_server_args": lambda: None,
                                   "set_global_server_args_for_scheduler": lambda args: None},
        "sglang.srt.speculative.dflash_info": {"DFlashDraftInput": object,
                                               "DFlashVerifyInput": object},
        "sglang.srt.speculative.ddtree_info": {"DDTreeVerifyInput": object},
        "sglang.srt.speculative.spec_utils": {"assign_req_to_token_pool_func": None},
        "sglang.srt.utils": {"is_cuda": lambda: False, "is_musa": lambda: False},
        "sglang.srt.layers.quantization.unquant": {"UnquantizedLinearMethod": object},
    }
    for name, attrs in stubs.items():
        monkeypatch.setitem(sys.modules, name, _stub(name, **attrs))


def _start(pkg: Path, algorithm: str, target_start: Any, tokenizer_vocab: dict[str, int]) -> None:
    """The scheduler's ``init_model_worker`` of ``pkg`` for ``algorithm``: ``target_start`` is
    the target's start-up (given the server args), then the real draft worker is built."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    server_args = types.SimpleNamespace(
        speculative_algorithm=algorithm, speculative_draft_load_format=None,
        speculative_num_draft_tokens=16, speculative_dflash_block_size=16,
        speculative_ddtree_budget=15, speculative_ddtree_topk=8,
        speculative_ddtree_shadow_linear=False, speculative_dflash_draft_window_size=None,
        speculative_draft_attention_backend="triton", page_size=1, disable_overlap_schedule=True)
    target = types.SimpleNamespace(
        model_runner=types.SimpleNamespace(
            model_config=types.SimpleNamespace(context_len=4096, vocab_size=1000),
            memory_pool_config=None),
        get_memory_pool=lambda: (None, None), device="cpu", tokenizer=_Vocab(tokenizer_vocab))
    me = types.SimpleNamespace(
        server_args=server_args, gpu_id=0, tp_rank=0, moe_ep_rank=0, nccl_port=0, dp_rank=None,
        attn_cp_rank=0, moe_dp_rank=0,
        spec_algorithm=SpeculativeAlgorithm.from_string(algorithm))

    def init_tp_model_worker() -> None:
        target_start(server_args)
        me.tp_worker = target

    scope = _methods(pkg)
    me.init_tp_model_worker = init_tp_model_worker
    me.maybe_init_draft_worker = lambda: scope["maybe_init_draft_worker"](me)
    scope["init_model_worker"](me)


def _target_reads_the_drafter(draft_config: dict[str, Any], target_layers: int) -> Any:
    """What 0.5.11's target ``ModelRunner.__init__`` checks of a DFlash drafter
    (model_runner.py: parse the drafter's config, pick the target layers it reads)."""

    def start(server_args: Any) -> None:
        from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

        parsed = parse_dflash_draft_config(draft_hf_config=draft_config)
        parsed.resolve_target_layer_ids(target_num_layers=target_layers,
                                        draft_num_layers=parsed.require_num_layers())
    return start


def _nothing(server_args: Any) -> None:
    return None


# (the drafter's HF config, the target's start-up, the target tokenizer's vocab, words said)
CASES = {
    # DFlashWorker.__init__: the drafter's mask token id disagrees with the tokenizer.
    "mask token mismatch": ({"num_hidden_layers": 1,
                             "dflash_config": {"mask_token": MASK, "mask_token_id": 5}},
                            None, {MASK: 7}, "config mismatch"),
    # DFlashWorker.__init__: the drafter's mask token id is outside the target's vocabulary.
    "mask token outside the vocab": ({"num_hidden_layers": 1,
                                      "dflash_config": {"mask_token": MASK,
                                                        "mask_token_id": 5000}},
                                     None, {}, "outside the target vocab size"),
    # The target's model runner: the drafter reads a layer the target does not have.
    "target layer out of range": ({"num_hidden_layers": 1,
                                   "dflash_config": {"target_layer_ids": [1, 40]}},
                                  40, {MASK: 7}, "out-of-range layer id"),
    # The target's model runner: the drafter's config has no layer count.
    "draft layers missing": ({"dflash_config": {}}, 40, {MASK: 7}, "requires draft num_hidden"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_start_up_errors_name_ddtree_to_its_users(
        upstream: Path, sglang_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        case: str) -> None:
    config, target_layers, vocab, says = CASES[case]
    _install(monkeypatch, config)
    target = _nothing if target_layers is None else _target_reads_the_drafter(config,
                                                                              target_layers)
    with pytest.raises(ValueError, match=says) as ddtree:
        _start(sglang_path, "DDTREE", target, vocab)
    assert type(ddtree.value) is ValueError
    assert "DDTREE" in str(ddtree.value) and "DFLASH" not in str(ddtree.value), ddtree.value
    with pytest.raises(ValueError) as dflash:
        _start(sglang_path, "DFLASH", target, vocab)
    with pytest.raises(ValueError) as release:  # 0.5.11's own scheduler
        _start(upstream, "DFLASH", target, vocab)
    assert str(dflash.value) == str(release.value) and "DFLASH" in str(release.value)
    # the traceback still ends in the check that raised (the release's frame, not the rename)
    raised = [traceback.extract_tb(e.value.__traceback__)[-1] for e in (ddtree, dflash)]
    assert [(f.filename, f.lineno) for f in raised][0] == (raised[1].filename, raised[1].lineno)
    assert not raised[0].filename.endswith("ddtree_args.py"), raised[0]


def test_the_ddtree_worker_is_what_the_scheduler_builds(
        sglang_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The cases above reach ``DFlashWorker.__init__`` through ``DDTreeWorker.__init__``: the
    drafter is built with the draft block (16), not the verify width (budget + 1)."""
    seen: list[Any] = []
    _install(monkeypatch, {})

    class Seen:
        def __init__(self, **kwargs: Any) -> None:
            seen.append(kwargs["server_args"])
            raise RuntimeError("DFLASH drafter stopped here")

    monkeypatch.setattr(sys.modules["sglang.srt.managers.tp_worker"], "TpModelWorker", Seen)
    with pytest.raises(RuntimeError, match="^DDTREE drafter stopped here$"):
        _start(sglang_path, "DDTREE", _nothing, {})
    assert [a.speculative_num_draft_tokens for a in seen] == [16]
    assert sys.modules["sglang.srt.speculative.ddtree_worker"].DDTreeWorker.__mro__[1].__name__ \
        == "DFlashWorker"
