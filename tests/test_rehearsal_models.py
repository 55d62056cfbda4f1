"""The rehearsal's hand-set models (rehearsal/models.py) against their closed form (designs.py).

The generated checkpoints are read back with the real safetensors reader and run through a small
pure-torch Qwen3 / DFlash reference forward written for this test (RMSNorm, RoPE, GQA attention
with an arbitrary mask, SwiGLU MLP). Speculative rounds use the payload's DDTree core
(payload/ddtree/core.py) as SGLang's integration does: drafter block -> per-depth top-k -> tree ->
target pass with the ancestor mask -> greedy walk.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
import safetensors.torch as safetensors_torch  # a dev dependency: the real reader
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "payload"))
from ddtree import build_tree, compile_tree, draft_topk, walk_tree

from rehearsal import models
from rehearsal.designs import (
    DESIGNS,
    AmbiguousPrediction,
    Design,
    draft_ranking,
    expected,
    get_design,
    predict_rounds,
    predicted_accept_length,
    predicted_meta,
    prev_head_gap,
    prev_head_scores,
    target_margin,
    tree_accepts,
)

PROMPTS = (
    [1, 2, 3, 4, 5],
    [9, 104],
    [33, 200],
    [7, 7, 12, 106],
    [250, 3, 3, 3, 3, 3, 3, 3, 200],
    [103, 5],
    [103],
)


# ------------------------------------------------------------------ loading


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matmuls: one thread is several times faster than two on a shared, busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@dataclasses.dataclass
class Loaded:
    design: Design
    target: dict[str, torch.Tensor]
    draft: dict[str, torch.Tensor]
    target_config: dict
    draft_config: dict

    def in_bfloat16(self) -> Loaded:
        """The same weights computed in bfloat16 between ops (what SGLang runs with --dtype)."""
        bf = torch.bfloat16
        return dataclasses.replace(
            self,
            target={k: v.to(bf) for k, v in self.target.items()},
            draft={k: v.to(bf) for k, v in self.draft.items()},
        )


@pytest.fixture(scope="module", params=sorted(DESIGNS))
def loaded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Loaded:
    design = get_design(request.param)
    out = tmp_path_factory.mktemp(design.name)
    assert models.main([str(out), "--design", design.name]) == 0

    def read(sub: str) -> tuple[dict[str, torch.Tensor], dict]:
        weights = safetensors_torch.load_file(str(out / sub / "model.safetensors"))
        assert all(t.dtype == torch.bfloat16 for t in weights.values())
        config = json.loads((out / sub / "config.json").read_text())
        return {k: v.float() for k, v in weights.items()}, config

    target, tcfg = read("target")
    draft, dcfg = read("draft")
    return Loaded(design, target, draft, tcfg, dcfg)


# -------------------------------------------------------- reference forward


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32, returned in x's dtype (as SGLang's kernels do)."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """NeoX-style rotary embedding of x [T, heads, hd] at positions pos [T]."""
    hd = x.shape[-1]
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = (pos.double()[:, None] * inv[None, :]).float()[:, None, :]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    x1, x2 = x1.float(), x2.float()
    out = torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin()], -1)
    return out.to(x.dtype)


def attention(q, k, v, allowed: torch.Tensor) -> torch.Tensor:
    """q [T, nh, hd], k/v [S, nkv, hd], allowed [T, S] bool -> [T, nh * hd] (GQA)."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum("thd,shd->hts", q.float(), k.float()) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    out = torch.einsum("hts,shd->thd", scores.softmax(-1), v.float())
    return out.reshape(q.shape[0], -1).to(v.dtype)


def qkv(w, p: str, d: Design, xn: torch.Tensor, pos: torch.Tensor):
    t = xn.shape[0]
    q = (xn @ w[p + "self_attn.q_proj.weight"].T).view(t, d.num_heads, d.head_dim)
    k = (xn @ w[p + "self_attn.k_proj.weight"].T).view(t, d.num_kv_heads, d.head_dim)
    v = (xn @ w[p + "self_attn.v_proj.weight"].T).view(t, d.num_kv_heads, d.head_dim)
    q = rope(rms(q, w[p + "self_attn.q_norm.weight"], d.rms_norm_eps), pos, d.rope_theta)
    k = rope(rms(k, w[p + "self_attn.k_norm.weight"], d.rms_norm_eps), pos, d.rope_theta)
    return q, k, v


