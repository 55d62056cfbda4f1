"""The DDTree plugin's wheel, its settings and its pure parts (in this process).

The wheel is built twice from the checkout and compared byte for byte; its entry point, its
shared core (payload/ddtree/ as it is) and its verify round (the 0.5.11 set's, one import
re-pointed) are read back. The settings come from the environment variables agreed with the
tool (ddtree_deploy/settings/command.py: PLUGIN_ENV); the KV re-link order is checked on trees.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import sys
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "payload" / "plugin"))

from ddtree_sglang import __version__, releases, settings  # noqa: E402

_spec = importlib.util.spec_from_file_location("ddtree_plugin_build",
                                               ROOT / "payload" / "plugin" / "build.py")
assert _spec is not None and _spec.loader is not None
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)
from ddtree_sglang.relink import path_first_order  # noqa: E402

from ddtree_deploy.settings.command import PLUGIN_ENV  # noqa: E402


def test_the_wheel_is_reproducible_and_holds_what_it_says(tmp_path: Path) -> None:
    first = build.build_wheel(tmp_path / "a")
    second = build.build_wheel(tmp_path / "b")
    assert first.name == f"ddtree_sglang_plugin-{__version__}-py3-none-any.whl"
    assert first.read_bytes() == second.read_bytes()
    with zipfile.ZipFile(first) as zf:
        names = set(zf.namelist())
        info = f"ddtree_sglang_plugin-{__version__}.dist-info"
        assert zf.read(f"{info}/entry_points.txt").decode() == (
            "[sglang.srt.plugins]\nddtree = ddtree_sglang.plugin:load\n")
        for core in (ROOT / "payload" / "ddtree").glob("*.py"):
            assert zf.read(f"ddtree/{core.name}") == core.read_bytes()
        verify = zf.read("ddtree_sglang/verify.py").decode()
        assert "from ddtree.core import" in verify and "sglang" not in verify
        record = zf.read(f"{info}/RECORD").decode().splitlines()
        listed = {line.split(",")[0] for line in record}
        assert listed == names
        for line in record:
            name, digest, size = line.split(",")
            if digest:
                data = zf.read(name)
                assert int(size) == len(data)

                want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                assert digest == "sha256=" + want.decode()


def test_a_verify_module_with_another_sglang_import_is_refused(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    fake = tmp_path / "ddtree_verify.py"
    fake.write_text(build.VERIFY_SOURCE.read_text() + "\nfrom sglang.srt import utils\n")
    monkeypatch.setattr(build, "VERIFY_SOURCE", fake)
    with pytest.raises(build.BuildError, match="exactly one sglang import"):
        build.build_wheel(tmp_path / "out")


def test_the_settings_names_are_the_tools() -> None:
    assert PLUGIN_ENV == {"budget": settings.BUDGET, "topk": settings.TOPK,
                          "shadow_linear": settings.SHADOW_LINEAR}


def test_settings_from_the_environment() -> None:
    assert settings.from_env({}) == settings.Settings(32, 32, False)
    got = settings.from_env({"SGLANG_DDTREE_BUDGET": "15", "SGLANG_DDTREE_TOPK": "8",
                             "SGLANG_DDTREE_SHADOW_LINEAR": "1"})
    assert got == settings.Settings(15, 8, True) and got.mode == "shadow-linear"
    assert settings.from_env({"SGLANG_DDTREE_BUDGET": "63"}).topk == 63


def test_the_proven_verify_paths_are_on_unless_switched_off() -> None:
    # plugin 0.3.4: both proven lossless on a GPU (session 8, call 1): unset is on, 0 the A/B
    for field, name in (("tree_attention", "SGLANG_DDTREE_TREE_ATTENTION"),
                        ("verify_graph", "SGLANG_DDTREE_VERIFY_GRAPH")):
        default = getattr(settings.from_env({}), field)
        assert default.on and not default.explicit
        assert default.why == f"default; {name}=0 turns it off"
        assert getattr(settings.from_env({name: ""}), field) == default
        on = getattr(settings.from_env({name: " 1"}), field)
        assert on.on and on.explicit and on.why == f"{name}=1"
        off = getattr(settings.from_env({name: "0"}), field)
        assert not off.on and off.explicit and off.why == f"{name}=0"


@pytest.mark.parametrize(("env", "message"), [
    ({"SGLANG_DDTREE_BUDGET": "many"}, "SGLANG_DDTREE_BUDGET must be an integer"),
    ({"SGLANG_DDTREE_BUDGET": "0"}, "SGLANG_DDTREE_BUDGET must be between 1 and 1024, got 0"),
    ({"SGLANG_DDTREE_TOPK": "2000"}, "SGLANG_DDTREE_TOPK must be between 1 and 1024"),
    ({"SGLANG_DDTREE_SHADOW_LINEAR": "maybe"}, "SGLANG_DDTREE_SHADOW_LINEAR must be 1 or 0"),
    ({"SGLANG_DDTREE_TREE_ATTENTION": "yes"},
     "SGLANG_DDTREE_TREE_ATTENTION must be 1 \\(on, the default\\) or 0 \\(off\\), got 'yes'"),
    ({"SGLANG_DDTREE_VERIFY_GRAPH": "2"},
     "SGLANG_DDTREE_VERIFY_GRAPH must be 1 \\(on, the default\\) or 0"),
    ({"SGLANG_DDTREE_VERIFY_GRAPH": "true"}, "SGLANG_DDTREE_VERIFY_GRAPH must be 1"),
])
def test_bad_settings_are_refused_naming_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        settings.from_env(env)


def test_releases_say_what_is_served_and_why_not() -> None:
    assert releases.refusal("0.5.17") is None
    why = releases.refusal("0.5.20")
    assert why is not None and "0.5.20 is not supported" in why and "not in the tested" in why
    assert all(v in why for v in releases.SUPPORTED)
    assert "not a release the plugin knows" in (releases.refusal("0.5.11") or "")
    assert not set(releases.SUPPORTED) & set(releases.REFUSED)


def test_path_first_order() -> None:
    keep = torch.tensor([[0, 3, 7, -1], [0, 1, 2, 3], [0, -1, -1, -1], [0, 5, 2, 6]])
    accepted = torch.tensor([2, 1, 0, 3])
    got = path_first_order(keep, accepted, 8).tolist()
    assert got[0] == [0, 3, 7, 1, 2, 4, 5, 6]  # the path (root, 3, 7) first, then the rest
    assert got[1] == [0, 1, 2, 3, 4, 5, 6, 7]  # a path along the first slots moves nothing
    assert got[2] == [0, 1, 2, 3, 4, 5, 6, 7]  # nothing accepted: the root alone
    assert got[3] == [0, 5, 2, 6, 1, 3, 4, 7]  # path order, not slot order
    for row in got:
        assert sorted(row) == list(range(8))  # a permutation: no slot lost or doubled


def test_a_build_does_not_share_its_temporary_with_another(tmp_path: Path) -> None:
    # Two processes building into the tool's one cache folder at once (seen in CI: the second
    # renamed the first's `.whl.part` away): each build writes under a name of its own. Another
    # build's in-flight temporary at the old shared name is left alone, and none is left behind.
    out = tmp_path / "cache"
    out.mkdir()
    other = out / f"ddtree_sglang_plugin-{__version__}-py3-none-any.whl.part"
    other.mkdir()  # held by "another build": a name this build must not write to
    wheel = build.build_wheel(out)
    assert zipfile.ZipFile(wheel).testzip() is None
    assert wheel.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in out.iterdir()) == sorted([wheel.name, other.name])
