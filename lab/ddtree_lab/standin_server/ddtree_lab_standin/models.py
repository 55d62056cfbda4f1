"""Model folders as SGLang sees them at start-up: config.json, DFlash drafts, memory.

Errors carry the texts of the real libraries: Hugging Face transformers for a
missing path or config.json, sglang's dflash_utils / DFlash model for draft
configs that do not fit the target (sglang 0.5.11 sources).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HF = "https://huggingface.co"


@dataclass(frozen=True)
class ModelInfo:
    path: str
    config: dict[str, Any]

    @property
    def text(self) -> dict[str, Any]:
        inner = self.config.get("text_config")
        return inner if isinstance(inner, dict) else self.config

    @property
    def hidden_size(self) -> int:
        return int(self.text.get("hidden_size", 0))

    @property
    def num_layers(self) -> int:
        return int(self.text.get("num_hidden_layers", 0))

    @property
    def architectures(self) -> list[str]:
        return [str(a) for a in self.config.get("architectures", [])]

    @property
    def model_type(self) -> str:
        return str(self.config.get("model_type", ""))


def load_model(path: str) -> ModelInfo:
    """Read ``<path>/config.json`` the way transformers' cached_file fails."""
    folder = Path(path)
    if not folder.is_dir():
        if folder.is_absolute() or path.startswith(".") or path.count("/") > 1:
            raise OSError(
                f"Incorrect path_or_model_id: '{path}'. Please provide either the path "
                "to a local folder or the repo_id of a model on the Hub."
            )
        raise OSError(
            f"We couldn't connect to '{HF}' to load this file, couldn't find it in the "
            f"cached files and it looks like {path} is not the path to a directory "
            "containing a file named config.json.\nCheckout your internet connection or "
            f"see how to run the library in offline mode at '{HF}/docs/transformers/"
            "installation#offline-mode'."
        )
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise OSError(
            f"{path} does not appear to have a file named config.json. Checkout "
            f"'{HF}/{path}/tree/None' for available files."
        )
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise OSError(
            f"It looks like the config file at '{config_file}' is not a valid JSON file."
        ) from exc
    if not isinstance(config, dict):
        raise OSError(f"It looks like the config file at '{config_file}' is not a valid JSON file.")
    return ModelInfo(path=path, config=config)


def draft_block_size(draft: ModelInfo) -> int | None:
    dflash = draft.config.get("dflash_config") or {}
    value = dflash.get("block_size", draft.config.get("block_size"))
    return int(value) if value is not None else None


def _build_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """As sglang's dflash_utils.build_target_layer_ids (evenly spread, 1..L-3)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    if end < start:
        raise ValueError(
            "DFlash layer selection requires num_target_layers >= 4. "
            f"Got num_target_layers={num_target_layers}."
        )
    span = end - start
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def draft_layer_ids(draft: ModelInfo, target: ModelInfo) -> list[int]:
    """The target layers the DFlash draft taps, validated as sglang does."""
    dflash = draft.config.get("dflash_config") or {}
    ids = dflash.get("target_layer_ids", draft.config.get("target_layer_ids"))
    if ids is None:
        if draft.num_layers <= 0:
            raise ValueError(
                "DFLASH requires draft num_hidden_layers in config. "
                "Got config without num_hidden_layers."
            )
        return _build_layer_ids(target.num_layers, draft.num_layers)
    if not isinstance(ids, list):
        raise ValueError(
            "DFLASH dflash_config.target_layer_ids must be a list of ints, "
            f"got type={type(ids).__name__}."
        )
    resolved = [int(x) for x in ids]
    if not resolved:
        raise ValueError(
            "DFLASH dflash_config.target_layer_ids must be non-empty. "
            f"Got len(target_layer_ids)={len(resolved)}."
        )
    for idx, val in enumerate(resolved):
        if val < 0 or val >= target.num_layers:
            raise ValueError(
                "DFLASH target_layer_ids contains an out-of-range layer id. "
                f"target_layer_ids[{idx}]={val}, target_num_layers={target.num_layers}."
            )
    return resolved


def check_draft_fits(draft: ModelInfo, target: ModelInfo) -> int:
    """The hidden-state width the draft expects (target hidden x tapped layers)."""
    layer_ids = draft_layer_ids(draft, target)
    expected = len(layer_ids) * draft.hidden_size
    captured = len(layer_ids) * target.hidden_size
    if expected != captured:
        raise ValueError(
            "DFLASH target_hidden feature dim mismatch. "
            f"Expected shape [N, {expected}] "
            f"(num_context_features={len(layer_ids)}, hidden_size={draft.hidden_size}), "
            f"but got shape=(1, {captured}). "
            "This usually means the target model is capturing a different number of layer "
            "features than the draft checkpoint/config expects."
        )
    return captured
