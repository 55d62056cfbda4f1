"""Write the rehearsal's hand-set Qwen3 target and DFlash drafter (config.json + model.safetensors).

    python -m rehearsal.models OUTDIR [--design ladder|alarm|prevtoken]

writes OUTDIR/target and OUTDIR/draft for SGLang 0.5.11 (``--skip-tokenizer-init``: requests
send input_ids) and OUTDIR/design.json, and prints the design, its logit margins and its
predicted accept lengths.
Needs torch only (the safetensors file is written here, in the format's documented layout), so
it runs on the GPU host with the host's own torch. What the weights do: ``rehearsal/designs.py``.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import math
import struct
import sys
from pathlib import Path

import torch

from rehearsal.designs import DESIGNS, Design, get_design, predicted_accept_length, target_margin

DTYPE = torch.bfloat16
_ST_DTYPES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}
BUDGETS = ((15, 8), (31, 8), (63, 8))


# ------------------------------------------------------------------ weights


def _norm_weight(design: Design) -> torch.Tensor:
    """RMSNorm weight 1/sqrt(H): a one-hot 1.0 comes out as (about) 1.0."""
    return torch.full((design.hidden_size,), 1.0 / math.sqrt(design.hidden_size))


def _prev_head(design: Design, q, k, v, o) -> float:
    """Design 3's previous-token head: query head 2 on KV head 1; returns the q/k norm weight.

    q and k are the same for every token (every token coordinate's column is equal); after
    q_norm/k_norm, k is real on the first P RoPE pairs and q's pair i is c_i * exp(-j*theta_i),
    so RoPE makes the score sum_i a_i*cos((distance - 1)*theta_i): a peak at distance 1
    (rehearsal.designs.prev_head_scores). The value marks the marker token; o_proj carries head
    2's dim 0 to the previous-token channel.
    """
    hd, half = design.head_dim, design.head_dim // 2
    scale = 1.0 / math.sqrt(design.hidden_size)  # undo input_layernorm's sqrt(H)
    qrow, krow = 2 * hd, 1 * hd  # query head 2, KV head 1 (GQA: heads 2, 3 -> KV head 1)
    tokens = slice(0, design.mask_coord + 1)
    for i, c in enumerate(design.prev_pairs):
        theta = design.rope_theta ** (-2 * i / hd)
        q[qrow + i, tokens] = c * math.cos(theta) * scale
        q[qrow + half + i, tokens] = -c * math.sin(theta) * scale
        k[krow + i, tokens] = scale
    if design.prev_marker is None:
        raise ValueError(f"design {design.name} has no previous-token marker")
    v[krow, design.coord(design.prev_marker)] = scale
    o[design.prev_coord, qrow] = 1.0
    return design.prev_qk_gain


def _layer(design: Design, prefix: str, *, heads: bool) -> dict[str, torch.Tensor]:
    """A decoder layer: the identity (zero o_proj and down_proj), or with the design's heads."""
    h, hd = design.hidden_size, design.head_dim
    q = torch.zeros(design.num_heads * hd, h)
    k = torch.zeros(design.num_kv_heads * hd, h)
    v = torch.zeros(design.num_kv_heads * hd, h)
    o = torch.zeros(h, design.num_heads * hd)
    qk_norm = 1.0
    if heads and design.prev_marker is not None:
        qk_norm = _prev_head(design, q, k, v, o)
    if heads:
        # input_layernorm (weight 1) turns a one-hot 1.0 into sqrt(H); value 1 for the poison.
        v[0, design.coord(design.poison)] = 1.0 / math.sqrt(h)
        # q = 0: every visible token gets the same score, so head 0 outputs the poison
        # fraction on its dim 0; o_proj amplifies it into the alarm channel.
        o[design.alarm_coord, 0] = design.alarm_gain
    inter = design.intermediate_size
    return {
        f"{prefix}input_layernorm.weight": torch.ones(h),
        f"{prefix}post_attention_layernorm.weight": torch.ones(h),
        f"{prefix}self_attn.q_proj.weight": q,
        f"{prefix}self_attn.k_proj.weight": k,
        f"{prefix}self_attn.v_proj.weight": v,
        f"{prefix}self_attn.o_proj.weight": o,
        f"{prefix}self_attn.q_norm.weight": torch.full((hd,), qk_norm),
        f"{prefix}self_attn.k_norm.weight": torch.full((hd,), qk_norm),
        f"{prefix}mlp.gate_proj.weight": torch.zeros(inter, h),
        f"{prefix}mlp.up_proj.weight": torch.zeros(inter, h),
        f"{prefix}mlp.down_proj.weight": torch.zeros(h, inter),
    }


def target_weights(design: Design) -> dict[str, torch.Tensor]:
    """Qwen3ForCausalLM weights (HF names), bfloat16."""
    h, vocab = design.hidden_size, design.vocab_size
    embed = torch.zeros(vocab, h)
    for t in range(vocab):
        embed[t, design.coord(t)] = 1.0
    head = torch.zeros(vocab, h)  # lm_head[v, c]: logit of v when the final state is one-hot c
    for c in range(design.mask_coord):
        head[design.successor(c), c] = design.successor_logit
    head[:, design.mask_coord] = design.draft_logit_other
    for t, z in design.draft_logits().items():
        head[t, design.mask_coord] = z
    if design.alarm is not None:
        head[design.alarm, design.alarm_coord] = design.alarm_logit
    if design.prev_marker is not None:
        head[design.prev_next, design.prev_coord] = design.prev_logit
    w: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": embed,
        "model.norm.weight": _norm_weight(design),
        "lm_head.weight": head,
    }
    for i in range(design.num_layers):
        w.update(_layer(design, f"model.layers.{i}.", heads=design.alarm is not None and i == 0))
    return {k: v.to(DTYPE).contiguous() for k, v in w.items()}


