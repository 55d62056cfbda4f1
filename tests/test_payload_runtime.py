"""The payload's runtime fixes for real traffic, on CPU, against the REAL sglang 0.5.11 wheel.

* Attention backend: the patched ``ServerArgs.__post_init__`` is compiled from the patched source
  and run in its real order on an object whose other ``_handle_*`` steps are recorded, one of
  them filling in SGLang's default backend (fa3 on Hopper) as 0.5.11 does, and whose
  ``_handle_speculative_decoding`` is the real patched method.
* Verify width: ``budget + 1 < block`` is refused at start.
* The accept rate: the patched tokenizer-manager method, compiled alone, divides by the drafts a
  round can accept (block - 1), as DFLASH's does, not by the budget.
* Sampled verification (``ddtree/sampling.py`` + the core's walk): the committed tokens have the
  target's distribution (a chi-square test with fixed seeds over a designed tree) and the test
  rejects today's greedy-follow and a biased sampler.
* The drafter's top-k (``ddtree/vocab.py`` and the worker's ``_draft_topk``): chunked rows equal
  the unchunked top-k; with a simulated tensor-parallel group (threads, an all-gather that
  refuses unequal sizes as NCCL would hang on them) the merge equals the unsharded top-k for
  shard sizes smaller and larger than top-k.
"""

from __future__ import annotations

import ast
import logging
import re
import sys
import threading
import traceback
import types
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "payload"))

from ddtree import core, sampling, vocab
from test_payload_integration import (
    _run_handle,
    _server_args,
    _stub,
    patched,  # noqa: F401  (fixture)
    sglang_path,  # noqa: F401  (fixture)
    upstream,  # noqa: F401  (fixture)
    verify_mods,  # noqa: F401  (fixture)
)

# --- the attention backend, in __post_init__'s real order --------------------------------------


def _post_init(patched_pkg: Path, monkeypatch: pytest.MonkeyPatch, **over: Any) -> Any:
    """Run the patched ``__post_init__``; every handler but speculative decoding is recorded."""
    defaults, handle, tree = _server_args(patched_pkg)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    post = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__post_init__")
    moe = types.ModuleType("sglang.srt.layers.moe.utils")
    moe.__dict__["MoeRunnerBackend"] = lambda name: types.SimpleNamespace(
        is_flashinfer_trtllm=lambda: False)
    monkeypatch.setitem(sys.modules, "sglang.srt.layers.moe.utils", moe)
    platforms = types.ModuleType("sglang.srt.platforms")
    platforms.__dict__["current_platform"] = types.SimpleNamespace(
        apply_server_args_defaults=lambda args: None)
    monkeypatch.setitem(sys.modules, "sglang.srt.platforms", platforms)
    scope: dict[str, Any] = {"logger": logging.getLogger("t"), "json": __import__("json"),
                             "get_device_memory_capacity": lambda device: 141 << 10}
    exec(compile(ast.Module(body=[post, handle], type_ignores=[]), "server_args.py", "exec"),
         scope)
    calls: list[str] = []

    class Args(types.SimpleNamespace):
        def __getattr__(self, name: str) -> Any:
            if not name.startswith("_handle") and not name.startswith("_maybe"):
                raise AttributeError(name)

            def record(*a: Any) -> None:
                calls.append(name)
                if name == "_handle_attention_backend_compatibility" \
                        and self.attention_backend is None:
                    self.attention_backend = "fa3"  # 0.5.11's default on SM 9.0
            return record

    args = Args(**{**defaults, "model_path": "/m", "speculative_draft_model_path": "/d",
                   "speculative_num_draft_tokens": 16, **over})
    args._handle_speculative_decoding = lambda: (calls.append("spec"),
                                                 scope["_handle_speculative_decoding"](args))
    scope["__post_init__"](args)
    assert calls.index("_handle_attention_backend_compatibility") < calls.index("spec")
    return args


