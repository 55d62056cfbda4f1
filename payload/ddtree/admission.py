"""What DDTREE serves exactly and what it refuses, decided before any token (pure, no sglang).

A speculative decoder must give the tokens (greedy) or the distribution (sampled) the target gives
alone, or refuse the request; it must never quietly change the answer. This module is the one
place that decides, for every field of SGLang's ``GenerateReqInput`` and ``SamplingParams``:

* ``SERVED``: exact whatever the value (temperature, top-k/top-p/min-p per row, stop strings and
  ids, max_new_tokens, n, ignore_eos, a sampling seed, bookkeeping fields);
* ``NEUTRAL``: exact at its neutral value, refused at any other (penalties, min_new_tokens,
  logit_bias): DDTREE does not penalise a tree node by its own path, so a value that changes
  the output is refused rather than ignored. OpenAI clients send ``frequency_penalty: 0``: passes;
* ``OFF``: refused when set at all (grammar constraints, logprobs, a custom logit processor,
  LoRA, multimodal inputs, hidden states, sessions, disaggregation), as untested under DDTREE.

A field this module does not know is refused when its value differs from the dataclass default
(fail closed): a new SGLang release's field is never served by accident. The server glue (the
0.5.11 patches, the 0.5.17+ plugin) calls :func:`check_request` with the request's fields and
their defaults, and turns :class:`Refused` (a ``ValueError``: SGLang's handlers answer it with
HTTP 400) into the response, before the request reaches the scheduler. The contract, one row per
field and release: docs/request-parameters.md. Target checks at server start:
:func:`check_target`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["NEUTRAL", "OFF", "REQUEST_RULES", "SAMPLING_RULES", "SERVED", "Refused", "Rule",
           "check_request", "check_sampling", "check_target"]

ALGORITHM = "DDTREE"
SERVED, NEUTRAL, OFF = "served", "neutral", "refused when set"


class Refused(ValueError):
    """A request DDTREE would serve differently from plain decoding; the message names the
    parameter and DDTREE. ``parameter`` and ``value`` are kept for the caller."""

    def __init__(self, parameter: str, value: Any, why: str) -> None:
        self.parameter, self.value = parameter, value
        try:
            shown = repr(value)
        except RecursionError:
            shown = f"<a {type(value).__name__} nested too deep to show>"
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        super().__init__(
            f"{ALGORITHM} speculative decoding refuses {parameter}={shown}: {why} "
            f"(docs/request-parameters.md). Send it to a server without speculative decoding, "
            f"or leave {parameter} at its default.")


def _off(value: Any) -> bool:
    """Unset: None, False, 0, empty, or a batch list of such (nested to any depth: walked
    without recursion, so a deeply nested value is decided, never a RecursionError)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if item is None or item is False or (not isinstance(item, bool) and _zero(item)):
            continue
        if isinstance(item, (list, tuple, dict, str)) and len(item) == 0:
            continue
        if isinstance(item, (list, tuple)):
            pending.extend(item)
            continue
        return False
    return True


def _zero(value: Any) -> bool:
    try:
        return bool(value == 0)
    except (TypeError, ValueError, RecursionError):
        return False  # a value that does not compare is not neutral


def _equals(neutral: float) -> Callable[[Any], bool]:
    def ok(value: Any) -> bool:
        if value is None:
            return True  # SamplingParams reads None as the default (the neutral value)
        try:
            return float(value) == neutral
        except (OverflowError, TypeError, ValueError):
            return False  # SGLang itself refuses it (or an int past float): not neutral

    return ok


def _zero_bias(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, Mapping):
        return False
    try:
        return all(float(v) == 0.0 for v in value.values())
    except (OverflowError, TypeError, ValueError):
        return False


@dataclass(frozen=True)
class Rule:
    """How DDTREE treats one field: ``kind`` (SERVED, NEUTRAL, OFF), ``neutral`` (what passes,
    in words, for NEUTRAL), ``why`` (the reason, for the refusal and the contract)."""

    kind: str
    why: str
    neutral: str = ""
    passes: Callable[[Any], bool] | None = None

    def allows(self, value: Any) -> bool:
        if self.kind == SERVED:
            return True
        if self.kind == OFF:
            return _off(value)
        assert self.passes is not None
        return self.passes(value)


def _served(why: str) -> Rule:
    return Rule(SERVED, why)


def _refused(why: str) -> Rule:
    return Rule(OFF, why)


_NO_PATH_PENALTY = ("DDTREE does not penalise each tree node by its own path's tokens, so a "
                    "non-neutral value would be served differently")
_GRAMMAR = "the tree's verify applies no grammar mask (grammar-constrained decoding unsupported)"
_LOGPROB = "the tree's verify returns no logprobs"
_UNTESTED = "not verified exact under DDTREE"
_BOOK = "bookkeeping or routing: the tokens do not depend on it"
_EXACT_STOP = "checked after every committed token, as without speculation"