def draft_weights(design: Design) -> dict[str, torch.Tensor]:
    """DFlashDraftModel weights (no embedding, no LM head: it uses the target's), bfloat16.

    fc = 0 and every layer the identity: the output at a mask position is the mask token's own
    (normalised) embedding, whatever the context and the depth.
    """
    h = design.hidden_size
    w: dict[str, torch.Tensor] = {
        "fc.weight": torch.zeros(h, len(design.target_layer_ids) * h),
        "hidden_norm.weight": torch.ones(h),
        "norm.weight": _norm_weight(design),
    }
    for i in range(design.draft_layers):
        w.update(_layer(design, f"layers.{i}.", heads=False))
    return {k: v.to(DTYPE).contiguous() for k, v in w.items()}


# ------------------------------------------------------------------- configs


def _common_config(design: Design, layers: int) -> dict[str, object]:
    return {
        "model_type": "qwen3",
        "vocab_size": design.vocab_size,
        "hidden_size": design.hidden_size,
        "intermediate_size": design.intermediate_size,
        "num_hidden_layers": layers,
        "num_attention_heads": design.num_heads,
        "num_key_value_heads": design.num_kv_heads,
        "head_dim": design.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": design.context_length,
        "rms_norm_eps": design.rms_norm_eps,
        "rope_theta": design.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": layers,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "initializer_range": 0.02,
        "bos_token_id": design.bos_token_id,
        "eos_token_id": design.eos_token_id,
    }


def target_config(design: Design) -> dict[str, object]:
    return {"architectures": ["Qwen3ForCausalLM"], **_common_config(design, design.num_layers)}


def draft_config(design: Design) -> dict[str, object]:
    return {
        "architectures": ["DFlashDraftModel"],
        **_common_config(design, design.draft_layers),
        "block_size": design.block_size,
        "num_target_layers": design.num_layers,
        "dflash_config": {
            "block_size": design.block_size,
            "target_layer_ids": list(design.target_layer_ids),
            "mask_token_id": design.mask_token_id,
        },
    }