def test_ddtree_without_a_backend_gets_triton(
        sglang_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    args = _post_init(sglang_path, monkeypatch, speculative_algorithm="DDTREE",
                      speculative_ddtree_budget=15, speculative_ddtree_topk=8)
    assert args.attention_backend == "triton"
    assert args.speculative_num_draft_tokens == 16 and args.speculative_dflash_block_size == 16
    dflash = _post_init(sglang_path, monkeypatch, speculative_algorithm="DFLASH")
    assert dflash.attention_backend == "fa3"  # DFLASH keeps SGLang's own default
    shadow = _post_init(sglang_path, monkeypatch, speculative_algorithm="DDTREE",
                        speculative_ddtree_shadow_linear=True)
    assert shadow.attention_backend == "fa3"  # the chain runs on any DFlash backend


# Every refusal of DFLASH's start-up checks in ServerArgs, which DDTREE runs too (issue 25 item 6):
# (what is set, words of the message).
DFLASH_REFUSALS = [
    ({"enable_dp_attention": True}, "does not support dp attention"),
    ({"pp_size": 2}, "only supports pp_size == 1"),
    ({"speculative_draft_model_path": None}, "requires setting --speculative-draft-model-path"),
    ({"speculative_dflash_block_size": 0}, "--speculative-dflash-block-size to be positive"),
    ({"speculative_dflash_block_size": 8}, "they must match"),
    ({"speculative_dflash_draft_window_size": 0}, "window-size to be positive"),
    ({"speculative_dflash_draft_window_size": 4}, "window-size must be >="),
]


@pytest.mark.parametrize(("over", "says"), DFLASH_REFUSALS, ids=[s for _, s in DFLASH_REFUSALS])
def test_dflash_start_up_refusals_name_ddtree_to_its_users(
        upstream: Path, sglang_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        over: dict[str, Any], says: str) -> None:
    """Through the patched ``__post_init__``: a DDTREE user refused by a check DDTREE shares
    with DFLASH reads DDTREE (the same exception type); a DFLASH user reads the release's own
    message word for word (0.5.11's unpatched method)."""
    with pytest.raises(ValueError, match=re.escape(says)) as ddtree:
        _post_init(sglang_path, monkeypatch, speculative_algorithm="DDTREE", **over)
    assert type(ddtree.value) is ValueError
    assert "DDTREE" in str(ddtree.value) and "DFLASH" not in str(ddtree.value), ddtree.value
    with pytest.raises(ValueError) as dflash:
        _post_init(sglang_path, monkeypatch, speculative_algorithm="DFLASH", **over)
    with pytest.raises(ValueError) as release:
        _run_handle(upstream, monkeypatch, speculative_algorithm="DFLASH", **over)
    assert str(dflash.value) == str(release.value) and "DFLASH" in str(release.value)
    last = [traceback.extract_tb(e.value.__traceback__)[-1] for e in (ddtree, dflash)]
    assert (last[0].name, last[0].lineno) == (last[1].name, last[1].lineno)  # where it raised


def test_only_refusals_naming_dflash_alone_are_renamed(sglang_path: Path) -> None:  # noqa: F811
    from sglang.srt.speculative.ddtree_args import ddtree_named

    ddtree, dflash = (types.SimpleNamespace(speculative_algorithm=a) for a in ("DDTREE", "DFLASH"))
    cases = [(ddtree, ValueError("DFLASH needs X")), (ddtree, RuntimeError("DFLASH needs X")),
             (dflash, ValueError("DFLASH needs X")),
             (ddtree, ValueError("DDTREE cannot; use --speculative-algorithm DFLASH")),
             (ddtree, ValueError("no algorithm named")), (ddtree, KeyError("DFLASH")),
             (ddtree, AttributeError("model lacks DFLASH layer capture"))]
    said = []
    for args, exc in cases:
        with pytest.raises(type(exc)) as got, ddtree_named(args):
            raise exc
        said.append(str(got.value))
    assert said == ["DDTREE needs X", "DDTREE needs X", "DFLASH needs X",
                    "DDTREE cannot; use --speculative-algorithm DFLASH", "no algorithm named",
                    "'DFLASH'", "model lacks DDTREE layer capture"]
    # renamed, the error is still the release's own: its cause and its attributes kept
    cause = ValueError("invalid literal for int() with base 10: 'x8'")
    with pytest.raises(ValueError) as got, ddtree_named(ddtree):
        raise ValueError("Invalid DFLASH block_size='x8'") from cause
    assert str(got.value) == "Invalid DDTREE block_size='x8'" and got.value.__cause__ is cause
    model = object()
    with pytest.raises(AttributeError) as missing, ddtree_named(ddtree):
        raise AttributeError("DFLASH layer capture", name="set_dflash_layers", obj=model)
    assert str(missing.value) == "DDTREE layer capture"
    assert (missing.value.name, missing.value.obj) == ("set_dflash_layers", model)


def test_ddtree_with_a_named_non_triton_backend_is_refused_with_the_flag(
        sglang_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    for field in ("attention_backend", "decode_attention_backend"):
        with pytest.raises(ValueError, match=f"{field}=fa3.*--attention-backend triton"):
            _post_init(sglang_path, monkeypatch, speculative_algorithm="DDTREE",
                       **{field: "fa3"})
    named = _post_init(sglang_path, monkeypatch, speculative_algorithm="DDTREE",
                       attention_backend="triton", speculative_ddtree_budget=20)
    assert named.attention_backend == "triton" and named.speculative_num_draft_tokens == 21


def test_budget_smaller_than_the_block_is_refused(
        sglang_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    with pytest.raises(ValueError, match=r"budget 7 is too small.*block of 16.*budget 15 or more"):
        _run_handle(sglang_path, monkeypatch, speculative_algorithm="DDTREE",
                    speculative_ddtree_budget=7)
    ok = _run_handle(sglang_path, monkeypatch, speculative_algorithm="DDTREE",
                     speculative_ddtree_budget=15)
    assert ok.speculative_num_draft_tokens == 16
    shadow = _run_handle(sglang_path, monkeypatch, speculative_algorithm="DDTREE",
                         speculative_ddtree_budget=7, speculative_ddtree_shadow_linear=True)
    assert shadow.speculative_num_draft_tokens == 16  # the chain is verified: the block


def test_relaxed_accept_thresholds_stay_refused(
        sglang_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    with pytest.raises(ValueError, match="relaxed thresholds would change the output"):
        _run_handle(sglang_path, monkeypatch, speculative_algorithm="DDTREE",
                    speculative_accept_threshold_acc=0.5)


# --- the accept rate ----------------------------------------------------------------------------


def _spec_metrics(patched_pkg: Path, algorithm: str, num_draft: int, block: int | None) -> dict:
    tree = ast.parse((patched_pkg / "srt/managers/tokenizer_manager.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef)
               and n.name == "TokenizerManager")
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef)
                  and n.name == "_calculate_spec_decoding_metrics")
    method.args.args[2].annotation = None  # names types the test does not load
    scope: dict[str, Any] = {"Dict": dict, "Any": Any}
    exec(compile(ast.Module(body=[method], type_ignores=[]), "tokenizer_manager.py", "exec"),
         scope)
    me = types.SimpleNamespace(server_args=types.SimpleNamespace(
        speculative_algorithm=algorithm, speculative_num_draft_tokens=num_draft,
        speculative_dflash_block_size=block, speculative_num_steps=None))
    recv = types.SimpleNamespace(spec_verify_ct=[10], spec_accepted_drafts=[30],
                                 spec_acceptance_histogram=[[0, 10]],
                                 completion_tokens=[40])
    meta: dict = {}
    scope["_calculate_spec_decoding_metrics"](me, meta, recv, 0)
    return meta


def test_accept_rate_divides_by_the_drafts_a_round_can_accept(
        sglang_path: Path) -> None:  # noqa: F811
    dflash = _spec_metrics(sglang_path, "DFLASH", 16, 16)
    ddtree = _spec_metrics(sglang_path, "DDTREE", 64, 16)  # budget 63, block 16
    assert dflash["spec_accept_rate"] == pytest.approx(30 / 150)
    assert ddtree["spec_accept_rate"] == pytest.approx(30 / 150)  # was 30 / 630
    assert ddtree["spec_accept_length"] == dflash["spec_accept_length"] == 4.0


# --- sampled verification -------------------------------------------------------------------

V = 6
# The target's next-token distribution depends on the last token only (a designed Markov chain).
P = torch.tensor([[0.05, 0.40, 0.30, 0.15, 0.05, 0.05]] * V)
P[1] = torch.tensor([0.10, 0.05, 0.50, 0.20, 0.10, 0.05])
P[2] = torch.tensor([0.30, 0.30, 0.10, 0.10, 0.10, 0.10])


def _two_token_law() -> torch.Tensor:
    """Exact law of the first two committed tokens after root 0: ``[V, V]``."""
    return P[0].unsqueeze(1) * P


def _tree(roots: torch.Tensor) -> core.DDTree:
    """The same drafter every round: depth 1 ranks 3, 1, 2 (its top-1 is the target's 3rd)."""
    rows = roots.shape[0]
    lp = torch.log(torch.tensor([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]]))
    tokens = torch.tensor([[3, 1, 2], [2, 0, 3]])
    return core.build_tree(lp.expand(rows, 2, 3), tokens.expand(rows, 2, 3), roots, budget=6,
                           backend="torch")


def _round(roots: torch.Tensor, pick: Any, gen: torch.Generator) -> torch.Tensor:
    """One verify round from ``roots``: the committed tokens ``[rows, D + 1]`` (-1 padded)."""
    tree = _tree(roots)
    inputs = core.compile_tree(tree, torch.zeros_like(roots), backend="torch")
    # The target's logits at every slot: it sees the slot's own token (the context's last).
    logits = torch.log(P[inputs.input_ids.clamp(min=0)])  # [rows, N, V]
    target = pick(logits.reshape(-1, V), gen).view(roots.shape[0], -1)
    return core.walk_tree(tree, target, inputs.mask, backend="torch").new_tokens


def _walk_counts(pick: Any, rows: int = 40000, seed: int = 7) -> torch.Tensor:
    """Counts of the first two generated tokens after root 0, over ``rows`` generations."""
    gen = torch.Generator().manual_seed(seed)
    first = _round(torch.zeros(rows, dtype=torch.long), pick, gen)
    again = _round(first[:, 0].clone(), pick, gen)  # used where round 1 committed one token
    second = torch.where(first[:, 1] >= 0, first[:, 1], again[:, 0])
    counts = torch.zeros(V, V)
    counts.index_put_((first[:, 0], second), torch.ones(rows), accumulate=True)
    return counts


def _chi2(counts: torch.Tensor, law: torch.Tensor) -> float:
    expected = law * counts.sum()
    keep = expected > 0
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


def _sampled(logits: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    rows = logits.shape[0]
    return sampling.sample_tokens(logits, torch.ones(rows), torch.full((rows,), V),
                                  torch.ones(rows), generator=gen)


CHI2_CRIT = 60.0  # 35 degrees of freedom: p < 1e-3 above 66.6; the fair sampler sits near 35


def test_sampled_walk_commits_the_targets_distribution() -> None:
    law = _two_token_law()
    for seed in (1, 2, 3):
        assert _chi2(_walk_counts(_sampled, seed=seed), law) < CHI2_CRIT


def test_the_statistical_test_rejects_greedy_follow_and_a_biased_sampler() -> None:
    law = _two_token_law()
    greedy = _walk_counts(lambda logits, gen: torch.argmax(logits, dim=-1))
    assert _chi2(greedy, law) > 10 * CHI2_CRIT

    def hot(logits: torch.Tensor, gen: torch.Generator) -> torch.Tensor:  # temperature ignored
        return _sampled(logits * 1.3, gen)

    assert _chi2(_walk_counts(hot), law) > CHI2_CRIT


def test_filters_are_sglangs_own_top_k_then_top_p_on_the_full_distribution_then_min_p() -> None:
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1, 0.0001]]))
    probs, ids = sampling.filtered_probs(logits, torch.ones(1), torch.tensor([3]),
                                         torch.tensor([0.6]))
    # top-p 0.6 on the full distribution keeps 0.4 and 0.3 (0.4 of better mass <= 0.6).
    assert ids[0].tolist() == [0, 1, 2]
    assert probs[0].tolist() == pytest.approx([4 / 7, 3 / 7, 0.0])
    # Where the orders differ: top-k 2, top-p 0.5. SGLang's sampler (sampler.py, pytorch path;
    # flashinfer "joint") keeps both (0.4 <= 0.5); DFLASH's renormalised top-p (4/7 > 0.5)
    # would keep one.
    probs, _ = sampling.filtered_probs(logits, torch.ones(1), torch.tensor([2]),
                                       torch.tensor([0.5]))
    assert probs[0].tolist() == pytest.approx([4 / 7, 3 / 7])
    probs, _ = sampling.filtered_probs(logits, torch.ones(1), torch.tensor([5]),
                                       torch.ones(1), torch.tensor([0.6]))
    assert probs[0].tolist() == pytest.approx([4 / 7, 3 / 7, 0, 0, 0], abs=1e-4)
    greedy = sampling.sample_tokens(logits.expand(50, 5), torch.ones(50),
                                    torch.ones(50, dtype=torch.long), torch.ones(50))
    assert greedy.tolist() == [0] * 50  # SGLang's greedy requests carry top-k 1
    cold = sampling.sample_tokens(logits.expand(2000, 5), torch.full((2000,), 0.25),
                                  torch.full((2000,), 5), torch.ones(2000),
                                  generator=torch.Generator().manual_seed(0))
    share = (cold == 0).float().mean().item()
    want = 0.4**4 / sum(p**4 for p in (0.4, 0.3, 0.2, 0.1, 0.0001))
    assert share == pytest.approx(want, abs=0.04)