SAMPLING_RULES: dict[str, Rule] = {
    "max_new_tokens": _served(_EXACT_STOP),
    "stop": _served(_EXACT_STOP),
    "stop_token_ids": _served(_EXACT_STOP),
    "stop_regex": _served(_EXACT_STOP),
    "ignore_eos": _served(_EXACT_STOP),
    "temperature": _served("each tree slot samples the target with the row's own filters"),
    "top_p": _served("per row, on the full distribution, as SGLang's sampler"),
    "top_k": _served("per row, whatever the batch-mates ask"),
    "min_p": _served("per row, against the row's largest kept probability"),
    "n": _served("each copy is its own request"),
    "sampling_seed": _served(
        "the target's distribution; SGLang reads the seed only with "
        "--enable-deterministic-inference, which DDTREE refuses at start"),  # ddtree_args
    "skip_special_tokens": _served("detokenization only"),
    "spaces_between_special_tokens": _served("detokenization only"),
    "no_stop_trim": _served("detokenization only"),
    "stream_interval": _served("how often chunks are sent; the tokens are the same"),
    "custom_params": _served("read only by a custom logit processor, which is refused"),
    "frequency_penalty": Rule(NEUTRAL, _NO_PATH_PENALTY, "0", _equals(0.0)),
    "presence_penalty": Rule(NEUTRAL, _NO_PATH_PENALTY, "0", _equals(0.0)),
    "repetition_penalty": Rule(NEUTRAL, _NO_PATH_PENALTY, "1", _equals(1.0)),
    "min_new_tokens": Rule(
        NEUTRAL, "DDTREE does not hold back EOS and stop ids per tree node", "0", _equals(0.0)),
    "logit_bias": Rule(NEUTRAL, "DDTREE does not bias the verify logits per request row",
                       "empty or all zero", _zero_bias),
    "json_schema": _refused(_GRAMMAR),
    "regex": _refused(_GRAMMAR),
    "ebnf": _refused(_GRAMMAR),
    "structural_tag": _refused(_GRAMMAR),
    # 0.5.17+: SamplingParams is a msgspec Struct; these are filled by its own normalisation
    "stop_strs": _served("the normalised stop strings (" + _EXACT_STOP + ")"),
    "stop_str_max_len": _served("the normalised stop strings (" + _EXACT_STOP + ")"),
    "stop_regex_strs": _served("the normalised stop regexes (" + _EXACT_STOP + ")"),
    "stop_regex_max_len": _served("the normalised stop regexes (" + _EXACT_STOP + ")"),
    "is_normalized": _served("SGLang's own normalisation flag"),
    # 0.5.23
    "ebnf_full_assistant": _refused(_GRAMMAR),
    "beam_width": _refused("beam search keeps several hypotheses per request; DDTREE verifies "
                           "one"),
    "watermark": _refused("a watermark biases the verify logits; " + _UNTESTED),
}