# ------------------------------------------------------------------ writing


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """The safetensors layout: u64 LE header size, JSON header (space-padded to 8), raw data."""
    if sys.byteorder != "little":
        raise RuntimeError("write_safetensors writes native byte order; this host is big-endian")
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    chunks: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        data = _tensor_bytes(t)
        header[name] = {
            "dtype": _ST_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for chunk in chunks:
            f.write(chunk)


def write_model(folder: Path, config: dict[str, object], tensors: dict[str, torch.Tensor]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_safetensors(folder / "model.safetensors", tensors)


def write_design(outdir: Path, design: Design) -> tuple[Path, Path]:
    """Write OUTDIR/target, OUTDIR/draft and OUTDIR/design.json; returns the model folders."""
    target, draft = outdir / "target", outdir / "draft"
    write_model(target, target_config(design), target_weights(design))
    write_model(draft, draft_config(design), draft_weights(design))
    (outdir / "design.json").write_text(json.dumps(summary(design), indent=2) + "\n")
    return target, draft


def server_flags(design: Design) -> list[str]:
    """The flags the design needs beyond model/draft paths, port and the speculative choice."""
    return [
        "--skip-tokenizer-init",
        "--dtype", "bfloat16",
        "--context-length", str(design.context_length),
        "--page-size", "1",
        "--attention-backend", "triton",
    ]  # fmt: skip


def summary(design: Design) -> dict[str, object]:
    """What OUTDIR/design.json holds: the design, its margins and predictions, the flags."""
    predictions = {"DFLASH": predicted_accept_length(design, 15, 8, None, "DFLASH")}
    for b, k in BUDGETS:
        predictions[f"DDTREE {b}/{k}"] = predicted_accept_length(design, b, k, None, "DDTREE")
    return {
        "design": design.name,
        "summary": design.summary,
        "parameters": dataclasses.asdict(design),
        "target_margins": target_margin(design),
        "predicted_accept_length": predictions,
        "server_flags": server_flags(design),
    }


def describe(design: Design) -> str:
    """The text the CLI prints: design, margins, predictions and the server flags it needs."""
    margins = target_margin(design)
    lines = [
        f"design {design.name}: {design.summary}",
        f"  poison {design.poison} (drafter top-1), attractor {design.attractor} (drafter rank 2,"
        f" {design.draft_gap} logits lower), ladder {design.ladder[0]}..{design.ladder[-1]}"
        + (f", alarm {design.alarm}" if design.alarm is not None else "")
        + (
            f", after {design.prev_marker} x comes {design.prev_next}"
            if design.prev_marker is not None
            else ""
        ),
        "  target logit margins: "
        + ", ".join(f"{k} {v:.4f}" for k, v in margins.items())
        + f" (prompt ids < {design.mask_coord} for the plain margin)",
        f"  predicted spec_accept_length (long run): DFLASH "
        f"{predicted_accept_length(design, 15, 8, None, 'DFLASH'):.1f}"
        + "".join(
            f", DDTREE {b}/{k} {predicted_accept_length(design, b, k, None, 'DDTREE'):.1f}"
            for b, k in BUDGETS
        ),
        f"  server flags: {' '.join(server_flags(design))}; drafter block_size "
        f"{design.block_size}, mask_token_id {design.mask_token_id} (from the draft config.json)",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rehearsal.models", description=__doc__.split("\n")[0]
    )
    parser.add_argument("outdir", type=Path, help="folder to write target/ and draft/ into")
    parser.add_argument("--design", default="ladder", choices=sorted(DESIGNS), help="which design")
    args = parser.parse_args(argv)
    design = get_design(args.design)
    try:
        target, draft = write_design(args.outdir, design)
    except OSError as exc:
        print(f"error: cannot write {args.outdir}: {exc}", file=sys.stderr)
        return 1
    print(describe(design))
    print(f"  wrote {target} and {draft}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