def test_top_p_one_keeps_the_whole_tail() -> None:
    # float32 cumulative sums reach 1.0 before the tail ends on a large vocabulary; top-p 1
    # must keep every token all the same (a review found the tail dropped).
    logits = torch.randn(2, 50000, generator=torch.Generator().manual_seed(9)) * 4
    probs, _ = sampling.filtered_probs(logits, torch.ones(2), torch.full((2,), 50000),
                                       torch.ones(2))
    assert int((probs > 0).sum()) == 2 * 50000


def test_greedy_rows_of_a_mixed_batch_take_their_argmax_and_the_dense_path_samples() -> None:
    logits = torch.zeros(6, 8)
    logits[:, 3] = 1.0
    logits[:, 5] = 1.0  # a tie: the argmax is the first of them, whatever the batch holds
    ks = torch.tensor([1, 1, 8, 8, 1, 8])
    got = sampling.sample_tokens(logits, torch.ones(6), ks, torch.ones(6), max_top_k=8,
                                 min_top_k=8, need_top_p=False,
                                 generator=torch.Generator().manual_seed(1))
    assert got[[0, 1, 4]].tolist() == [int(torch.argmax(logits[0]))] * 3
    rows = 4000
    dense = sampling.sample_tokens(torch.log(torch.tensor([[0.5, 0.25, 0.25]])).expand(rows, 3),
                                   torch.ones(rows), torch.full((rows,), 3), torch.ones(rows),
                                   max_top_k=3, min_top_k=3, need_top_p=False,
                                   generator=torch.Generator().manual_seed(2))
    assert (dense == 0).float().mean().item() == pytest.approx(0.5, abs=0.03)


