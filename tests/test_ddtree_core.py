"""The DDTree core (payload/ddtree/core.py) against brute-force enumeration, walk references,
one-by-one batching, and a lossless speculative-decoding run with two tiny random causal LMs."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "payload"))
from ddtree import build_tree, compile_tree, draft_topk, walk_tree
from ddtree.core import DDTree
from triton_interpret import kernel_device  # noqa: F401  (fixture)

F32 = torch.float32
INF = float("-inf")


def f32_add(a: float, b: float) -> float:
    return float(torch.tensor(a, dtype=F32) + torch.tensor(b, dtype=F32))


# ------------------------------------------------------------------ brute-force reference


def brute_force(lp: torch.Tensor, tok: torch.Tensor, budget: int) -> dict[str, list]:
    """Enumerate the whole top-k tree of one request; order it by the documented rule.

    Within a depth: (score desc, parent's within-depth position, rank); globally: (score desc,
    depth, within-depth position). The first ``budget`` finite nodes are the tree.
    """
    depths, k = lp.shape
    levels: list[list[tuple[float, int, int]]] = []  # (score, parent position, rank)
    prev_scores = [0.0]
    for d in range(depths):
        nodes = [
            (f32_add(ps, float(lp[d, r])), pi, r)
            for pi, ps in enumerate(prev_scores)
            for r in range(k)
        ]
        nodes.sort(key=lambda n: (-n[0], n[1], n[2]))
        levels.append(nodes)
        prev_scores = [n[0] for n in nodes]
    everything = [(n[0], d, pos) for d, nodes in enumerate(levels) for pos, n in enumerate(nodes)]
    everything.sort(key=lambda e: (-e[0], e[1], e[2]))
    chosen = [e for e in everything[:budget] if e[0] > INF]
    slot_of = {(d, pos): i + 1 for i, (_, d, pos) in enumerate(chosen)}
    out: dict[str, list] = {"tokens": [], "parents": [], "depths": [], "scores": [], "ranks": []}
    for score, d, pos in chosen:
        _, parent_pos, rank = levels[d][pos]
        out["tokens"].append(int(tok[d, rank]))
        out["parents"].append(0 if d == 0 else slot_of[(d - 1, parent_pos)])
        out["depths"].append(d + 1)
        out["scores"].append(score)
        out["ranks"].append(rank)
    out["unchosen_best"] = [e[0] for e in everything[len(chosen) :]][:1]
    return out


def tie_heavy_logprobs(gen: torch.Generator, bs: int, depths: int, k: int) -> torch.Tensor:
    """Log-probabilities from a handful of values (0 included), so scores tie a lot."""
    choices = torch.tensor([0.0, math.log(0.5), math.log(0.25), math.log(0.125)], dtype=F32)
    lp = choices[torch.randint(0, 4, (bs, depths, k), generator=gen)]
    return lp.sort(dim=-1, descending=True).values


def random_case(seed: int, ties: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    gen = torch.Generator().manual_seed(seed)
    bs = 1 + seed % 3
    depths = 1 + seed % 4
    vocab = 2 + seed % 5
    k = min(vocab, 1 + seed % 4)
    budget = 1 + (seed * 7) % 40
    if ties:
        lp = tie_heavy_logprobs(gen, bs, depths, k)
        tok = torch.stack([torch.randperm(vocab, generator=gen)[:k] for _ in range(bs * depths)])
        tok = tok.reshape(bs, depths, k)
    else:
        logits = torch.randn(bs, depths, vocab, generator=gen) * 2
        lp, tok = draft_topk(logits, k)
    roots = torch.randint(0, vocab, (bs,), generator=gen)
    return lp, tok, roots, budget


def ancestors(parents: list[int], i: int) -> set[int]:
    seen = set()
    while i >= 0:
        seen.add(i)
        i = parents[i]
    return seen


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_build_matches_brute_force(seed: int, ties: bool) -> None:
    lp, tok, roots, budget = random_case(seed, ties)
    tree = build_tree(lp, tok, roots, budget)
    start = torch.arange(lp.shape[0]) * 10 + 3
    verify = compile_tree(tree, start)
    for b in range(lp.shape[0]):
        want = brute_force(lp[b], tok[b], budget)
        n = len(want["tokens"])
        assert tree.tokens[b, 0] == roots[b]
        assert tree.tokens[b, 1 : n + 1].tolist() == want["tokens"]
        assert tree.parents[b, 1 : n + 1].tolist() == want["parents"]
        assert tree.depths[b, 1 : n + 1].tolist() == want["depths"]
        assert tree.ranks[b, 1 : n + 1].tolist() == want["ranks"]
        assert tree.scores[b, 1 : n + 1].tolist() == want["scores"]
        # The budget best by score, whatever the tie rule.
        if want["unchosen_best"] and n:
            assert min(want["scores"]) >= want["unchosen_best"][0]
        # Padding only when the whole tree has fewer finite nodes than the budget.
        assert tree.valid[b].tolist() == [True] * (n + 1) + [False] * (budget - n)
        assert (tree.tokens[b, n + 1 :] == -1).all()
        parents = tree.parents[b].tolist()
        depths = tree.depths[b].tolist()
        for i in range(1, n + 1):
            assert 0 <= parents[i] < i and tree.valid[b, parents[i]]
            assert depths[i] == depths[parents[i]] + 1
            d, r = depths[i], int(tree.ranks[b, i])
            assert tree.tokens[b, i] == tok[b, d - 1, r]
            assert tree.scores[b, i] == f32_add(
                float(tree.scores[b, parents[i]]), float(lp[b, d - 1, r])
            )
        # Ancestor-only mask, both forms, and positions.
        for i in range(budget + 1):
            row = verify.mask[b, i].tolist()
            assert {j for j, on in enumerate(row) if on} == ancestors(parents, i)
        assert torch.equal(verify.additive_mask[b] == 0, verify.mask[b])
        assert (verify.additive_mask[b][~verify.mask[b]] == INF).all()
        assert verify.positions[b].tolist() == [int(start[b]) + d for d in depths]
        assert (verify.input_ids[b] >= 0).all()


def test_siblings_are_distinct_and_heap_order_is_kept() -> None:
    lp, tok, roots, budget = random_case(11, ties=False)
    tree = build_tree(lp, tok, roots, 30)
    for b in range(tree.tokens.shape[0]):
        kids: dict[int, set[int]] = {}
        for i in range(1, 31):
            if tree.valid[b, i]:
                token = int(tree.tokens[b, i])
                assert token not in kids.setdefault(int(tree.parents[b, i]), set())
                kids[int(tree.parents[b, i])].add(token)
        scores = tree.scores[b][tree.valid[b]]
        assert (scores[1:-1] >= scores[2:]).all()  # slots are in pop order: scores never rise


# ------------------------------------------------------------------------------- the walk


def reference_walk(tree: DDTree, b: int, target: list[int]) -> tuple[list[int], int]:
    node, path = 0, [0]
    while True:
        nxt = [
            i
            for i in range(1, tree.tokens.shape[1])
            if tree.valid[b, i] and tree.parents[b, i] == node and tree.tokens[b, i] == target[node]
        ]
        if not nxt:
            return path, target[node]
        node = nxt[0]
        path.append(node)


@pytest.mark.parametrize("seed", range(25))
def test_walk_matches_reference(seed: int) -> None:
    lp, tok, roots, budget = random_case(seed + 100, ties=seed % 2 == 0)
    tree = build_tree(lp, tok, roots, budget)
    verify = compile_tree(tree, torch.zeros(lp.shape[0], dtype=torch.long))
    gen = torch.Generator().manual_seed(seed)
    vocab = int(tok.max()) + 2
    # Mostly follow a random child, sometimes pick a token no child has.
    target = torch.randint(0, vocab, tree.tokens.shape, generator=gen)
    for b in range(lp.shape[0]):
        for i in range(1, tree.tokens.shape[1]):
            p = int(tree.parents[b, i])
            if tree.valid[b, i] and torch.rand(1, generator=gen) < 0.7:
                target[b, p] = tree.tokens[b, i]
    walk = walk_tree(tree, target, verify.mask)
    depths = lp.shape[1]
    for b in range(lp.shape[0]):
        path, bonus = reference_walk(tree, b, target[b].tolist())
        assert walk.path[b].tolist() == path + [-1] * (depths + 1 - len(path))
        assert int(walk.num_accepted[b]) == len(path) - 1
        assert int(walk.bonus[b]) == bonus
        new = [int(tree.tokens[b, i]) for i in path[1:]] + [bonus]
        assert walk.new_tokens[b].tolist() == new + [-1] * (depths + 1 - len(new))


def test_walk_hand_case() -> None:
    # depth 1: tokens 5 (rank 0), 7 (rank 1); depth 2: tokens 9, 4
    lp = torch.tensor([[[-0.1, -0.2], [-0.3, -5.0]]])
    tok = torch.tensor([[[5, 7], [9, 4]]])
    tree = build_tree(lp, tok, torch.tensor([1]), 4)
    # pops: 5 (-0.1), 7 (-0.2), 5>9 (-0.4), 7>9 (-0.5)
    assert tree.tokens.tolist() == [[1, 5, 7, 9, 9]]
    assert tree.parents.tolist() == [[-1, 0, 0, 1, 2]]
    verify = compile_tree(tree, torch.tensor([41]))
    assert verify.positions.tolist() == [[41, 42, 42, 43, 43]]
    # target after root: 7, after slot 2 (7): 9, after slot 4 (7>9): 3 -> accept 7, 9, bonus 3
    walk = walk_tree(tree, torch.tensor([[7, 0, 9, 0, 3]]), verify.mask)
    assert walk.path.tolist() == [[0, 2, 4]]
    assert walk.new_tokens.tolist() == [[7, 9, 3]]
    assert walk.num_accepted.tolist() == [2]
    # the first miss at the root: nothing accepted, the target's token is the bonus
    walk = walk_tree(tree, torch.tensor([[8, 9, 9, 0, 0]]), verify.mask)
    assert walk.path.tolist() == [[0, -1, -1]]
    assert walk.new_tokens.tolist() == [[8, -1, -1]]


def test_batch_equals_one_by_one() -> None:
    gen = torch.Generator().manual_seed(7)
    bs, depths, vocab, budget = 6, 5, 40, 23
    logits = torch.randn(bs, depths, vocab, generator=gen) * 3
    roots = torch.randint(0, vocab, (bs,), generator=gen)
    start = torch.randint(0, 100, (bs,), generator=gen)
    lp, tok = draft_topk(logits, 4)
    tree = build_tree(lp, tok, roots, budget)
    verify = compile_tree(tree, start)
    target = torch.randint(0, vocab, tree.tokens.shape, generator=gen)
    target[:, 0] = tree.tokens[:, 1]  # accept at least one node in every request
    walk = walk_tree(tree, target, verify.mask)
    for b in range(bs):
        one = build_tree(lp[b : b + 1], tok[b : b + 1], roots[b : b + 1], budget)
        v1 = compile_tree(one, start[b : b + 1])
        w1 = walk_tree(one, target[b : b + 1], v1.mask)
        for name in ("tokens", "parents", "depths", "ranks", "scores", "valid"):
            assert torch.equal(getattr(one, name)[0], getattr(tree, name)[b]), name
        assert torch.equal(v1.mask[0], verify.mask[b])
        assert torch.equal(v1.positions[0], verify.positions[b])
        for name in ("path", "num_accepted", "bonus", "new_tokens"):
            assert torch.equal(getattr(w1, name)[0], getattr(walk, name)[b]), name


def test_bad_input_is_a_clear_error() -> None:
    lp, tok = draft_topk(torch.randn(1, 3, 10), 4)
    with pytest.raises(ValueError, match="budget must be at least 1"):
        build_tree(lp, tok, torch.tensor([0]), 0)
    with pytest.raises(ValueError, match=r"root_tokens must be \[1\]"):
        build_tree(lp, tok, torch.tensor([0, 1]), 5)
    with pytest.raises(ValueError, match="must be \\[batch, depths, vocab\\]"):
        draft_topk(torch.randn(3, 10), 4)
    tree = build_tree(lp, tok, torch.tensor([0]), 5)
    with pytest.raises(ValueError, match="target_tokens must be"):
        walk_tree(
            tree, torch.zeros(1, 3, dtype=torch.long), compile_tree(tree, tree.depths[:, 0]).mask
        )


# ------------------------------------------------------------- lossless speculative decoding

F64 = torch.float64


class TinyLM:
    """A randomly initialised causal transformer (float64, learned positions, a KV cache).

    ``forward`` takes new tokens with their positions and an additive mask over
    ``[cache, new]``, so the same code runs plain causal steps and a whole DDTree block.
    """

    def __init__(self, seed: int, vocab: int = 24, dim: int = 32, layers: int = 2) -> None:
        g = torch.Generator().manual_seed(seed)

        def w(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return torch.randn(*shape, generator=g, dtype=F64) * scale / math.sqrt(shape[0])

        self.heads, self.dim = 2, dim
        self.embed = torch.randn(vocab, dim, generator=g, dtype=F64)
        self.pos = torch.randn(256, dim, generator=g, dtype=F64) * 0.5
        self.layers = [
            {n: w(dim, dim) for n in ("q", "k", "v", "o")}
            | {"up": w(dim, 4 * dim), "down": w(4 * dim, dim)}
            for _ in range(layers)
        ]
        self.head = w(dim, vocab, scale=4.0)

    def forward(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        mask: torch.Tensor,
        cache: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        x = self.embed[ids] + self.pos[pos]
        n, h, hd = ids.shape[0], self.heads, self.dim // self.heads
        new_kv = []
        for layer, (ck, cv) in zip(self.layers, cache, strict=True):
            y = torch.nn.functional.layer_norm(x, (self.dim,))
            q, k, v = ((y @ layer[n_]).view(n, h, hd).transpose(0, 1) for n_ in ("q", "k", "v"))
            new_kv.append((k, v))
            keys, vals = torch.cat([ck, k], 1), torch.cat([cv, v], 1)
            att = torch.softmax(q @ keys.transpose(1, 2) / math.sqrt(hd) + mask, dim=-1)
            x = x + (att @ vals).transpose(0, 1).reshape(n, self.dim) @ layer["o"]
            y = torch.nn.functional.layer_norm(x, (self.dim,))
            x = x + torch.nn.functional.gelu(y @ layer["up"]) @ layer["down"]
        return torch.nn.functional.layer_norm(x, (self.dim,)) @ self.head, new_kv

    def empty_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        hd = self.dim // self.heads
        return [(torch.zeros(self.heads, 0, hd, dtype=F64),) * 2 for _ in self.layers]

    def logits_all(self, seq: list[int]) -> torch.Tensor:
        n = len(seq)
        causal = torch.full((n, n), INF, dtype=F64).triu(1)
        return self.forward(torch.tensor(seq), torch.arange(n), causal, self.empty_cache())[0]


def greedy(model: TinyLM, prompt: list[int], steps: int) -> list[int]:
    seq = list(prompt)
    for _ in range(steps):
        seq.append(int(model.logits_all(seq)[-1].argmax()))
    return seq[len(prompt) :]


def draft_rollout(drafter: TinyLM, seq: list[int], depths: int) -> torch.Tensor:
    """Per-depth log-probabilities ``[depths, vocab]`` standing in for one block-diffusion pass.

    A block-diffusion drafter gives each future position its own distribution in one pass; we
    approximate that with the drafter's own greedy rollout: the distribution at depth d is the
    drafter's next-token distribution after its greedy tokens for depths 1..d-1.
    """
    rows, cur = [], list(seq)
    for _ in range(depths):
        row = torch.log_softmax(drafter.logits_all(cur)[-1], dim=-1)
        rows.append(row)
        cur.append(int(row.argmax()))
    return torch.stack(rows)


def speculative(
    target: TinyLM,
    drafter: TinyLM,
    prompts: list[list[int]],
    steps: int,
    depths: int,
    budget: int,
    top_k: int,
) -> tuple[list[list[int]], float]:
    """DDTree decoding of a batch of prompts; returns the outputs and mean tokens per round."""
    seqs = [list(p) for p in prompts]
    caches = []
    for p in prompts:  # the KV cache holds everything but the last token (the next root)
        n = len(p) - 1
        causal = torch.full((n, n), INF, dtype=F64).triu(1)
        _, kv = target.forward(torch.tensor(p[:-1]), torch.arange(n), causal, target.empty_cache())
        caches.append(kv)
    per_round: list[int] = []
    while min(len(s) - len(p) for s, p in zip(seqs, prompts, strict=True)) < steps:
        draft = torch.stack([draft_rollout(drafter, s, depths) for s in seqs]).float()
        lp, tok = draft_topk(draft, top_k)
        tree = build_tree(lp, tok, torch.tensor([s[-1] for s in seqs]), budget)
        verify = compile_tree(tree, torch.tensor([len(s) - 1 for s in seqs]))
        target_tokens, new_kvs = [], []
        for b, s in enumerate(seqs):
            prefix = torch.zeros(budget + 1, len(s) - 1, dtype=F64)
            mask = torch.cat([prefix, verify.additive_mask[b].to(F64)], 1)
            logits, kv = target.forward(verify.input_ids[b], verify.positions[b], mask, caches[b])
            target_tokens.append(logits.argmax(-1))
            new_kvs.append(kv)
        walk = walk_tree(tree, torch.stack(target_tokens), verify.mask)
        for b, s in enumerate(seqs):
            keep = walk.path[b][walk.path[b] >= 0]
            caches[b] = [
                (torch.cat([ck, k[:, keep]], 1), torch.cat([cv, v[:, keep]], 1))
                for (ck, cv), (k, v) in zip(caches[b], new_kvs[b], strict=True)
            ]
            count = int(walk.num_accepted[b]) + 1
            s.extend(walk.new_tokens[b, :count].tolist())
            per_round.append(count)
            assert caches[b][0][0].shape[1] == len(s) - 1
    outs = [s[len(p) : len(p) + steps] for s, p in zip(seqs, prompts, strict=True)]
    return outs, sum(per_round) / len(per_round)


PROMPTS = [[1, 2, 3], [7, 7, 0, 5, 11], [20, 4]]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_lossless_with_a_different_drafter(seed: int) -> None:
    target, drafter = TinyLM(seed), TinyLM(1000 + seed)
    want = [greedy(target, p, 24) for p in PROMPTS]
    got, _ = speculative(target, drafter, PROMPTS, 24, depths=5, budget=15, top_k=4)
    assert got == want


@pytest.mark.parametrize("seed", [0, 5])
def test_lossless_and_accepting_with_the_target_as_drafter(seed: int) -> None:
    target = TinyLM(seed)
    want = [greedy(target, p, 30) for p in PROMPTS]
    got, mean_tokens = speculative(target, target, PROMPTS, 30, depths=7, budget=31, top_k=4)
    assert got == want
    assert mean_tokens >= 3.0, mean_tokens  # tokens committed per round, bonus included


# ------------------------------------------------------------ the Triton fast path (kernels)


@pytest.fixture
def kernels(kernel_device: str) -> tuple[ModuleType, str]:  # noqa: F811
    """The kernels module and the device to run it on: CUDA where there is one, else the CPU
    under Triton's interpreter (tests/triton_interpret.py)."""
    from ddtree import triton_kernels

    return triton_kernels, kernel_device


