"""The plugin's server-args resolution and request admission, in this process.

SGLang's own DFLASH resolution (``compat.handle_dflash``) and its resolved view are replaced by
stand-ins here (the real ones run against SGLang 0.5.17's ServerArgs in the GPU rehearsal);
what is checked is the plugin's own part: the refusals with the flag to change, and the widths
it sets. Admission runs the shared rules (``payload/ddtree/admission.py``) through the hook the
plugin registers on ``TokenizerManager.generate_request``.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "payload" / "plugin"))
sys.path.insert(0, str(ROOT / "payload"))

from ddtree_sglang import compat, spec  # noqa: E402
from ddtree_sglang.admission_hook import make_hook, request_fields  # noqa: E402
from ddtree_sglang.settings import Settings  # noqa: E402


def args(**over: Any) -> types.SimpleNamespace:
    base = dict(speculative_num_draft_tokens=8, speculative_dflash_block_size=None,
                speculative_draft_window_size=None, page_size=1, disable_overlap_schedule=True,
                speculative_accept_threshold_single=1.0, speculative_accept_threshold_acc=1.0,
                attention_backend="triton", prefill_attention_backend=None,
                decode_attention_backend=None)
    return types.SimpleNamespace(**{**base, **over})


@pytest.fixture(autouse=True)
def no_sglang(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    seen: list[Any] = []
    monkeypatch.setattr(compat, "handle_dflash", seen.append)
    monkeypatch.setattr(compat, "resolved", lambda a: a)
    return seen


def test_full_tree_widths(no_sglang: list[Any]) -> None:
    a = args()
    spec.resolve_server_args(a, Settings(15, 8, False))
    assert no_sglang == [a]  # DFLASH's own resolution ran first
    assert a.speculative_num_draft_tokens == 16 and a.speculative_dflash_block_size == 8


def test_shadow_linear_verifies_the_block_on_any_backend() -> None:
    a = args(attention_backend="fa3")
    spec.resolve_server_args(a, Settings(15, 8, True))
    assert a.speculative_num_draft_tokens == 8 and a.speculative_dflash_block_size == 8


@pytest.mark.parametrize(("over", "settings", "message"), [
    ({"page_size": 16}, Settings(15, 8, False), "needs --page-size 1"),
    ({"disable_overlap_schedule": False}, Settings(15, 8, False), "--disable-overlap-schedule"),
    ({"attention_backend": "fa3"}, Settings(15, 8, False), "--attention-backend triton"),
    ({"attention_backend": None}, Settings(15, 8, False), "got none named"),
    ({"decode_attention_backend": "flashinfer"}, Settings(15, 8, False),
     "decode_attention_backend=flashinfer"),
    ({"speculative_accept_threshold_acc": 0.5}, Settings(15, 8, False),
     "--speculative-accept-threshold-acc"),
    ({"speculative_draft_window_size": 64}, Settings(15, 8, False),
     "--speculative-draft-window-size"),
    ({}, Settings(3, 3, False), "SGLANG_DDTREE_BUDGET=3 is too small .* SGLANG_DDTREE_BUDGET=7"),
    ({"speculative_num_draft_tokens": 1}, Settings(15, 8, False), "at least 2 tokens"),
])
def test_refusals_name_what_to_change(over: dict[str, Any], settings: Settings,
                                      message: str) -> None:
    with pytest.raises(ValueError, match=message):
        spec.resolve_server_args(args(**over), settings)


@dataclasses.dataclass
class GenerateReqInput:  # the name the hook looks for; the fields of a request
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] | None = None
    return_logprob: bool = False
    stream: bool = False
    new_field_of_a_later_release: int = 0


def manager(algorithm: str | None) -> types.SimpleNamespace:
    return types.SimpleNamespace(server_args=types.SimpleNamespace(speculative_algorithm=algorithm))


def test_admission_refuses_what_ddtree_would_serve_differently() -> None:
    hook = make_hook("DDTREE")
    hook(manager("DDTREE"), GenerateReqInput([1, 2], {"temperature": 0.7, "top_p": 0.9}))
    with pytest.raises(ValueError, match="return_logprob"):
        hook(manager("DDTREE"), GenerateReqInput([1], return_logprob=True))
    with pytest.raises(ValueError, match="frequency_penalty"):
        hook(manager("DDTREE"), GenerateReqInput([1], {"frequency_penalty": 0.5}))
    with pytest.raises(ValueError, match="new_field_of_a_later_release"):  # fail closed
        hook(manager("DDTREE"), GenerateReqInput([1], new_field_of_a_later_release=3))


def test_admission_leaves_other_algorithms_alone() -> None:
    hook = make_hook("DDTREE")
    for algorithm in (None, "DFLASH", "DDTREE_PLUGIN"):
        hook(manager(algorithm), GenerateReqInput([1], return_logprob=True))
    assert make_hook("DDTREE_PLUGIN")(manager("ddtree_plugin"),
                                       GenerateReqInput([1])) is None


def test_request_fields_gives_defaults() -> None:
    fields, defaults = request_fields(GenerateReqInput([1], stream=True))
    assert fields["stream"] is True and defaults["stream"] is False
    assert defaults["new_field_of_a_later_release"] == 0