def test_sampling_in_chunks_equals_one_pass() -> None:
    logits = torch.randn(37, 50, generator=torch.Generator().manual_seed(3))
    args = (torch.full((37,), 0.8), torch.full((37,), 20), torch.full((37,), 0.9))
    whole = sampling.sample_tokens(logits, *args, generator=torch.Generator().manual_seed(5))
    parts = sampling.sample_tokens(logits, *args, generator=torch.Generator().manual_seed(5),
                                   chunk_elements=50 * 4)
    assert torch.equal(whole, parts)


# --- the drafter's top-k ---------------------------------------------------------------------


class _Group:
    """A simulated TP group: ranks are threads; the all-gather waits for all and checks sizes."""

    def __init__(self, world: int) -> None:
        self.world_size, self.barrier = world, threading.Barrier(world, timeout=20)
        self.slots: list[Any] = [None] * world
        self.local = threading.local()

    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self.slots[self.local.rank] = inp
        self.barrier.wait()
        shapes = {tuple(t.shape) for t in self.slots}
        if len(shapes) != 1:
            self.barrier.abort()
            raise RuntimeError(f"all-gather of unequal sizes {sorted(shapes)} (NCCL would hang)")
        out.copy_(torch.cat(self.slots, 0))
        self.barrier.wait()