def mlp(w, p: str, x: torch.Tensor) -> torch.Tensor:
    g, u = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
    return (F.silu(g.float()) * u.float()).to(x.dtype) @ w[p + "mlp.down_proj.weight"].T


def target_forward(m: Loaded, ids: list[int], pos: torch.Tensor, allowed: torch.Tensor):
    """Qwen3 over ids (every row sees what ``allowed`` says): logits [T, V], captured features."""
    d, w = m.design, m.target
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    captured = []
    for i in range(d.num_layers):
        p = f"model.layers.{i}."
        q, k, v = qkv(w, p, d, rms(x, w[p + "input_layernorm.weight"], d.rms_norm_eps), pos)
        x = x + attention(q, k, v, allowed) @ w[p + "self_attn.o_proj.weight"].T
        x = x + mlp(w, p, rms(x, w[p + "post_attention_layernorm.weight"], d.rms_norm_eps))
        if i in d.target_layer_ids:
            captured.append(x)
    logits = rms(x, w["model.norm.weight"], d.rms_norm_eps) @ w["lm_head.weight"].T
    return logits.float(), torch.cat(captured, -1)


def causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


def draft_logits(m: Loaded, seq: list[int]) -> torch.Tensor:
    """DFlash's draft pass for committed ``seq`` (root seq[-1]): logits [D, V], the target's head.

    Context = the target's captured features of seq[:-1]; block = [root, mask * (block - 1)],
    non-causal over context + block, positions continuing from the root's.
    """
    d, w = m.design, m.draft
    root_pos = len(seq) - 1
    ctx_pos = torch.arange(root_pos)
    _, feats = target_forward(m, seq[:-1], ctx_pos, causal(root_pos))
    ctx = rms(feats @ w["fc.weight"].T, w["hidden_norm.weight"], d.rms_norm_eps)
    block = [seq[-1]] + [d.mask_token_id] * (d.block_size - 1)
    bpos = root_pos + torch.arange(d.block_size)
    x = m.target["model.embed_tokens.weight"][torch.tensor(block)]
    allowed = torch.ones(d.block_size, root_pos + d.block_size, dtype=torch.bool)
    for i in range(d.draft_layers):
        p = f"layers.{i}."
        q, k, v = qkv(w, p, d, rms(x, w[p + "input_layernorm.weight"], d.rms_norm_eps), bpos)
        kc = (ctx @ w[p + "self_attn.k_proj.weight"].T).view(root_pos, d.num_kv_heads, d.head_dim)
        kc = rope(rms(kc, w[p + "self_attn.k_norm.weight"], d.rms_norm_eps), ctx_pos, d.rope_theta)
        vc = (ctx @ w[p + "self_attn.v_proj.weight"].T).view(root_pos, d.num_kv_heads, d.head_dim)
        att = attention(q, torch.cat([kc, k]), torch.cat([vc, v]), allowed)
        x = x + att @ w[p + "self_attn.o_proj.weight"].T
        x = x + mlp(w, p, rms(x, w[p + "post_attention_layernorm.weight"], d.rms_norm_eps))
    hidden = rms(x, w["norm.weight"], d.rms_norm_eps)
    return (hidden[1:] @ m.target["lm_head.weight"].T).float()


def verify_mask(ctx: int, mask: torch.Tensor) -> torch.Tensor:
    """Context (``ctx`` committed tokens before the root) causal; tree slots see it + ``mask``."""
    n = mask.shape[0]
    allowed = torch.zeros(ctx + n, ctx + n, dtype=torch.bool)
    allowed[:ctx, :ctx] = causal(ctx)
    allowed[ctx:, :ctx] = True
    allowed[ctx:, ctx:] = mask
    return allowed


