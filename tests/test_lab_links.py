"""Shaping a lab link both ways (tc tbf), on a namespace and veth pair of the test's own."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from ddtree_deploy.errors import UsageError
from ddtree_lab import netns


@pytest.fixture()
def pair() -> Iterator[tuple[str, str]]:
    if os.geteuid() != 0 or shutil.which("tc") is None:
        pytest.skip("needs root and tc")
    ns, veth = f"ddtt-{os.getpid()}", f"ddtt{os.getpid()}"[:15]  # not the lab's ddtl- prefix
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "link", "add", veth, "type", "veth", "peer", "name", netns.PEER,
                        "netns", ns], check=True)
        yield ns, veth
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
        subprocess.run(["ip", "link", "del", veth], check=False, capture_output=True)


def test_shape_both_ends_then_reshape_then_unshape(pair: tuple[str, str]) -> None:
    ns, veth = pair
    assert netns.shaped_rate(None, veth) is None
    netns.shape(ns, veth, "1gbit")
    assert netns.shaped_rate(None, veth) == "1Gbit"
    assert netns.shaped_rate(ns, netns.PEER) == "1Gbit"
    netns.shape(ns, veth, "500mbit")  # a second shaping replaces the first
    assert netns.shaped_rate(None, veth) == netns.shaped_rate(ns, netns.PEER) == "500Mbit"
    netns.unshape(ns, veth)
    assert netns.shaped_rate(None, veth) is None and netns.shaped_rate(ns, netns.PEER) is None
    netns.unshape(ns, veth)  # unshaped already: nothing to do, no error


@pytest.mark.parametrize("rate", ["1gbit", "500Mbit", "100mbps", "2.5gbit"])
def test_rates_accepted(rate: str) -> None:
    assert netns.check_rate(rate) == rate.lower()


@pytest.mark.parametrize("rate", ["", "1", "fast", "1 gbit", "0gbit", "1gbit; reboot", "-1mbit"])
def test_rates_refused_with_what_was_expected(rate: str) -> None:
    with pytest.raises(UsageError) as info:
        netns.check_rate(rate)
    assert "--link-rate" in info.value.message and "1gbit" in info.value.message