def _shards(vocab_size: int, world: int) -> list[tuple[int, int]]:
    per = -(-vocab_size // world)  # SGLang pads the vocabulary and gives the last shard less
    return [(r * per, min(vocab_size, (r + 1) * per)) for r in range(world)]


def _run_ranks(world: int, fn: Any) -> list[Any]:
    group = _Group(world)
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        group.local.rank = rank
        try:
            results[rank] = fn(rank, group)
        except BaseException as exc:
            errors.append(exc)
            group.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize(("vocab_size", "world", "k"),
                         [(40, 4, 8), (13, 4, 8), (9, 2, 8), (5, 2, 8)])
def test_tp_merge_equals_the_unsharded_top_k(vocab_size: int, world: int, k: int) -> None:
    gen = torch.Generator().manual_seed(vocab_size)
    states = torch.randn(6, 16, generator=gen)
    weight = torch.randn(vocab_size, 16, generator=gen)
    want_lp, want_ids = core.draft_topk((states @ weight.T).unsqueeze(0), k, backend="torch")

    def rank_fn(rank: int, group: _Group) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = _shards(vocab_size, world)[rank]

        def gather(t: torch.Tensor) -> torch.Tensor:
            out = t.new_empty((world, *t.shape))
            group.all_gather_into_tensor(out.view(world * t.shape[0], *t.shape[1:]), t)
            return out

        return vocab.topk_logprobs(states, weight[lo:hi], k, vocab_start=lo, world_size=world,
                                   gather=gather, chunk_elements=2 * (hi - lo))

    for lp, ids in _run_ranks(world, rank_fn):
        real = min(k, vocab_size)
        assert torch.allclose(lp[:, :real], want_lp[0], atol=1e-5)
        assert torch.equal(ids[:, :real], want_ids[0])
        assert bool(torch.isinf(lp[:, real:]).all())  # padding: never a real token


def test_chunked_rows_equal_one_pass() -> None:
    gen = torch.Generator().manual_seed(11)
    states, weight = torch.randn(30, 8, generator=gen), torch.randn(100, 8, generator=gen)
    whole = vocab.topk_logprobs(states, weight, 5)
    parts = vocab.topk_logprobs(states, weight, 5, chunk_elements=300)
    assert len(vocab.row_chunks(30, 100, 300)) == 10
    assert torch.equal(whole[1], parts[1]) and torch.allclose(whole[0], parts[0])


def _worker_module(sglang_pkg: Path, monkeypatch: pytest.MonkeyPatch, group: Any) -> Any:
    stubs: dict[str, dict[str, Any]] = {
        "sglang.srt.distributed": {"get_tp_group": lambda: group},
        "sglang.srt.managers.schedule_batch": {"ScheduleBatch": object},
        "sglang.srt.model_executor.forward_batch_info": {"ForwardMode": object},
        "sglang.srt.server_args": {"ServerArgs": object},
        "sglang.srt.speculative.ddtree_info": {"DDTreeVerifyInput": object},
        "sglang.srt.speculative.dflash_utils": {"resolve_dflash_verify_mask_policy": None},
        "sglang.srt.speculative.dflash_worker": {"DFlashWorker": object},
    }
    for name, attrs in stubs.items():
        monkeypatch.setitem(sys.modules, name, _stub(name, **attrs))
    import sglang.srt.speculative.ddtree_worker as worker

    return worker


def test_worker_draft_topk_under_a_simulated_tp_group(
        sglang_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    vocab_size, world, k = 11, 4, 8  # shards of 3, 3, 3, 2 tokens: all smaller than top-k
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(2, 3, 16, generator=gen)
    weight = torch.randn(vocab_size, 16, generator=gen)
    want_lp, want_ids = core.draft_topk(hidden @ weight.T, k, backend="torch")
    proxy = types.SimpleNamespace(current=None)
    worker = _worker_module(sglang_path, monkeypatch, proxy)

    def rank_fn(rank: int, group: _Group) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = _shards(vocab_size, world)[rank]
        head = types.SimpleNamespace(
            weight=torch.cat([weight[lo:hi], torch.zeros(1, 16)]),  # + one padding row
            shard_indices=types.SimpleNamespace(num_added_elements=0, num_org_elements=hi - lo,
                                                org_vocab_start_index=lo))
        me = types.SimpleNamespace(ddtree_topk=k)
        return worker.DDTreeWorker._draft_topk(me, hidden, head)

    group = _Group(world)
    proxy.world_size = world
    proxy.all_gather_into_tensor = group.all_gather_into_tensor
    results: list[Any] = [None] * world

    def body(rank: int) -> None:
        group.local.rank = rank
        results[rank] = rank_fn(rank, group)

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for lp, ids in results:
        assert lp.shape == (2, 3, k)
        assert torch.allclose(lp, want_lp, atol=1e-5) and torch.equal(ids, want_ids)

    single = types.SimpleNamespace(world_size=1)
    monkeypatch.setitem(sys.modules["sglang.srt.distributed"].__dict__, "get_tp_group",
                        lambda: single)
    monkeypatch.setattr(worker, "get_tp_group", lambda: single)
    head = types.SimpleNamespace(
        weight=weight, shard_indices=types.SimpleNamespace(
            num_added_elements=0, num_org_elements=vocab_size, org_vocab_start_index=0))
    lp, ids = worker.DDTreeWorker._draft_topk(types.SimpleNamespace(ddtree_topk=k), hidden, head)
    assert torch.allclose(lp, want_lp, atol=1e-5) and torch.equal(ids, want_ids)


def test_full_tree_skips_the_chain_unless_asked() -> None:
    lp, tok = core.draft_topk(torch.randn(2, 4, 20, generator=torch.Generator().manual_seed(1)), 4)
    roots, start = torch.tensor([1, 2]), torch.tensor([5, 6])
    verify = _load_verify()
    plain = verify.plan_round(lp, tok, roots, start, budget=8, score_chain=False)
    asked = verify.plan_round(lp, tok, roots, start, budget=8, score_chain=True)
    shadow = verify.plan_round(lp, tok, roots, start, budget=8, shadow_linear=True,
                               score_chain=False)
    assert plain.chain_expected_accept is None and asked.chain_expected_accept is not None
    assert torch.equal(plain.tree.tokens, asked.tree.tokens)
    assert shadow.width == 5 and shadow.chain_expected_accept is not None


def _load_verify() -> Any:
    path = Path(__file__).resolve().parents[1] / \
        "payload/sglang-0.5.11/srt/speculative/ddtree_verify.py"
    text = path.read_text().replace("from sglang.srt.speculative.ddtree_core import",
                                    "from ddtree.core import")
    module = types.ModuleType("_ddtree_verify_alone")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    try:
        exec(compile(text, str(path), "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module


def test_the_verify_input_samples_through_sampling_info(verify_mods: Any) -> None:  # noqa: F811
    """DDTreeVerifyInput.verify with a non-greedy sampling_info: greedy rows (top-k 1) follow the
    argmax through the sampler path and commit what the greedy path commits."""
    import test_payload_integration as t

    info, verify = verify_mods
    kv: dict[int, tuple[int, int]] = {}
    alloc = t._Alloc()
    batch = t._batch([t.TRUE[:4], t.TRUE[:6]], kv, alloc)
    for req in batch.reqs:
        req.sampling_params = types.SimpleNamespace(top_k=1)
    batch.sampling_info = types.SimpleNamespace(
        is_all_greedy=False, temperatures=torch.ones(2, 1), top_ks=torch.ones(2, dtype=torch.long),
        top_ps=torch.ones(2), min_ps=torch.zeros(2), need_min_p_sampling=False,
        need_top_p_sampling=False, has_custom_logit_processor=False, logit_bias=None,
        penalizer_orchestrator=types.SimpleNamespace(is_required=False))
    top_lp, top_tok = verify.draft_topk(t._draft_logits(), 4)
    roots = torch.tensor([r.output_ids[-1] for r in batch.reqs])
    plan = verify.plan_round(top_lp, top_tok, roots, batch.seq_lens, budget=10)
    spec = info.DDTreeVerifyInput.from_round(plan)
    spec.prepare_for_verify(batch, 1, build_custom_mask=True)
    _, commit, _, accepted = spec.verify(batch=batch, logits_output=t._target_forward(
        batch, spec, kv), page_size=1)
    assert batch.reqs[0].output_ids == t.TRUE[4:10] and accepted == [4, 4]
    assert commit.tolist() == [5, 5]