def kernel_case(seed: int, device: str) -> tuple[torch.Tensor, ...]:
    lp, tok, roots, budget = random_case(seed, ties=seed % 2 == 1)
    return lp.to(device), tok.to(device), roots.to(device), torch.tensor(budget)


def check_kernels_against_torch(mod: object, lp: torch.Tensor, tok: torch.Tensor,
                                roots: torch.Tensor, budget: int) -> None:  # fmt: skip
    kern = mod  # the module's wrappers return the core's fields as plain tensors
    dev = lp.device
    ref = build_tree(lp, tok, roots, budget, backend="torch")
    got = kern.build(lp, tok, roots, budget)  # type: ignore[attr-defined]
    for name, value in zip(("tokens", "parents", "depths", "ranks", "scores", "valid"), got,
                           strict=True):  # fmt: skip
        assert torch.equal(value, getattr(ref, name)), name
        assert value.dtype == getattr(ref, name).dtype, name
    start = torch.arange(lp.shape[0], device=dev) * 7 + 5
    vref = compile_tree(ref, start, pad_token_id=3, backend="torch")
    vgot = kern.compile_verify(  # type: ignore[attr-defined]
        ref.parents, ref.tokens, ref.depths, start, ref.max_depth, 3, torch.float32
    )
    for name, value in zip(("input_ids", "positions", "mask", "additive_mask"), vgot,
                           strict=True):  # fmt: skip
        assert torch.equal(value, getattr(vref, name)), name
    gen = torch.Generator().manual_seed(int(budget))
    target = torch.randint(0, int(tok.max()) + 2, ref.tokens.shape, generator=gen).to(dev)
    for b in range(lp.shape[0]):  # mostly follow the tree so that walks go deep
        for i in range(1, ref.tokens.shape[1]):
            if ref.valid[b, i] and torch.rand(1, generator=gen) < 0.7:
                target[b, ref.parents[b, i]] = ref.tokens[b, i]
    wref = walk_tree(ref, target, vref.mask, backend="torch")
    wgot = kern.walk(  # type: ignore[attr-defined]
        ref.tokens, ref.parents, ref.depths, ref.valid, target, vref.mask, ref.max_depth
    )
    for name, value in zip(("path", "num_accepted", "bonus", "new_tokens"), wgot, strict=True):
        assert torch.equal(value, getattr(wref, name)), name


