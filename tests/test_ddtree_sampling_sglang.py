"""DDTREE's sampler (payload/ddtree/sampling.py) against SGLang 0.5.11's own, on mixed batches.

SGLang's pytorch sampling path, ``top_k_top_p_min_p_sampling_from_probs_torch``, is taken from the
real wheel's ``sglang/srt/layers/sampler.py`` (its source compiled alone: importing sampler.py
needs SGLang's distributed stack) and run with ``torch.multinomial`` observed, so the law each row
is sampled from is read exactly. DDTREE's rows are built as ``ddtree_info._target_tokens`` builds
them (the host's top-k bounds from ``top_k_bounds``) and sampled many times: each row's
frequencies must fit SGLang's law for that row whatever its batch-mates ask (issue 25: a top-k 2
row beside rows with top-k unset sampled the whole vocabulary).
"""

from __future__ import annotations

import ast
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "payload"))
from ddtree import sampling
from wheelcache import wheel

TOP_K_ALL = 1 << 30  # SGLang's top-k for "unset" (sampling_params.py)
V = 12
COPIES = 3000  # samples per row: a 1 % share is 30 draws; chi-square below stays well powered
CHI2_CRIT = 45.0  # at most 11 degrees of freedom: p < 1e-5 above 45


def _sglang_filter() -> Any:
    """SGLang 0.5.11's function, compiled from the wheel, with ``torch.multinomial`` observed."""
    with zipfile.ZipFile(wheel("sglang", "0.5.11")) as zf:
        source = zf.read("sglang/srt/layers/sampler.py").decode()
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
              and n.name == "top_k_top_p_min_p_sampling_from_probs_torch")
    seen: list[torch.Tensor] = []

    def multinomial(probs: torch.Tensor, num_samples: int) -> torch.Tensor:
        seen.append(probs.clone())
        return torch.zeros((probs.shape[0], num_samples), dtype=torch.int64)

    proxy = types.SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch)
                                     if not k.startswith("__")})
    proxy.multinomial = multinomial
    scope: dict[str, Any] = {"torch": proxy, "Optional": Any}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "sglang/srt/layers/sampler.py",
                 "exec"), scope)
    function = scope[fn.name]

    def law(probs: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor,
            min_ps: torch.Tensor, need_min_p: bool) -> torch.Tensor:
        seen.clear()
        probs_sorted_idx = probs.sort(dim=-1, descending=True)[1]
        function(probs.clone(), top_ks, top_ps, min_ps, need_min_p, None, None)
        kept = seen[0]
        out = torch.zeros_like(probs)
        out.scatter_(1, probs_sorted_idx, kept)
        return out / out.sum(dim=-1, keepdim=True)

    return law


# (temperature, top_k, top_p, min_p) as SamplingParams leaves them (greedy: top-k 1)
ROWS = {
    "topk2-hot": (8.0, 2, 1.0, 0.0),  # the case
    "unset-hot": (8.0, TOP_K_ALL, 1.0, 0.0),
    "greedy": (1.0, 1, 1.0, 0.0),
    "topp": (0.7, TOP_K_ALL, 0.8, 0.0),
    "all-three": (1.3, 5, 0.9, 0.1),
    "minp": (1.0, TOP_K_ALL, 1.0, 0.3),
    "topk7": (2.0, 7, 1.0, 0.0),
}
BATCHES = [
    ("topk2-hot", "unset-hot"),
    ("topk2-hot", "unset-hot", "greedy"),
    ("unset-hot", "topk7"),
    ("unset-hot", "topp"),
    ("topk2-hot", "unset-hot", "greedy", "topp", "all-three", "minp", "topk7"),
    ("unset-hot", "minp", "greedy"),
]


def _logits() -> torch.Tensor:
    return torch.randn(len(ROWS), V, generator=torch.Generator().manual_seed(4)) * 2


def _batch(names: tuple[str, ...]) -> dict[str, Any]:
    logits = _logits()
    index = [list(ROWS).index(n) for n in names]
    cfg = torch.tensor([ROWS[n] for n in names], dtype=torch.float64)
    return {"logits": logits[index], "temperatures": cfg[:, 0].float(),
            "top_ks": cfg[:, 1].long(), "top_ps": cfg[:, 2].float(), "min_ps": cfg[:, 3].float()}