def spec_decode(
    m: Loaded,
    prompt: list[int],
    max_new: int,
    algorithm: str,
    budget: int = 15,
    topk: int = 8,
    corrupt=None,
    shift: int = 0,
) -> tuple[list[int], list[int]]:
    """Greedy speculative decoding with the payload's core; returns (output, tokens per round)."""
    d = m.design
    seq = list(prompt)
    logits, _ = target_forward(m, seq, torch.arange(len(seq)), causal(len(seq)))
    out = [int(logits[-1].argmax())]
    seq += out
    rounds: list[int] = []
    while len(out) < max_new:
        lp, tok = draft_topk(draft_logits(m, seq)[None], topk, backend="torch")
        root = torch.tensor([seq[-1]])
        if algorithm == "DFLASH":
            tree = build_tree(lp[..., :1], tok[..., :1], root, d.block_size - 1, backend="torch")
        else:
            tree = build_tree(lp, tok, root, budget, backend="torch")
        vin = compile_tree(tree, torch.tensor([len(seq) - 1]), backend="torch")
        mask = vin.mask[0] if corrupt is None else corrupt(tree, vin.mask[0])
        ids = seq[:-1] + vin.input_ids[0].tolist()
        pos = torch.cat([torch.arange(len(seq) - 1), vin.positions[0] + shift])
        logits, _ = target_forward(m, ids, pos, verify_mask(len(seq) - 1, mask))
        target_tokens = logits[len(seq) - 1 :].argmax(-1)[None]
        walk = walk_tree(tree, target_tokens, vin.mask, backend="torch")
        new = walk.new_tokens[0, : int(walk.num_accepted[0]) + 1].tolist()
        new = new[: max_new - len(out)]
        seq += new
        out += new
        rounds.append(len(new))
    return out, rounds