def test_kernels_match_torch_on_random_trees(kernels: tuple[object, str]) -> None:
    mod, dev = kernels
    seeds = range(40) if dev == "cuda" else (1, 2, 5, 10, 13, 22)  # the interpreter is slow
    for seed in seeds:
        lp, tok, roots, budget = kernel_case(seed, dev)
        check_kernels_against_torch(mod, lp, tok, roots, int(budget))


def test_kernels_match_torch_at_the_issue_sizes(kernels: tuple[object, str]) -> None:
    mod, dev = kernels
    sizes = [(1, 15, 8, 63), (3, 15, 8, 127), (2, 15, 8, 15)] if dev == "cuda" else [(1, 15, 8, 63)]
    for bs, depths, k, budget in sizes:
        gen = torch.Generator().manual_seed(bs * 1000 + budget)
        logits = torch.randn(bs, depths, 1000, generator=gen) * 3
        lp, tok = draft_topk(logits, k, backend="torch")
        roots = torch.randint(0, 1000, (bs,), generator=gen)
        check_kernels_against_torch(mod, lp.to(dev), tok.to(dev), roots.to(dev), budget)
        # Heavy ties (scores built from four values) at the same sizes.
        tied = tie_heavy_logprobs(gen, bs, depths, k)
        check_kernels_against_torch(mod, tied.to(dev), tok.to(dev), roots.to(dev), budget)


