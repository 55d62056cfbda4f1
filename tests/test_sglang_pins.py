"""ddtree_deploy/rules/sglang_requires.json is each release's real Requires-Dist, and the
conflicts plan refuses are computed from it (0.5.17 pins flashinfer 0.6.15.post1 and
transformers 5.12.1 where 0.5.11 pinned 0.6.8.post1 and 5.6.0; it adds packages)."""

from __future__ import annotations

import json
import zipfile

import pytest
import wheelcache

from ddtree_deploy.rules.release_pins import DATA, conflicts, missing, release_requires

RECORDED = json.loads(DATA.read_text())


@pytest.mark.parametrize("version", sorted(RECORDED))
def test_the_recorded_requirements_are_the_wheels_own(version: str) -> None:
    wheel = wheelcache.wheel("sglang", version)
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(meta).decode().splitlines()
    own = [ln.split(":", 1)[1].strip() for ln in lines
           if ln.startswith("Requires-Dist:") and "extra ==" not in ln]
    assert RECORDED[version]["requires"] == own
    assert wheel.name in RECORDED[version]["source"]


def test_0517_conflicts_with_0511s_pins() -> None:
    pins = ["soundfile==0.13.1", "flashinfer-python==0.6.8.post1", "transformers==5.6.0",
            "xgrammar>=0.1.32,<0.2", "numpy", "torch==2.11.0"]
    found = {c.pin: c.release for c in conflicts("0.5.17", pins)}
    assert found == {"flashinfer-python==0.6.8.post1": "flashinfer_python[cu13]==0.6.15.post1",
                     "transformers==5.6.0": "transformers==5.12.1",
                     "xgrammar>=0.1.32,<0.2": "xgrammar==0.2.1"}
    assert conflicts("0.5.11", pins) == []
    assert conflicts("0.5.99", pins) == []  # not recorded: nothing said


def test_what_0517_adds_to_0511() -> None:
    added = missing("0.5.17", "0.5.11", {}, [])
    for name in ("helion", "tilelang", "numba", "xxhash", "zstandard"):
        assert name in added
    assert "torch" not in added and "transformers" not in added  # both releases require them
    assert "helion" not in missing("0.5.17", "0.5.11", {"helion": "1.4"}, [])
    assert "numba" not in missing("0.5.17", "0.5.11", {}, ["numba==0.65.1"])
    assert missing("0.5.17", "0.5.10", {}, []) == []  # 0.5.10 not recorded


def test_markers_are_evaluated_for_a_linux_x86_64_host() -> None:
    names = {r.name for r in release_requires("0.5.17") or []}
    assert "torchcodec" in names and "av" not in names and "decord2" not in names
