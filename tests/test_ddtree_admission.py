"""DDTREE's admission (payload/ddtree/admission.py): what is served, what is refused, and how.

Pure: the request's fields as a dict, as the server glue passes them. The fields of the real
release are checked against the rules and the contract in test_request_contract.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "payload"))
from ddtree import admission as adm

# What the OpenAI chat endpoint of 0.5.11 fills in for a plain request (serving_chat.py's
# GenerateReqInput(...) and its sampling dict), values as a client leaving them unset gets.
OPENAI_CHAT: dict[str, Any] = {
    "text": None, "input_ids": [1, 2, 3], "image_data": None, "video_data": None,
    "audio_data": None, "sampling_params": {
        "temperature": 0.7, "max_new_tokens": 16, "min_new_tokens": 0, "stop": [],
        "stop_token_ids": None, "stop_regex": None, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
        "regex": None, "ebnf": None, "n": 1, "no_stop_trim": False, "ignore_eos": False,
        "skip_special_tokens": True, "logit_bias": None, "custom_params": None,
        "sampling_seed": None, "json_schema": None, "structural_tag": None},
    "return_logprob": False, "logprob_start_len": -1, "top_logprobs_num": 0,
    "token_ids_logprob": None, "stream": True, "modalities": [], "lora_path": None,
    "bootstrap_host": None, "bootstrap_port": None, "bootstrap_room": None,
    "return_hidden_states": False, "rid": "abc", "extra_key": None, "require_reasoning": False,
    "priority": None, "routing_key": None, "custom_labels": None, "custom_logit_processor": None,
}  # fmt: skip


def test_a_plain_openai_request_with_neutral_penalties_passes() -> None:
    adm.check_request(OPENAI_CHAT)
    adm.check_request({"input_ids": [1], "sampling_params": None})
    adm.check_request({"text": ["a", "b"], "sampling_params": [{"top_k": 2}, {"top_p": 0.5}]})


@pytest.mark.parametrize(("name", "value"), [
    ("frequency_penalty", 1.5), ("presence_penalty", -0.1), ("repetition_penalty", 1.2),
    ("min_new_tokens", 3), ("logit_bias", {"5": 2.0}), ("logit_bias", {"5": "x"}),
    ("json_schema", "{}"), ("regex", "a+"), ("ebnf", "root ::= 'a'"), ("structural_tag", "{}"),
    ("frequency_penalty", "much"),
])
def test_a_sampling_parameter_that_changes_the_answer_is_refused_by_name(
        name: str, value: Any) -> None:
    fields = {**OPENAI_CHAT, "sampling_params": {**OPENAI_CHAT["sampling_params"], name: value}}
    with pytest.raises(adm.Refused) as info:
        adm.check_request(fields)
    assert isinstance(info.value, ValueError)  # SGLang's handlers answer a ValueError with 400
    text = str(info.value)
    assert text.startswith(f"DDTREE speculative decoding refuses {name}=") and "DFLASH" not in text
    assert info.value.parameter == name and info.value.value == value


HUGE = 10**400  # a JSON integer past float's range: float() raises OverflowError


@pytest.mark.parametrize("name", ["frequency_penalty", "presence_penalty", "repetition_penalty",
                                  "min_new_tokens", "logit_bias"])
@pytest.mark.parametrize("value", [HUGE, -HUGE], ids=["huge", "minus-huge"])
def test_an_integer_past_floats_range_is_refused_by_name_not_an_overflow(
        name: str, value: int) -> None:
    shown = {"5": value} if name == "logit_bias" else value
    with pytest.raises(adm.Refused, match=f"^DDTREE speculative decoding refuses {name}="):
        adm.check_sampling({name: shown})


@pytest.mark.parametrize(("name", "value"), [
    ("frequency_penalty", 0), ("presence_penalty", None), ("repetition_penalty", 1),
    ("min_new_tokens", None), ("logit_bias", {}), ("logit_bias", {"7": 0.0}),
    ("top_k", 2), ("top_p", 0.3), ("min_p", 0.2), ("sampling_seed", 7), ("stop", ["x"]),
    ("stop_token_ids", [5]), ("max_new_tokens", 1), ("n", 4), ("ignore_eos", True),
])
def test_neutral_values_and_the_always_served_parameters_pass(name: str, value: Any) -> None:
    adm.check_sampling({name: value})


@pytest.mark.parametrize(("name", "value"), [
    ("return_logprob", True), ("return_logprob", [False, True]), ("top_logprobs_num", 5),
    ("token_ids_logprob", [3]), ("custom_logit_processor", "{...}"), ("lora_path", "a"),
    ("image_data", "http://x/y.png"), ("input_embeds", [[0.1]]), ("session_params", {"id": 1}),
    ("return_hidden_states", True), ("return_entropy", True), ("bootstrap_room", 3),
])
def test_a_request_field_that_is_not_served_exactly_is_refused_when_set(
        name: str, value: Any) -> None:
    with pytest.raises(adm.Refused, match=f"^DDTREE speculative decoding refuses {name}="):
        adm.check_request({**OPENAI_CHAT, name: value})
    adm.check_request({**OPENAI_CHAT, name: None})  # unset passes


def test_unknown_fields_are_refused_unless_at_their_default() -> None:
    """Fail closed: a field of a newer release that the rules do not know."""
    with pytest.raises(adm.Refused, match="does not know"):
        adm.check_request({**OPENAI_CHAT, "new_field": 3}, {"new_field": None})
    with pytest.raises(adm.Refused, match="does not know"):
        adm.check_request({**OPENAI_CHAT, "new_flag": False}, {})  # no default known: refused
    adm.check_request({**OPENAI_CHAT, "new_field": None}, {"new_field": None})
    adm.check_request({**OPENAI_CHAT, "new_flag": True}, {"new_flag": True})
    with pytest.raises(adm.Refused, match="sampling_params.mirostat"):
        adm.check_sampling({"mirostat": 2})
    adm.check_sampling({"mirostat": None})
    with pytest.raises(adm.Refused, match="expected an object"):
        adm.check_request({"sampling_params": ["top_k"]})


def test_a_batch_is_refused_for_any_one_of_its_requests() -> None:
    with pytest.raises(adm.Refused, match="refuses presence_penalty=0.5"):
        adm.check_request({"text": ["a", "b"], "sampling_params": [
            {"presence_penalty": 0.0}, {"presence_penalty": 0.5}]})


def test_a_long_value_is_cut_in_the_message() -> None:
    with pytest.raises(adm.Refused) as info:
        adm.check_request({"custom_logit_processor": "x" * 500})
    assert "x" * 70 in str(info.value) and "x" * 100 not in str(info.value)


def test_sliding_window_targets_are_refused_by_the_applied_window_in_full_tree_mode() -> None:
    why = adm.check_target("gpt-oss-20b", 127, shadow_linear=False)
    assert why is not None and "gpt-oss-20b" in why and "sliding window of 127" in why
    assert why.startswith("DDTREE ")
    assert adm.check_target("gpt-oss-20b", 127, shadow_linear=True) is None  # slot = depth
    assert adm.check_target("Qwen3-8B", None, shadow_linear=False) is None