def test_kernel_topk_matches_torch(kernels: tuple[object, str]) -> None:
    mod, dev = kernels
    for rows, vocab, k in [(3, 50, 4), (2, 5000, 8), (1, 7, 7)] + (
        [(15, 151_936, 8), (240, 151_936, 8)] if dev == "cuda" else []
    ):
        gen = torch.Generator().manual_seed(rows + vocab)
        logits = (torch.randn(rows, vocab, generator=gen) * 3).to(dev)
        lp, tok = mod.topk_logprobs(logits, k)  # type: ignore[attr-defined]
        want_lp, want_tok = torch.log_softmax(logits.float(), -1).topk(k, -1)
        assert torch.equal(tok, want_tok)  # random logits: no ties
        assert torch.allclose(lp, want_lp, rtol=0, atol=2e-5)
        assert (lp[:, 1:] <= lp[:, :-1]).all()


def test_backend_choice_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from ddtree import core

    lp, tok = draft_topk(torch.randn(1, 3, 10), 4, backend="torch")
    with pytest.raises(ValueError, match="backend must be one of"):
        build_tree(lp, tok, torch.tensor([0]), 5, backend="cuda")
    # "auto" on CPU tensors is the torch path, whatever is installed.
    auto = build_tree(lp, tok, torch.tensor([0]), 5)
    assert torch.equal(
        auto.tokens, build_tree(lp, tok, torch.tensor([0]), 5, backend="torch").tokens
    )
    monkeypatch.setattr(core, "_KERNELS", None)  # where triton did not import
    assert not core.triton_available()
    with pytest.raises(ValueError, match="needs the triton package"):
        build_tree(lp, tok, torch.tensor([0]), 5, backend="triton")


