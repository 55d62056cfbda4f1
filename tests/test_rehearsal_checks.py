"""The GPU rehearsal's sampling law follows SGLang 0.5.11's own filters (layers/sampler.py,
pytorch backend): top-k by rank, then top-p over the mass of the whole sorted distribution
before each token (not renormalised after the top-k), then min-p against the top token."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from rehearsal.checks import filtered_probs  # noqa: E402


def _row(*values: float):
    return torch.tensor([list(values)])


def test_top_p_keeps_a_token_while_the_mass_before_it_is_within_top_p() -> None:
    got = filtered_probs(_row(0.5, 0.2, 0.2, 0.1), top_p=0.7)
    # mass before: 0, 0.5, 0.7, 0.9 -> the first three stay (0.7 <= 0.7), renormalised
    assert torch.allclose(got, _row(0.5, 0.2, 0.2, 0.0) / 0.9)


def test_top_p_after_top_k_sums_the_whole_distribution() -> None:
    probs = _row(0.4, 0.3, 0.2, 0.1)
    got = filtered_probs(probs, top_k=2, top_p=0.5)
    # SGLang: mass before the 2nd token is 0.4 <= 0.5: both survive the top-k and the top-p.
    # Renormalising the top-k survivors first (0.571, 0.429) would drop the 2nd (0.571 > 0.5).
    assert torch.allclose(got, _row(0.4, 0.3, 0.0, 0.0) / 0.7)


def test_min_p_is_relative_to_the_top_token_and_order_is_restored() -> None:
    got = filtered_probs(_row(0.1, 0.6, 0.25, 0.05), min_p=0.2)  # threshold 0.12
    assert torch.allclose(got, _row(0.0, 0.6, 0.25, 0.0) / 0.85)


def test_no_filter_is_the_distribution_itself() -> None:
    probs = torch.softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(1)), -1)
    assert torch.allclose(filtered_probs(probs), probs)
