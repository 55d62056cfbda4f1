"""What the rehearsal checks on the running servers: losslessness, accept length, sampling law.

Every check returns a JSON-able dict with ``ok`` and the evidence; none raises for a failed
expectation (the result records it), so one bad server never hides the others' results.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rehearsal import client
from rehearsal.designs import Design, expected, predicted_meta


def prompt_set(
    design: Design, count: int, seed: int, *, min_len: int = 1, max_len: int = 300,
    min_out: int = 16, max_out: int = 200,
) -> list[tuple[list[int], int]]:
    """Mixed prompt and output lengths over ids that are plain for the design (no poison,
    nothing of the mask group), with a few ladder starts so long attractor runs occur."""
    rng = random.Random(seed)
    safe = [t for t in range(10, design.hidden_size - 2) if t != design.poison]
    out = []
    for i in range(count):
        n = rng.randint(min_len, max_len)
        prompt = [rng.choice(safe) for _ in range(n)]
        if i % 3 == 0:
            prompt[-1] = 100  # the ladder's first rung
        out.append((prompt, rng.randint(min_out, max_out)))
    return out


def lossless(port: int, design: Design, prompts: Sequence[tuple[list[int], int]], *,
             concurrency: int, stream_every: int = 0, algorithm: str | None = None,
             budget: int = 15, topk: int = 8, reference: Sequence[list[int]] | None = None
             ) -> dict[str, Any]:
    """Send every prompt at once (``concurrency`` in flight); compare with the closed form
    (and ``reference``, another server's outputs, where given); check meta_info against the
    design's prediction for speculative servers."""
    plain = [p for i, p in enumerate(prompts) if not stream_every or i % stream_every]
    streamed = [p for i, p in enumerate(prompts) if stream_every and not i % stream_every]
    answers = client.batch(port, [p for p, _ in plain], [n for _, n in plain],
                           concurrency=concurrency)
    s_answers = client.batch(port, [p for p, _ in streamed], [n for _, n in streamed],
                             concurrency=concurrency, stream=True) if streamed else []
    order = plain + streamed
    got = answers + s_answers
    wrong, failed, meta_ok, meta_bad = [], 0, 0, []
    accept = []
    for i, ((prompt, n), ans) in enumerate(zip(order, got, strict=True)):
        if ans.error:
            failed += 1
            continue
        want = expected(design, prompt, n)
        if ans.output_ids != want:
            first = next((j for j, (a, b) in enumerate(zip(ans.output_ids, want, strict=False))
                          if a != b),
                         min(len(ans.output_ids), len(want)))
            wrong.append({"request": i, "prompt_len": len(prompt), "max_new": n,
                          "first_diff": first, "got": ans.output_ids[first:first + 8],
                          "want": want[first:first + 8]})
        if "spec_accept_length" in ans.meta:
            accept.append(float(ans.meta["spec_accept_length"]))
        if algorithm in ("DFLASH", "DDTREE"):
            pred = predicted_meta(design, prompt, n, algorithm, budget, topk)
            seen = int(ans.meta.get("spec_verify_ct", -1))
            if seen == pred["spec_verify_ct"]:
                meta_ok += 1
            elif len(meta_bad) < 8:
                meta_bad.append({"request": i, "verify_ct": seen,
                                 "predicted": pred["spec_verify_ct"]})
    same_as_ref = None
    if reference is not None:
        same_as_ref = sum(1 for a, r in zip(answers + s_answers, reference, strict=False)
                          if not a.error and a.output_ids == r)
    return {
        "ok": not wrong and not failed,
        "requests": len(order), "streamed": len(streamed), "failed": failed,
        "wrong": len(wrong), "wrong_first": wrong[:5],
        "same_as_reference": same_as_ref,
        "verify_ct_as_predicted": meta_ok if algorithm in ("DFLASH", "DDTREE") else None,
        "verify_ct_mismatch": meta_bad,
        "accept_length_mean": sum(accept) / len(accept) if accept else None,
        "outputs": [a.output_ids for a in got],
        "stream_chunks": [a.chunks for a in s_answers],
    }


_RUNNING = re.compile(r"Decode batch.*#running-req: (\d+)")


def max_running(log: Path) -> int:
    """The largest decode batch the server's log reports (``#running-req``)."""
    best = 0
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return -1
    for m in _RUNNING.finditer(text):
        best = max(best, int(m.group(1)))
    return best


def long_accept(port: int, design: Design, algorithm: str, budget: int, topk: int,
                n: int = 400) -> dict[str, Any]:
    """One long greedy request from the ladder's first rung: reported vs predicted meta."""
    prompt = [11, 12, 100]
    ans = client.generate(port, prompt, n)
    pred = predicted_meta(design, prompt, n, algorithm, budget, topk)
    return {"ok": ans.error is None and ans.output_ids == expected(design, prompt, n)
            and int(ans.meta.get("spec_verify_ct", -1)) == pred["spec_verify_ct"],
            "reported": {k: ans.meta.get(k) for k in ("spec_accept_length", "spec_verify_ct",
                                                       "spec_accept_rate", "completion_tokens")},
            "predicted": pred, "error": ans.error}


# --- the sampling law -------------------------------------------------------------------------


def transition_logits(model_dir: Path) -> Any:
    """``[V, V]`` float32: the target's logits after each token, from its weights (the layers
    are the identity, so the last hidden state is the token's own RMS-normed embedding)."""
    import torch
    from safetensors.torch import load_file

    weights: dict[str, Any] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    embed = weights["model.embed_tokens.weight"].float()
    norm = weights["model.norm.weight"].float()
    head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"]).float()
    eps = 1e-6
    h = embed * torch.rsqrt(embed.pow(2).mean(-1, keepdim=True) + eps) * norm
    return h @ head.T


def half_temperature(logits: Any, token: int = 100) -> float:
    """The temperature at which the target's top-1 after ``token`` has probability 1/2."""
    import torch

    lo, hi = 1e-3, 1e3
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        p = float(torch.softmax(logits[token] / mid, -1).max())
        lo, hi = (mid, hi) if p > 0.5 else (lo, mid)
    return round((lo * hi) ** 0.5, 4)


def filtered_probs(probs: Any, *, top_k: int = -1, top_p: float = 1.0,
                   min_p: float = 0.0) -> Any:
    """``probs [R, V]`` after SGLang 0.5.11's own sampler filters, in its order
    (``layers/sampler.py``, the pytorch backend): sort, keep ranks below top-k, keep a token
    while the mass before it is at most top-p (summed over the whole distribution, not the
    top-k survivors), drop tokens below min-p x the top token; renormalised."""
    import torch

    sort, idx = probs.sort(dim=-1, descending=True)
    before = torch.cumsum(sort, dim=-1) - sort
    keep = torch.ones_like(sort, dtype=torch.bool)
    if top_k > 0:
        keep &= torch.arange(sort.shape[-1]).view(1, -1) < top_k
    keep &= before <= top_p
    kept = torch.where(keep, sort, 0.0)
    if min_p > 0:
        kept = torch.where(kept < kept[:, :1] * min_p, 0.0, kept)
    out = torch.zeros_like(probs).scatter_(1, idx, kept)
    return out / out.sum(dim=-1, keepdim=True)


def sampling_law(port: int, logits: Any, *, temperature: float, count: int, length: int,
                 seed: int, top_k: int = -1, top_p: float = 1.0,
                 min_p: float = 0.0) -> dict[str, Any]:
    """Sampled requests; every transition (prev -> next) is tested against softmax(logits/T).

    The statistic is the z score of the count of transitions to the target's top-1 after
    ``prev`` against its expectation (the sum of those probabilities; a normal approximation of
    the Poisson-binomial); with ``count x length`` transitions a greedy-follow sampler (always
    top-1) or one that ignores the temperature lands far past |z| = 4. With ``top_k``, ``top_p``
    or ``min_p`` the expectation is the filtered law (:func:`filtered_probs`), and a sampled
    token the filters remove counts in ``outside_filter`` (a failure).
    """
    import torch

    raw = torch.softmax(logits / temperature, dim=-1)
    probs = filtered_probs(raw, top_k=top_k, top_p=top_p, min_p=min_p)
    floor = torch.where(probs > 0, raw, torch.inf).min(dim=-1).values
    top1 = probs.argmax(dim=-1)
    rng = random.Random(seed)
    prompts = [[rng.randrange(10, 99), 100] for _ in range(count)]
    params: dict[str, Any] = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    if min_p > 0:
        params["min_p"] = min_p
    answers = client.batch(port, prompts, [length] * count, concurrency=min(32, count),
                           sampling=params)
    hits = exp_hits = trans = 0.0
    var = 0.0
    failed = outside = 0
    for prompt, ans in zip(prompts, answers, strict=True):
        if ans.error:
            failed += 1
            continue
        seq = prompt[-1:] + ans.output_ids
        for prev, nxt in zip(seq, seq[1:], strict=False):
            p = float(probs[prev, top1[prev]])
            trans += 1
            exp_hits += p
            var += p * (1 - p)
            hits += 1.0 if nxt == int(top1[prev]) else 0.0
            # Outside the filters: below the smallest kept probability. A token tied with the
            # kept ones may be cut or kept by either sort (the ladder's tail is flat), so ties
            # are not counted (run 5 counted them: SGLang itself "failed").
            outside += 1 if float(raw[prev, nxt]) < float(floor[prev]) * (1 - 1e-5) else 0
    z = (hits - exp_hits) / math.sqrt(var) if var > 0 else float("inf")
    return {"ok": failed == 0 and abs(z) < 4.0 and outside == 0, "z": z,
            "transitions": int(trans), "outside_filter": outside,
            "top1_share": hits / trans if trans else None,
            "top1_expected": exp_hits / trans if trans else None, "failed": failed,
            "temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p}