REQUEST_RULES: dict[str, Rule] = {
    "text": _served("the prompt"),
    "input_ids": _served("the prompt"),
    "sampling_params": _served("each parameter has its own row"),
    "stream": _served("the same tokens, streamed or not"),
    "rid": _served(_BOOK),
    "http_worker_ipc": _served(_BOOK),
    "log_metrics": _served(_BOOK),
    "return_text_in_logprobs": _served("read only with return_logprob, which is refused"),
    "logprob_start_len": _served("read only with return_logprob, which is refused"),
    "routed_experts_start_len": _served("read only with return_routed_experts, refused"),
    "modalities": _served("read only with multimodal data, which is refused"),
    "max_dynamic_patch": _served("read only with multimodal data, which is refused"),
    "min_dynamic_patch": _served("read only with multimodal data, which is refused"),
    "image_max_dynamic_patch": _served("read only with multimodal data, which is refused"),
    "video_max_dynamic_patch": _served("read only with multimodal data, which is refused"),
    "require_reasoning": _served("reasoning_tokens counted from the committed tokens, as "
                                 "without speculation"),
    "routed_dp_rank": _served(_BOOK),
    "disagg_prefill_dp_rank": _served(_BOOK),
    "data_parallel_rank": _served(_BOOK),
    "background": _served(_BOOK),
    "conversation_id": _served(_BOOK),
    "priority": _served(_BOOK),
    "extra_key": _served(_BOOK),
    "routing_key": _served(_BOOK),
    "no_logs": _served(_BOOK),
    "custom_labels": _served(_BOOK),
    "return_bytes": _served(_BOOK),
    "external_trace_header": _served(_BOOK),
    "received_time": _served(_BOOK),
    "return_logprob": _refused(_LOGPROB),
    "top_logprobs_num": _refused(_LOGPROB),
    "token_ids_logprob": _refused(_LOGPROB),
    "return_entropy": _refused("the entropy of the sampled distribution is not computed on "
                               "DDTREE's verify path"),
    "return_hidden_states": _refused("the verify block's hidden states are not a plain "
                                     "decode's"),
    "return_routed_experts": _refused(_UNTESTED),
    "custom_logit_processor": _refused(
        "a custom logit processor would see one parameter set for a request's many tree rows"),
    "input_embeds": _refused("the drafter needs token ids"),
    "positional_embed_overrides": _refused(_UNTESTED),
    "image_data": _refused(_UNTESTED),
    "video_data": _refused(_UNTESTED),
    "audio_data": _refused(_UNTESTED),
    "use_audio_in_video": _refused(_UNTESTED),
    "need_wait_for_mm_inputs": _refused(_UNTESTED),
    "num_items_assigned": _refused(_UNTESTED),
    "multi_item_delimiter_indices": _refused(_UNTESTED),
    "session_params": _refused(_UNTESTED),
    "lora_path": _refused("the drafter was not trained with the adapter; untested"),
    "lora_id": _refused("the drafter was not trained with the adapter; untested"),
    "bootstrap_host": _refused(_UNTESTED + " (prefill-decode disaggregation)"),
    "bootstrap_port": _refused(_UNTESTED + " (prefill-decode disaggregation)"),
    "bootstrap_room": _refused(_UNTESTED + " (prefill-decode disaggregation)"),
    "bootstrap_pair_key": _refused(_UNTESTED + " (prefill-decode disaggregation)"),
    "decode_tp_size": _refused(_UNTESTED + " (prefill-decode disaggregation)"),
    # 0.5.17+
    "session_id": _served(_BOOK + " (it does not alter the prompt)"),
    "return_prompt_token_ids": _served("echoes the prompt's ids"),
    "max_thinking_tokens": _refused("ends the reasoning by a forced token; " + _UNTESTED),
    "return_sampling_mask": _refused("the sampler's mask is not a plain decode's under DDTREE"),
    "return_flat_raw_top_logprobs": _refused(_LOGPROB),
    "return_flat_raw_top_logprobs_b64": _refused(_LOGPROB),
    "return_indexer_topk": _refused(_UNTESTED),
    "mm_hashes": _refused(_UNTESTED),
    "mm_data_mooncake": _refused(_UNTESTED),
    "encoder_urls": _refused(_UNTESTED),
    "images_config": _refused(_UNTESTED),
    # 0.5.23
    "cache_salt": _served(_BOOK + " (a prefix-cache key)"),
    "return_flat_raw_output_top_logprobs": _refused(_LOGPROB),
    "sampling_logprobs_mode": _refused(_LOGPROB),
    "watermark": _refused("a watermark biases the verify logits; " + _UNTESTED),
    "kv_hints": _refused(_UNTESTED),
    "mm_content_hashes": _refused(_UNTESTED),
    "mm_processor_kwargs": _refused(_UNTESTED),
    "video_config": _refused(_UNTESTED),
    "token_indices_to_pool": _refused(_UNTESTED),
}

_UNKNOWN = "a field DDTREE does not know (fail closed: it may change the answer)"


def check_sampling(params: Mapping[str, Any] | None) -> None:
    """Raise :class:`Refused` for the first sampling parameter DDTREE would serve differently.
    ``params``: the request's sampling_params as sent (keys the client gave)."""
    for name, value in (params or {}).items():
        rule = SAMPLING_RULES.get(name)
        if rule is None:
            if value is not None:
                raise Refused(f"sampling_params.{name}", value, _UNKNOWN)
            continue
        if not rule.allows(value):
            why = rule.why if rule.kind != NEUTRAL else f"only {rule.neutral} is served: {rule.why}"
            raise Refused(name, value, why)


def check_request(fields: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`Refused` for the first field of a ``GenerateReqInput`` DDTREE would serve
    differently. ``fields``: name -> value (every field of the dataclass); ``defaults``: name ->
    the dataclass default, for fields this module does not know (refused when they differ)."""
    defaults = defaults or {}
    for name, value in fields.items():
        rule = REQUEST_RULES.get(name)
        if rule is None:
            if value != defaults.get(name):
                raise Refused(name, value, _UNKNOWN)
            continue
        if not rule.allows(value):
            raise Refused(name, value, rule.why)
    sampling = fields.get("sampling_params")
    for params in sampling if isinstance(sampling, (list, tuple)) else [sampling]:
        if params is not None and not isinstance(params, Mapping):
            raise Refused("sampling_params", params, "expected an object (or a list of them)")
        check_sampling(params)


def check_target(model: str, sliding_window: int | None, *, shadow_linear: bool) -> str | None:
    """Why DDTREE cannot serve this target at start, or None.

    ``sliding_window``: the window SGLang's attention applies (``ModelRunner.sliding_window_size``,
    from the model's ``get_attention_sliding_window_size`` or a hybrid-SWA config), never a
    config.json ``sliding_window`` key (Qwen2.5/Qwen3 carry one, unused). SGLang's kernels place a
    verify query by its slot for the window check, not by its depth in the tree, so a node whose
    slot is past its depth would lose window tokens: refused in full-tree mode. The chain of
    shadow-linear mode has slot = depth and is served."""
    if sliding_window is None or shadow_linear:
        return None
    return (f"{ALGORITHM} full-tree verification does not support {model}: its attention uses a "
            f"sliding window of {sliding_window} tokens, which SGLang applies by a query's slot "
            f"in the verify block, not by its depth in the tree (wrong tokens once a context "
            f"exceeds the window). Use --speculative-ddtree-shadow-linear, "
            f"--speculative-algorithm DFLASH, or no speculative decoding.")
