"""Hand-set test models for the GPU rehearsal: what they answer, in closed form (stdlib only).

Two designs share one layout (``rehearsal/models.py`` turns a design into weights):

* Every token id has an embedding that is one-hot on a hidden coordinate (``coord``): ids below
  ``H - 3`` have their own coordinate; every id from ``H - 3`` up (the drafter's mask token
  among them, the "mask group") shares coordinate ``H - 3``. Coordinates ``H - 2`` and ``H - 1``
  are the "previous-token" and "alarm" channels that only designs 3 and 2's heads write.
* The target's layers are the identity (o_proj and down_proj zero) except, in design 2, one
  attention head of layer 0. The final hidden state is therefore the last token's one-hot
  (plus the alarm channel), and the LM head's column for a coordinate says "after this token
  comes that one": a ladder ``100 -> 101 -> ... -> 107 -> 200``, the attractor ``200 -> 200``,
  every other token ``-> 100``. The mask group's column is the drafter's distribution.
* The DFlash drafter is the identity too, so its output at every mask position is the mask
  token's own embedding, whatever the context: at every depth it proposes the "poison" token 7
  first and the attractor 200 second (``gap`` logits lower), everything else far below. The
  target never says 7, so DFlash's chain (all 7s) accepts nothing, while DDTree's tree, which
  also holds 200-paths, accepts a run of 200s.
* Design 2 ("alarm") adds to layer 0 an attention head with q_proj = 0: uniform attention over
  every visible token, whatever the positions, whose value is 1 for the poison token and 0 for
  every other. Its output (the fraction of visible poison tokens) goes, amplified, to the alarm
  channel, whose LM-head column says "alarm token 50". So the target answers 50 whenever a 7 is
  visible: a tree node that sees a sibling or any non-ancestor (poison nodes are everywhere in
  the tree), or a poison node's KV kept by mistake, turns the answer into 50s.
* Design 3 ("prevtoken") adds to design 2 a previous-token head in layer 0: q and k are the same
  for every token and set, pair by RoPE pair, so that the score peaks at relative distance 1 by
  more than 30 nats over every other distance up to the context length; its value marks token
  103, and its output makes the target answer 106 after "103, x". So the ladder goes
  ... 103 104 106 107 200, and a verify block whose positions are off by one relative to the
  cached prefix (the root then sees the marker at distance 2 or 0) answers 105 instead.

``expected`` is the greedy output; ``predict_rounds`` the tokens committed by each speculative
round; ``predicted_accept_length`` the long-run ``spec_accept_length``. They are computed from
the design alone (the tree by an independent best-first count), not from the payload's code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

ALGORITHMS = ("DFLASH", "DDTREE")
SCORE_TOL = 1e-4  # scores closer than this may be ordered either way by float32 sums


class AmbiguousPrediction(ValueError):
    """The design does not fix the answer (a tie at the tree's budget boundary, say)."""


@dataclass(frozen=True)
class Design:
    """One hand-set target/drafter pair (all numbers are exact in bfloat16)."""

    name: str
    summary: str
    alarm: int | None = None  # design 2: the token answered whenever the poison is visible
    prev_marker: int | None = None  # design 3: after "marker, any token" comes prev_next
    prev_next: int = 106
    poison: int = 7
    attractor: int = 200
    ladder: tuple[int, ...] = tuple(range(100, 108))
    mask_token_id: int = 1000
    vocab_size: int = 1024
    hidden_size: int = 256
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 512
    draft_layers: int = 2
    block_size: int = 8
    target_layer_ids: tuple[int, ...] = (1, 3)
    context_length: int = 4096
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    eos_token_id: int = 1023  # in the mask group: never generated
    bos_token_id: int = 1022
    successor_logit: float = 8.0  # target: logit of the successor; every other token 0
    draft_logit_poison: float = 2.0  # drafter: the poison's logit
    draft_gap: float = 0.0625  # drafter: the attractor is this much below the poison
    draft_logit_other: float = -14.0  # drafter: every other token
    alarm_logit: float = 16.0  # LM head, alarm channel -> alarm token
    alarm_gain: float = 8192.0  # o_proj gain from the poison fraction to the alarm channel
    prev_logit: float = 12.0  # LM head, previous-token channel -> prev_next
    prev_pairs: tuple[float, ...] = (3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)  # RoPE pair weights
    prev_qk_gain: float = 5.0  # q_norm and k_norm weight (the previous-token head's sharpness)

    # ---------------------------------------------------------------- layout
    @property
    def mask_coord(self) -> int:
        return self.hidden_size - 3

    @property
    def prev_coord(self) -> int:
        return self.hidden_size - 2

    @property
    def alarm_coord(self) -> int:
        return self.hidden_size - 1

    def coord(self, token: int) -> int:
        """The hidden coordinate a token's one-hot embedding uses."""
        if not 0 <= token < self.vocab_size:
            raise ValueError(
                f"token id {token} is outside the vocabulary (0..{self.vocab_size - 1})"
            )
        return min(token, self.mask_coord)

    def successor(self, token: int) -> int:
        """The target's next token after ``token`` when no poison is visible (design 1 rule)."""
        c = self.coord(token)
        if c == self.mask_coord:
            return self.poison  # the mask group's column is the drafter's: poison on top
        if token in self.ladder:
            i = self.ladder.index(token)
            return self.ladder[i + 1] if i + 1 < len(self.ladder) else self.attractor
        if token == self.attractor:
            return self.attractor
        return self.ladder[0]

    def draft_logits(self) -> dict[int, float]:
        """The drafter's named logits (the same at every depth); other ids: draft_logit_other."""
        return {
            self.poison: self.draft_logit_poison,
            self.attractor: self.draft_logit_poison - self.draft_gap,
        }

    def norm_gain(self) -> float:
        """What RMSNorm (weight 1/sqrt(H)) makes of a one-hot 1.0: 1/sqrt(1 + H*eps), about 1."""
        return 1.0 / math.sqrt(1.0 + self.hidden_size * self.rms_norm_eps)


DESIGNS: dict[str, Design] = {
    d.name: d
    for d in (
        Design(
            name="ladder",
            summary="context-free target (identity layers); drafter: poison top-1, attractor 2nd",
        ),
        Design(
            name="alarm",
            summary="as ladder, plus a layer-0 head: any visible poison token makes the target "
            "answer the alarm token (a tree-mask or KV-slot error changes the output)",
            alarm=50,
        ),
        Design(
            name="prevtoken",
            summary="as alarm, plus a layer-0 previous-token head (RoPE): after 103, x comes 106 "
            "(a verify block off by one position changes the output)",
            alarm=50,
            prev_marker=103,
        ),
    )
}


def get_design(name: str) -> Design:
    try:
        return DESIGNS[name]
    except KeyError:
        raise ValueError(f"unknown design {name!r}; known: {', '.join(DESIGNS)}") from None


# -------------------------------------------------------------------- target


def next_token(design: Design, context: Sequence[int]) -> int:
    """The target's greedy token after ``context`` (every token visible to the last one)."""
    if not context:
        raise ValueError("the context must hold at least one token")
    if design.alarm is not None and design.poison in context:
        return design.alarm
    if design.prev_marker is not None:
        previous = context[-2] if len(context) > 1 else context[-1]  # alone, a token sees itself
        if previous == design.prev_marker:
            return design.prev_next
    return design.successor(context[-1])


def expected(design: Design, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
    """The greedy output of the target (what no-speculation, DFLASH and DDTREE must return)."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    seq = [int(t) for t in prompt_ids]
    for t in seq:
        design.coord(t)
    out: list[int] = []
    for _ in range(max_new_tokens):
        t = next_token(design, seq)
        seq.append(t)
        out.append(t)
    return out


def target_margin(design: Design, max_visible: int | None = None) -> dict[str, float]:
    """Closed-form logit margins of the target's greedy choice (top-1 minus runner-up).

    ``plain``: after a token below the mask group with no poison visible; ``mask_group``: after
    a token of the mask group (the drafter's gap: keep such ids out of prompts); ``alarm``
    (designs 2, 3): with at least one poison among ``max_visible`` visible tokens (default: the
    context length plus a 64-node tree); ``previous_token`` (design 3): after "marker, x", and
    ``previous_token_attention_gap``: how far (nats) distance 1 out-scores every other distance.
    """
    g = design.norm_gain()  # also each head's value: input_layernorm's output times 1/sqrt(H)
    he = design.hidden_size * design.rms_norm_eps
    out = {"plain": design.successor_logit * g, "mask_group": design.draft_gap * g}
    if design.alarm is not None:
        n = max_visible if max_visible is not None else design.context_length + 65
        x = design.alarm_gain * g / n  # alarm channel (before the norm) with one poison in n
        out["alarm"] = (design.alarm_logit * x - design.successor_logit) / math.sqrt(1 + x * x + he)
    if design.prev_marker is not None:
        # After "marker, x": the previous-token channel (about 1) beside the token's 1.0.
        margin = (design.prev_logit * g - design.successor_logit) / math.sqrt(1 + g * g + he)
        out["previous_token"] = margin
        out["previous_token_attention_gap"] = prev_head_gap(design)
    return out


def prev_head_scores(design: Design, max_distance: int) -> list[float]:
    """Design 3's attention score (nats) at relative distance 0..max_distance (peak at 1).

    q_norm and k_norm (weight g) make k = g*sqrt(hd/P) on the first P RoPE pairs (real part) and
    q's pair i = g*c_i*8/|c| * exp(-j*theta_i); RoPE turns q.k into sum_i a_i*cos((d-1)*theta_i).
    """
    hd, pairs = design.head_dim, design.prev_pairs
    norm = math.sqrt(sum(c * c for c in pairs))
    k = design.prev_qk_gain * math.sqrt(hd / len(pairs))
    amp = [design.prev_qk_gain * c * math.sqrt(hd) / norm * k / math.sqrt(hd) for c in pairs]
    theta = [design.rope_theta ** (-2 * i / hd) for i in range(len(pairs))]
    return [
        sum(a * math.cos((d - 1) * t) for a, t in zip(amp, theta, strict=True))
        for d in range(max_distance + 1)
    ]


def prev_head_gap(design: Design, max_distance: int | None = None) -> float:
    """Score at distance 1 minus the best other distance (nats), up to the context + a tree."""
    n = max_distance if max_distance is not None else design.context_length + 65
    scores = prev_head_scores(design, n)
    return scores[1] - max(s for d, s in enumerate(scores) if d != 1)


# ------------------------------------------------------------------- drafter


def draft_ranking(design: Design, topk: int) -> list[tuple[int | None, float]]:
    """The drafter's top-k at every depth: (token, log-prob), best first; None = an unnamed id.

    Unnamed ids all share one logit, so which of them fill the lower ranks is not fixed.
    """
    named = design.draft_logits()
    n_other = design.vocab_size - len(named)
    logits = [*named.values(), design.draft_logit_other]
    top = max(logits)
    lse = top + math.log(
        sum(math.exp(z - top) for z in named.values())
        + n_other * math.exp(design.draft_logit_other - top)
    )
    ranked: list[tuple[int | None, float]] = sorted(
        ((t, z - lse) for t, z in named.items()), key=lambda p: -p[1]
    )
    ranked += [(None, design.draft_logit_other - lse)] * max(
        0, min(topk, design.vocab_size) - len(ranked)
    )
    return ranked[:topk]


def _count_above(logprobs: Sequence[float], depths: int, threshold: float, cap: int) -> int:
    """Nodes of the top-k-per-depth tree (depth 1..depths) whose path score exceeds threshold."""
    count = 0
    stack = [(0.0, 0)]
    while stack:
        score, depth = stack.pop()
        if depth == depths:
            continue
        for lp in logprobs:  # sorted descending: the first child that fails ends the scan
            child = score + lp
            if child <= threshold:
                break
            count += 1
            if count > cap:
                return count
            stack.append((child, depth + 1))
    return count


def tree_accepts(design: Design, path: Sequence[int], budget: int, topk: int) -> int:
    """Draft tokens DDTree accepts when the target's continuation is ``path`` (length >= D).

    The tree is the ``budget`` best nodes by cumulative draft log-probability (best-first over the
    top-k tree of depth D = block_size - 1). A path prefix is in the tree iff fewer than
    ``budget`` nodes score higher; a prefix whose score ties (within SCORE_TOL) with nodes across
    the budget boundary, or a path token among the unnamed lower ranks that reach the tree,
    raises AmbiguousPrediction.
    """
    depths = design.block_size - 1
    ranked = draft_ranking(design, topk)
    lps = [lp for _, lp in ranked]
    lp_of = {t: lp for t, lp in ranked if t is not None}
    score = 0.0
    for d in range(depths):
        token = path[d]
        if token not in lp_of:
            unnamed = [lp for t, lp in ranked if t is None]
            if (
                unnamed
                and _count_above(lps, depths, score + unnamed[0] - SCORE_TOL, budget) < budget
            ):
                raise AmbiguousPrediction(
                    f"token {token} at depth {d + 1} may be an unnamed lower rank in the tree"
                )
            return d
        score += lp_of[token]
        above = _count_above(lps, depths, score + SCORE_TOL, budget)
        within = _count_above(lps, depths, score - SCORE_TOL, budget)
        if within <= budget:
            continue  # in the tree whatever the tie order
        if above + 1 > budget:
            return d  # out whatever the tie order
        raise AmbiguousPrediction(
            f"depth {d + 1}: path score {score:.6f} ties with nodes across budget {budget}"
        )
    return depths


def chain_accepts(design: Design, path: Sequence[int]) -> int:
    """Draft tokens DFlash's chain (the drafter's top-1 at every depth) accepts."""
    top = draft_ranking(design, 1)[0][0]
    depths = design.block_size - 1
    for d in range(depths):
        if path[d] != top:
            return d
    return depths


def predict_rounds(
    design: Design,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    algorithm: str,
    budget: int = 15,
    topk: int = 8,
) -> list[int]:
    """Tokens committed by each verify round (accepted drafts + bonus, cut at max_new_tokens).

    The first output token comes from prefill (no round). A round's continuation is the target's
    own greedy continuation (every path node sees the committed tokens and its ancestors).
    ``len(result)`` is SGLang's ``spec_verify_ct``; ``1 + sum(result)`` its completion_tokens.
    """
    algorithm = algorithm.upper()
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    depths = design.block_size - 1
    seq = [int(t) for t in prompt_ids]
    out = expected(design, seq, min(max_new_tokens, 1))
    seq += out
    rounds: list[int] = []
    while len(out) < max_new_tokens:
        path = expected(design, seq, depths + 1)
        if algorithm == "DFLASH":
            accepted = chain_accepts(design, path)
        else:
            accepted = tree_accepts(design, path, budget, topk)
        take = min(accepted + 1, max_new_tokens - len(out))
        seq += path[:take]
        out += path[:take]
        rounds.append(take)
    return rounds


def predicted_meta(
    design: Design,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    algorithm: str,
    budget: int = 15,
    topk: int = 8,
) -> dict[str, float]:
    """The meta_info SGLang should report for one greedy request (completion/verify/accept)."""
    rounds = predict_rounds(design, prompt_ids, max_new_tokens, algorithm, budget, topk)
    completion = max_new_tokens
    verify = len(rounds)
    return {
        "completion_tokens": completion,
        "spec_verify_ct": verify,
        "spec_accepted_drafts": sum(max(0, r - 1) for r in rounds),
        "spec_accept_length": completion / verify if verify else float("nan"),
    }


def predicted_accept_length(
    design: Design, budget: int, topk: int, block_size: int | None, algorithm: str
) -> float:
    """Long-run tokens per verify round (accepted drafts + bonus) once the output is all attractors.

    That is the limit of ``completion_tokens / spec_verify_ct`` for a long generation; a finite
    one differs by its edges: the prefill token counts in completion_tokens but not in
    spec_verify_ct, the ladder's rounds commit one token each, and the last round is cut at
    max_new_tokens (``predicted_meta`` gives the exact figure for one request).
    """
    if block_size is not None and block_size != design.block_size:
        design = _with_block(design, block_size)
    depths = design.block_size - 1
    path = [design.attractor] * (depths + 1)
    algorithm = algorithm.upper()
    if algorithm == "DFLASH":
        return float(chain_accepts(design, path) + 1)
    if algorithm == "DDTREE":
        return float(tree_accepts(design, path, budget, topk) + 1)
    raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")


def _with_block(design: Design, block_size: int) -> Design:
    from dataclasses import replace

    if block_size < 2:
        raise ValueError(f"block_size must be at least 2, got {block_size}")
    return replace(design, block_size=block_size)
