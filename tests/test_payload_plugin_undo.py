"""How the host undoes an install of the plugin cut short (remote/payload_plugin.py,
undo_plugin, as the next lock holder's `recover` and `plugin_undo` run it), in process on a
scratch venv folder: the module's Venv reads `sys.prefix` and sysconfig's purelib, which the
tests point at that folder (its site-packages laid out as pip lays out a wheel: the package
folder, its .dist-info with METADATA and a RECORD of sha256 digests).

* an upgrade that pip finished (the new .dist-info's RECORD whole) is kept when the CLI was
  killed before recording it: undoing it from the note would leave the package's files with no
  .dist-info owning them;
* an install that did not finish (no RECORD yet) is still undone;
* a note of the wrong shape is refused naming the note and how to clear it, never a TypeError;
* a noted folder whose parent is a symlink out of site-packages is not removed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import sys
import sysconfig
from pathlib import Path

import pytest

from ddtree_deploy.remote import payload_venv
from ddtree_deploy.remote.payload_fs import Refused
from ddtree_deploy.remote.payload_plugin import _absent, _version, dist_info, undo_plugin

DIST, PKG = "ddtree_sglang_plugin", "ddtree_sglang"


@pytest.fixture()
def venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> payload_venv.Venv:
    prefix = tmp_path / "venv"
    site = prefix / "lib/python3.11/site-packages"
    site.mkdir(parents=True)
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: {"purelib": str(site)})
    v = payload_venv.Venv("sglang", str(prefix))
    v.ensure_state_dir()
    return v


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=") \
        .decode()


def _wheel(version: str, extra: dict[str, str] | None = None) -> dict[str, bytes]:
    """rel -> bytes of the plugin's wheel at `version`, its RECORD last (as pip writes it)."""
    files = {f"{PKG}/__init__.py": f"VERSION = {version!r}\n",
             f"{PKG}/worker.py": "class Worker: ...\n", **(extra or {})}
    info = f"{DIST}-{version}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: ddtree-sglang-plugin\n" \
        f"Version: {version}\n"
    files[f"{info}/entry_points.txt"] = "[sglang.srt.plugins]\nddtree = ddtree_sglang:load\n"
    out = {rel: text.encode() for rel, text in files.items()}
    out[f"{info}/RECORD"] = "".join(f"{rel},{_digest(data)},{len(data)}\n"
                                    for rel, data in out.items()).encode() \
        + f"{info}/RECORD,,\n".encode()
    return out


def _write(site: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)


def _note(v: payload_venv.Venv, rels: list[str]) -> None:
    files, dirs = _absent(v.purelib, rels)
    v.note_pending({"form": "plugin", "files": {}, "adds": files, "dirs": dirs,
                    "staged": f"{DIST}-0.3.3-py3-none-any.whl"})


def test_a_finished_upgrade_is_kept_when_its_record_was_not_written(
        venv: payload_venv.Venv) -> None:
    site = Path(venv.purelib)
    _write(site, _wheel("0.3.2"))
    new = _wheel("0.3.3", {f"{PKG}/spec.py": "SPEC = 1\n"})
    _note(venv, sorted(new))
    # pip's upgrade: the old .dist-info uninstalled, every file of the new wheel written,
    # its RECORD last; then the CLI is killed before plugin_record
    shutil.rmtree(site / f"{DIST}-0.3.2.dist-info")
    _write(site, new)
    said = undo_plugin(venv, venv.pending())
    folder = dist_info(venv.purelib, "ddtree-sglang-plugin")
    assert folder is not None, "the plugin's files were left with no .dist-info owning them"
    assert _version(folder) == "0.3.3"
    assert {str(p.relative_to(site)) for p in site.rglob("*") if p.is_file()} == set(new)
    assert "finished" in said and venv.pending() is None


def test_an_install_that_did_not_finish_is_undone(venv: payload_venv.Venv) -> None:
    site = Path(venv.purelib)
    new = _wheel("0.3.3")
    _note(venv, sorted(new))
    _write(site, {rel: data for rel, data in new.items() if not rel.endswith("/RECORD")})
    said = undo_plugin(venv, venv.pending())
    assert list(site.iterdir()) == [] and "undone" in said and venv.pending() is None


@pytest.mark.parametrize("wrong", [{"dirs": 5}, {"dirs": {PKG: 1}}, {"adds": [PKG, 7]},
                                   {"staged": ["a.whl"]}],
                         ids=["dirs-int", "dirs-mapping", "adds-not-str", "staged-list"])
def test_a_note_of_the_wrong_shape_is_refused_naming_it(venv: payload_venv.Venv,
                                                       wrong: dict[str, object]) -> None:
    site = Path(venv.purelib)
    (site / PKG).mkdir()
    Path(venv.pending_path).write_text(json.dumps({"form": "plugin", **wrong}))
    with pytest.raises(Refused) as info:
        undo_plugin(venv, venv.pending())
    assert venv.pending_path in str(info.value) and "delete it" in str(info.value)
    assert (site / PKG).is_dir() and Path(venv.pending_path).exists()


def test_a_noted_folder_under_a_symlink_out_of_site_packages_stays(
        venv: payload_venv.Venv, tmp_path: Path) -> None:
    site = Path(venv.purelib)
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "sub/keep.txt").write_text("not the venv's\n")
    (site / PKG).symlink_to(outside)
    venv.note_pending({"form": "plugin", "files": {}, "adds": [], "dirs": [f"{PKG}/sub"],
                       "staged": f"{DIST}-0.3.3-py3-none-any.whl"})
    undo_plugin(venv, venv.pending())
    assert (outside / "sub/keep.txt").exists(), "a folder outside site-packages was removed"