def test_a_round_through_the_core_on_the_kernels_agrees_with_torch(
        kernels: tuple[ModuleType, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The core's round (draft_topk, build_tree, compile_tree, walk_tree) on the kernels gives
    what its torch path gives. On CUDA "auto" picks the kernels (what the server runs), at the
    issue's sizes; on the CPU "auto" is the torch path, so the round asks for them by name
    (backend="triton"), the interpreter's copy in the core's place, at smaller sizes."""
    from ddtree import core

    mod, dev = kernels
    if dev == "cuda":
        assert core.triton_available()
        bs, depths, vocab, backend = 4, 15, 151_936, "auto"
    else:
        monkeypatch.setattr(core, "_KERNELS", mod)
        bs, depths, vocab, backend = 2, 6, 3000, "triton"
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(bs, depths, vocab, generator=gen) * 3).to(dev)
    lp, tok = draft_topk(logits, 8, backend=backend)
    want_lp, want_tok = draft_topk(logits, 8, backend="torch")
    assert torch.equal(tok, want_tok)  # random logits: no ties
    assert torch.allclose(lp, want_lp, rtol=0, atol=2e-5)
    roots = torch.randint(0, vocab, (bs,), generator=gen).to(dev)
    fast = build_tree(lp, tok, roots, 63, backend=backend)
    slow = build_tree(lp, tok, roots, 63, backend="torch")
    for name in ("tokens", "parents", "depths", "ranks", "scores", "valid"):
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name
    start = torch.arange(bs, device=dev) * 11 + 2
    vfast = compile_tree(fast, start, pad_token_id=3, backend=backend)
    vslow = compile_tree(slow, start, pad_token_id=3, backend="torch")
    for name in ("input_ids", "positions", "mask", "additive_mask"):
        assert torch.equal(getattr(vfast, name), getattr(vslow, name)), name
    target = torch.randint(0, vocab, tuple(slow.tokens.shape), generator=gen).to(dev)
    for b in range(bs):  # the target follows the tree's best path: deep walks
        for i in range(1, slow.tokens.shape[1]):
            if slow.ranks[b, i] == 0:
                target[b, slow.parents[b, i]] = slow.tokens[b, i]
    wfast = walk_tree(fast, target, vfast.mask, backend=backend)
    wslow = walk_tree(slow, target, vslow.mask, backend="torch")
    for name in ("path", "num_accepted", "bonus", "new_tokens"):
        assert torch.equal(getattr(wfast, name), getattr(wslow, name)), name
    assert int(wslow.num_accepted.min()) >= 2
