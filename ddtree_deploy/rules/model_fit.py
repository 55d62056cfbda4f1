"""Model fit: the target's and the DFlash draft's config.json exist and agree.

The draft conditions on the target's hidden states taken after the layers listed in its
``dflash_config.target_layer_ids`` (or top-level ``target_layer_ids``); when they are
absent sglang derives one per draft layer. The width it expects is
len(target_layer_ids) x hidden_size: 5 x 5120 = 25,600 for Qwen3.6-27B with its b16 drafter.
A DDTree build that does not treat DDTREE as DFlash hands the draft [N, 5120] instead.

ModelFacts is filled by whoever reads the two config.json files (the probe, later); the
rules below only read it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ddtree_deploy.facts.model import Facts
from ddtree_deploy.rules.findings import Finding
from ddtree_deploy.settings.model import verify_width_problem, verify_width_remedy

__all__ = ["DRAFTED", "ModelFacts", "check_model_fit", "draft_block_size", "expected_width",
           "model_facts_from", "verify_width_problem", "verify_width_remedy"]

DRAFTED = ("dflash", "ddtree")


class ModelFacts(BaseModel):
    model_config = ConfigDict(extra="ignore")
    target_path: str | None = None
    draft_path: str | None = None
    target_config: dict[str, Any] | None = None  # config.json as read; None: missing/unreadable
    draft_config: dict[str, Any] | None = None
    errors: dict[str, str] = Field(default_factory=dict)  # "target"/"draft" -> why not read


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def hidden_size(config: dict[str, Any]) -> int | None:
    return _int(_text_config(config).get("hidden_size"))


def num_layers(config: dict[str, Any]) -> int | None:
    return _int(_text_config(config).get("num_hidden_layers"))


def target_layer_ids(draft: dict[str, Any]) -> list[int] | None:
    """The draft's declared layer ids; None when it declares none (or not as a list of ints)."""
    block = draft.get("dflash_config")
    ids = block.get("target_layer_ids") if isinstance(block, dict) else None
    if ids is None:
        ids = draft.get("target_layer_ids")
    if not isinstance(ids, list) or not all(_int(i) is not None for i in ids):
        return None
    return list(ids)


def expected_width(target: dict[str, Any], draft: dict[str, Any]) -> int | None:
    """The hidden-state width the draft expects: len(target_layer_ids) x hidden_size."""
    size = hidden_size(target)
    ids = target_layer_ids(draft)
    count = len(ids) if ids is not None else num_layers(draft)
    return None if size is None or count is None else count * size


def _missing(which: str, path: str | None, error: str | None, where: str, host: str) -> Finding:
    return Finding(
        id=f"model.{which}-config-missing",
        severity="error",
        message=f"the {which} model's config.json could not be read at {path or '(no path)'}",
        evidence={"path": path, "error": error},
        remedy=f"copy the {which} model to that path on the host, or point {where} in "
        f"hosts.yaml at where it is, then run `ddtree-deploy doctor {host}` again",
    )


def check_model_fit(mf: ModelFacts, algorithm: str, host: str = "HOST") -> list[Finding]:
    out: list[Finding] = []
    if mf.target_config is None:
        out.append(_missing("target", mf.target_path, mf.errors.get("target"), "model_path",
                            host))
    needs_draft = algorithm in DRAFTED or mf.draft_path is not None
    if needs_draft and mf.draft_config is None:
        out.append(_missing("draft", mf.draft_path, mf.errors.get("draft"), "draft_model_path",
                            host))
    if mf.target_config is None or mf.draft_config is None:
        return out
    target, draft = mf.target_config, mf.draft_config
    t_size, d_size = hidden_size(target), hidden_size(draft)
    if t_size is not None and d_size is not None and t_size != d_size:
        out.append(Finding(
            id="model.hidden-size-mismatch", severity="error",
            message=f"the draft's hidden_size {d_size} differs from the target's {t_size}: "
            "the draft was trained for another target",
            evidence={"target_hidden_size": t_size, "draft_hidden_size": d_size,
                      "target_path": mf.target_path, "draft_path": mf.draft_path},
            remedy="set the deployment's draft_model_path to the drafter made for this target",
        ))  # fmt: skip
    layers, ids = num_layers(target), target_layer_ids(draft)
    if layers is not None and ids is not None:
        bad = [i for i in ids if not 0 <= i < layers]
        if bad:
            out.append(Finding(
                id="model.target-layers-out-of-range", severity="error",
                message=f"the draft reads target layers {bad}, but the target has {layers} "
                f"layers (0..{layers - 1})",
                evidence={"target_layer_ids": ids, "target_num_hidden_layers": layers,
                          "out_of_range": bad},
                remedy="set the deployment's draft_model_path to the drafter made for this target",
            ))  # fmt: skip
    width = expected_width(target, draft)
    if not out and width is not None:
        out.append(Finding(
            id="model.fit", severity="info",
            message=f"target and draft agree; the draft expects hidden states of width {width:,}",
            evidence={"hidden_size": t_size, "target_num_hidden_layers": layers,
                      "target_layer_ids": ids, "expected_hidden_width": width},
        ))  # fmt: skip
    return out


def model_facts_from(facts: Facts, target: str | None, draft: str | None) -> ModelFacts:
    """ModelFacts for a deployment's target and draft folders, from the host's facts."""
    mf = ModelFacts(target_path=target, draft_path=draft)
    for role, path in (("target", target), ("draft", draft)):
        if path is None:
            continue
        entry = facts.model(path)
        if entry is None:
            mf.errors[role] = f"{path}: not examined (gather facts again with --refresh)"
        elif entry.config is None:
            mf.errors[role] = entry.error or f"{path}/config.json could not be read"
        elif role == "target":
            mf.target_config = entry.config
        else:
            mf.draft_config = entry.config
    return mf


def draft_block_size(draft: dict[str, Any]) -> tuple[int, str] | None:
    """The DFlash drafter's block size and where it came from, read as SGLang 0.5.11's
    parse_dflash_draft_config does: ``dflash_config.block_size``, else top-level ``block_size``."""
    block = draft.get("dflash_config")
    if isinstance(block, dict) and _int(block.get("block_size")) is not None:
        return int(block["block_size"]), "dflash_config.block_size"
    if _int(draft.get("block_size")) is not None:
        return int(draft["block_size"]), "block_size"
    return None