def greedy(m: Loaded, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """Plain greedy decoding (full causal recompute): tokens and top-1 minus top-2 logits."""
    seq, out, gaps = list(prompt), [], []
    for _ in range(n):
        logits, _ = target_forward(m, seq, torch.arange(len(seq)), causal(len(seq)))
        top = logits[-1].topk(2).values
        gaps.append(float(top[0] - top[1]))
        out.append(int(logits[-1].argmax()))
        seq.append(out[-1])
    return out, gaps


# --------------------------------------------------------------------- tests


def test_configs_mirror_the_captured_dummy_pair(loaded: Loaded) -> None:
    t, dr = loaded.target_config, loaded.draft_config
    assert t["architectures"] == ["Qwen3ForCausalLM"] and t["model_type"] == "qwen3"
    assert (t["hidden_size"], t["num_hidden_layers"], t["num_attention_heads"]) == (256, 6, 4)
    assert (t["num_key_value_heads"], t["head_dim"], t["vocab_size"]) == (2, 64, 1024)
    assert t["tie_word_embeddings"] is False and t["torch_dtype"] == "bfloat16"
    assert dr["architectures"] == ["DFlashDraftModel"]
    assert (dr["hidden_size"], dr["num_hidden_layers"], dr["num_target_layers"]) == (256, 2, 6)
    assert dr["dflash_config"] == {
        "block_size": 8,
        "target_layer_ids": [1, 3],
        "mask_token_id": 1000,
    }
    # Every parameter SGLang's loaders map: nothing left to chance (DFlash ignores unknown names).
    assert "lm_head.weight" in loaded.target and "model.embed_tokens.weight" in loaded.target
    assert {"fc.weight", "hidden_norm.weight", "norm.weight"} <= set(loaded.draft)
    assert loaded.draft["fc.weight"].shape == (256, 512)
    assert not any(k.startswith(("embed", "lm_head", "model.")) for k in loaded.draft)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_is_the_closed_form_with_its_margin(
    loaded: Loaded, prompt: list[int]
) -> None:
    d = loaded.design
    out, gaps = greedy(loaded, prompt, 14)
    assert out == expected(d, prompt, 14)
    margins = target_margin(d)
    for step, gap in enumerate(gaps):
        context = prompt + out[:step]
        previous = context[-2] if len(context) > 1 else context[-1]
        if d.alarm is not None and d.poison in context:
            want = margins["alarm"]
        elif d.prev_marker is not None and previous == d.prev_marker:
            want = margins["previous_token"]
        else:
            want = margins["plain"]
        assert gap >= want - 1e-3, (step, gap, want)


def test_alarm_design_depends_on_an_earlier_token(loaded: Loaded) -> None:
    d = loaded.design
    clean, poisoned = [3, 104, 5, 6], [3, d.poison, 5, 6]
    got_clean, _ = greedy(loaded, clean, 3)
    got_poisoned, _ = greedy(loaded, poisoned, 3)
    if d.alarm is None:
        assert got_clean == got_poisoned == [100, 101, 102]  # ladder: only the last token counts
    else:
        assert got_clean == [100, 101, 102] and got_poisoned == [d.alarm] * 3


def test_drafter_ranks_poison_first_and_the_attractor_second_at_every_depth(loaded: Loaded) -> None:
    d = loaded.design
    want = draft_ranking(d, 2)
    for seq in ([1, 2, 3], [5, 104, 105, 106, 107, 200], [d.poison, 200]):
        lp = torch.log_softmax(draft_logits(loaded, seq), -1)
        top = lp.topk(3, -1)
        assert lp.shape[0] == d.block_size - 1
        for depth in range(d.block_size - 1):
            assert top.indices[depth, :2].tolist() == [d.poison, d.attractor]
            assert torch.allclose(
                top.values[depth, :2], torch.tensor([v for _, v in want]), atol=1e-3
            )
            assert float(top.values[depth, 2]) < -15  # everything else far below
            assert float(top.values[depth, 0] - top.values[depth, 1]) == pytest.approx(
                d.draft_gap, abs=1e-3
            )


@pytest.mark.parametrize(("budget", "topk"), [(15, 8), (31, 8), (63, 8)])
def test_ddtree_core_accepts_what_the_design_predicts(
    loaded: Loaded, budget: int, topk: int
) -> None:
    d = loaded.design
    for prompt, n in (([1, 2, 3], 30), ([33, 200], 23)):
        out, rounds = spec_decode(loaded, prompt, n, "DDTREE", budget, topk)
        assert out == expected(d, prompt, n)
        assert rounds == predict_rounds(d, prompt, n, "DDTREE", budget, topk)
    steady = predicted_accept_length(d, budget, topk, None, "DDTREE")
    assert steady == {15: 4.0, 31: 5.0, 63: 6.0}[budget]
    assert set(rounds[:-1]) == {steady}  # the prompt ends on the attractor: steady from round 1


def test_dflash_chain_accepts_what_the_design_predicts(loaded: Loaded) -> None:
    d = loaded.design
    out, rounds = spec_decode(loaded, [33, 200], 12, "DFLASH")
    assert out == expected(d, [33, 200], 12) and rounds == [1] * 11
    assert rounds == predict_rounds(d, [33, 200], 12, "DFLASH")
    assert predicted_accept_length(d, 15, 8, None, "DFLASH") == 1.0


def test_bfloat16_compute_gives_the_designed_logits_exactly(loaded: Loaded) -> None:
    d, bf = loaded.design, loaded.in_bfloat16()
    _, gaps = greedy(bf, [33, 200], 10)
    assert gaps == [d.successor_logit] * 10  # the norms round to exactly 1.0 in bfloat16
    top = draft_logits(bf, [1, 2, 200]).topk(3, -1)
    named = [d.draft_logit_poison, d.draft_logit_poison - d.draft_gap, d.draft_logit_other]
    assert top.values.tolist() == [named] * (d.block_size - 1)
    out, rounds = spec_decode(bf, [33, 200], 20, "DDTREE", 31, 8)
    assert out == expected(d, [33, 200], 20)
    assert rounds == predict_rounds(d, [33, 200], 20, "DDTREE", 31, 8) == [5, 5, 5, 4]
    out, rounds = spec_decode(bf, [1, 2, 3], 20, "DDTREE", 31, 8)  # through the ladder
    assert out == expected(d, [1, 2, 3], 20)
    assert rounds == predict_rounds(d, [1, 2, 3], 20, "DDTREE", 31, 8)


def see_a_sibling(tree, mask: torch.Tensor) -> torch.Tensor:
    """A wrong tree mask: the first attractor node also sees its sibling at depth 1 (the poison)."""
    bad = mask.clone()
    tokens, depths = tree.tokens[0], tree.depths[0]
    depth1 = [i for i in range(tokens.shape[0]) if int(depths[i]) == 1]
    node = next(i for i in depth1 if int(tokens[i]) == 200)
    sibling = next(i for i in depth1 if i != node)
    bad[node, sibling] = True
    return bad


def test_a_node_seeing_its_sibling_changes_only_the_alarm_design(loaded: Loaded) -> None:
    d = loaded.design
    prompt, n = [33, 200], 12
    out, _ = spec_decode(loaded, prompt, n, "DDTREE", 15, 8, corrupt=see_a_sibling)
    if d.alarm is None:
        assert out == expected(d, prompt, n)  # blind to the mask: why design 2 exists
    else:
        assert out != expected(d, prompt, n)
        assert out[2] == d.alarm  # round 1: the attractor at depth 1 (accepted), then its answer


@pytest.mark.parametrize("shift", [1, -1])
def test_a_verify_block_off_by_one_position_changes_only_the_prevtoken_design(
    loaded: Loaded, shift: int
) -> None:
    d = loaded.design
    prompt, n = [1, 2, 3], 12  # the ladder passes 103, 104: the marker's round has root 104
    out, _ = spec_decode(loaded, prompt, n, "DDTREE", 15, 8, shift=shift)
    if d.prev_marker is None:
        assert out == expected(d, prompt, n)  # position-blind
    else:
        assert expected(d, prompt, n)[:8] == [100, 101, 102, 103, 104, 106, 107, 200]
        assert out[:6] == [100, 101, 102, 103, 104, 105]  # the root no longer sees 103 at 1


def test_prev_head_peaks_at_distance_one_up_to_the_context() -> None:
    d = get_design("prevtoken")
    scores = prev_head_scores(d, d.context_length + 65)
    assert max(range(len(scores)), key=scores.__getitem__) == 1
    assert prev_head_gap(d) > 30  # 4161 keys at most: the weight off distance 1 is < 4161 e^-30
    assert scores[0] == pytest.approx(scores[2])  # symmetric: a shift of one splits the weight


def test_prev_head_in_bfloat16_attends_to_the_previous_token_at_the_end_of_the_context() -> None:
    """bfloat16 weights, activations and cos/sin cache (SGLang builds it in the model dtype)."""
    d = get_design("prevtoken")
    w = models.target_weights(d)
    n = d.context_length + 65
    hd, bf = d.head_dim, torch.bfloat16
    x = rms(
        w["model.embed_tokens.weight"][torch.arange(n) % 200],
        w["model.layers.0.input_layernorm.weight"],
        d.rms_norm_eps,
    )
    p = "model.layers.0.self_attn."
    q = (x @ w[p + "q_proj.weight"].T).view(n, d.num_heads, hd)[:, 2]
    k = (x @ w[p + "k_proj.weight"].T).view(n, d.num_kv_heads, hd)[:, 1]
    q, k = (
        rms(q, w[p + "q_norm.weight"], d.rms_norm_eps),
        rms(k, w[p + "k_norm.weight"], d.rms_norm_eps),
    )
    inv = d.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(bf), ang.sin().to(bf)

    def rot(t: torch.Tensor) -> torch.Tensor:
        t1, t2 = t[:, : hd // 2], t[:, hd // 2 :]
        return torch.cat([t1 * cos - t2 * sin, t2 * cos + t1 * sin], -1).to(bf)

    q, k = rot(q), rot(k)
    scores = (k.float() @ q[-1].float()) * hd**-0.5  # the last query against every key
    weights = scores.softmax(-1)
    assert float(weights[-2]) > 1 - 1e-6  # distance 1
    off = torch.cat([scores[:-2], scores[-1:]])
    assert float(scores[-2] - off.max()) > 28  # designed 30.65; 30.37 here after the rounding


def test_prediction_edges_and_ambiguity() -> None:
    d = get_design("ladder")
    assert predict_rounds(d, [200], 1, "DDTREE") == []
    meta = predicted_meta(d, [200], 10, "DDTREE", 15, 8)
    assert meta == {
        "completion_tokens": 10,
        "spec_verify_ct": 3,
        "spec_accepted_drafts": 6,
        "spec_accept_length": pytest.approx(10 / 3),
    }  # rounds 4, 4, 1 (cut)
    assert predict_rounds(d, [5], 12, "DDTREE") == [1] * 7 + [4]  # the ladder, then the attractor
    tied = dataclasses.replace(d, draft_gap=0.0)  # poison and attractor tie: order undefined
    with pytest.raises(AmbiguousPrediction):
        tree_accepts(tied, [200] * 8, 15, 8)
    for gap in (0.02, 0.1, 0.14):  # the predictions hold over a range of gaps, not on a knife edge
        moved = dataclasses.replace(d, draft_gap=gap)
        got = [predicted_accept_length(moved, b, 8, None, "DDTREE") for b in (15, 31, 63)]
        assert got == [4, 5, 6]
    with pytest.raises(ValueError, match="algorithm"):
        predict_rounds(d, [1], 4, "EAGLE")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        expected(d, [5000], 3)


def test_cli_prints_margins_and_predictions(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert models.main([str(tmp_path), "--design", "alarm"]) == 0
    text = capsys.readouterr().out
    assert "DDTREE 15/8 4.0" in text and "DDTREE 63/8 6.0" in text and "DFLASH 1.0" in text
    assert "alarm" in text and "--dtype bfloat16" in text
    with pytest.raises(SystemExit) as exc:
        models.main([str(tmp_path), "--design", "nope"])
    assert exc.value.code == 2