def _ddtree_counts(b: dict[str, Any], *, old_rule: bool = False) -> torch.Tensor:
    """Sample every row COPIES times, the rows interleaved as a verify block's are."""
    rows = b["logits"].shape[0]
    rep = lambda t: t.repeat(COPIES)  # noqa: E731 -- row r of copy c at c * rows + r
    need_min_p = bool((b["min_ps"] > 0).any())
    max_k, min_k = sampling.top_k_bounds(b["top_ks"].tolist())
    got = sampling.sample_tokens(
        b["logits"].repeat(COPIES, 1), rep(b["temperatures"]), rep(b["top_ks"]), rep(b["top_ps"]),
        rep(b["min_ps"]) if need_min_p else None, max_top_k=max_k,
        min_top_k=max_k if old_rule else min_k,  # payload 0.2.2 keyed the shortcut on the largest
        need_top_p=bool((b["top_ps"] < 1).any()), generator=torch.Generator().manual_seed(11))
    counts = torch.zeros(rows, V)
    counts.index_put_((torch.arange(rows).repeat(COPIES), got), torch.ones(rows * COPIES),
                      accumulate=True)
    return counts


def _sglang_laws(b: dict[str, Any]) -> torch.Tensor:
    law = _sglang_filter()
    probs = torch.softmax(b["logits"] / b["temperatures"].view(-1, 1), dim=-1)
    return law(probs, b["top_ks"], b["top_ps"], b["min_ps"], bool((b["min_ps"] > 0).any()))


def _misfit(counts: torch.Tensor, law: torch.Tensor) -> tuple[float, float]:
    """(chi-square over the law's support, draws outside it)."""
    expected = law * counts.sum()
    inside = law > 0
    chi2 = float((((counts - expected) ** 2)[inside] / expected[inside]).sum())
    return chi2, float(counts[~inside].sum())


@pytest.mark.parametrize("names", BATCHES, ids=lambda n: "+".join(n))
def test_each_row_samples_sglangs_law_for_it_whatever_its_batch_mates(
        names: tuple[str, ...]) -> None:
    b = _batch(names)
    laws, counts = _sglang_laws(b), _ddtree_counts(b)
    for i, name in enumerate(names):
        chi2, outside = _misfit(counts[i], laws[i])
        assert outside == 0, f"{name}: {outside:.0f} draws SGLang's sampler never makes"
        assert chi2 < CHI2_CRIT, f"{name}: chi-square {chi2:.1f}"
        # the filtered law itself equals SGLang's (the kept set and the weights)
        probs, ids = sampling.filtered_probs(b["logits"][i:i + 1], b["temperatures"][i:i + 1],
                                             b["top_ks"][i:i + 1], b["top_ps"][i:i + 1],
                                             b["min_ps"][i:i + 1])
        mine = torch.zeros(V).index_add_(0, ids[0], probs[0].float())
        if ROWS[name][1] == 1:  # greedy: SGLang keeps the top-1, DDTREE takes the argmax
            assert int(counts[i].argmax()) == int(laws[i].argmax())
        else:
            assert torch.allclose(mine, laws[i].float(), atol=1e-5), name


def test_the_old_shortcut_fails_the_same_check() -> None:
    """The check can fail: payload 0.2.2's rule sampled the top-k 2 row over the vocabulary."""
    b = _batch(("topk2-hot", "unset-hot"))
    _, outside = _misfit(_ddtree_counts(b, old_rule=True)[0], _sglang_laws(b)[0])
    assert outside > COPIES * 0.5  # at temperature 8 nearly all the mass is outside the top 2


def test_the_host_bounds_ignore_greedy_rows() -> None:
    assert sampling.top_k_bounds([1, TOP_K_ALL, 2, 1]) == (TOP_K_ALL, 2)
    assert sampling.top_k_bounds([1, 1]) == (1, 1)
    assert sampling.top_k_bounds([]) == (1, 1)
