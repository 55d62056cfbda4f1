"""The probe's memo on the host: a result is reused only while every file it came from is
unchanged, and the whole probe gives the same facts from its memo as without it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from probe_venvs import (
    ddtree_spec_text,
    have_gcc,
    make_venv,
    real_packages,
    real_spec_text,
    sglang_tree,
    shared_object,
    torch_cu130,
)

from ddtree_deploy.facts.model import Facts
from ddtree_deploy.remote.facts_memo import MEMO_VERSION, Memo


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def read(self, path: Path) -> str:
        self.calls += 1
        return path.read_text()


def test_reused_until_the_file_changes_even_with_size_and_mtime_put_back(tmp_path: Path) -> None:
    memo_file, data = tmp_path / "memo.json", tmp_path / "a.txt"
    data.write_text("one")
    count = Counter()

    def derive() -> Any:
        memo = Memo(str(memo_file))
        value = memo.derive("k", str(data), [str(data)], count.read, data)
        memo.save()
        return value

    assert derive() == "one" and count.calls == 1
    assert derive() == "one" and count.calls == 1  # from the memo: not read again
    st = data.stat()
    data.write_text("two")  # same size; mtime put back as a careless copy would
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert derive() == "two" and count.calls == 2  # ctime (and so the signature) moved
    data.unlink()
    with pytest.raises(FileNotFoundError):
        derive()


def test_a_file_that_appears_invalidates_a_tracked_result(tmp_path: Path) -> None:
    memo_file, present, later = tmp_path / "memo.json", tmp_path / "a.py", tmp_path / "b.py"
    present.write_text("x = 1\n")
    calls: list[int] = []

    def scan(track: Any) -> list[str]:
        calls.append(1)
        names = []
        for path in (present, later):
            track(str(path))
            if path.exists():
                names.append(path.name)
        return names

    def derive() -> Any:
        memo = Memo(str(memo_file))
        value = memo.derive_tracked("names", "k", scan)
        memo.save()
        return value, memo.hits

    assert derive() == (["a.py"], 0)
    assert derive() == (["a.py"], 1) and len(calls) == 1
    later.write_text("y = 2\n")
    assert derive() == (["a.py", "b.py"], 0) and len(calls) == 2


def test_keep_false_uses_the_value_but_does_not_remember_it(tmp_path: Path) -> None:
    memo_file, data = tmp_path / "memo.json", tmp_path / "a.txt"
    data.write_text("x")
    for _ in range(2):
        memo = Memo(str(memo_file))
        assert memo.derive("k", "a", [str(data)], lambda: {"error": "timeout"},
                           keep=lambda v: "error" not in v) == {"error": "timeout"}
        memo.save()
        assert (memo.hits, memo.misses) == (0, 1)


def test_only_the_entries_a_run_used_are_kept(tmp_path: Path) -> None:
    memo_file = tmp_path / "memo.json"
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("a")
    b.write_text("b")
    first = Memo(str(memo_file))
    first.derive("k", "a", [str(a)], a.read_text)
    first.derive("k", "b", [str(b)], b.read_text)
    first.save()
    second = Memo(str(memo_file))
    second.derive("k", "a", [str(a)], a.read_text)
    second.save()
    entries = json.loads(memo_file.read_text())["entries"]
    assert [k.split("\0")[1] for k in entries] == ["a"]
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "memo.json"]  # no temporary left behind


@pytest.mark.parametrize("content", ["{not json", json.dumps({"version": MEMO_VERSION + 1,
                                                             "entries": {"k\0a": {}}})])
def test_an_unreadable_or_foreign_memo_starts_empty(tmp_path: Path, content: str) -> None:
    memo_file, data = tmp_path / "memo.json", tmp_path / "a"
    memo_file.write_text(content)
    data.write_text("fresh")
    memo = Memo(str(memo_file))
    assert memo.derive("k", "a", [str(data)], data.read_text) == "fresh" and memo.misses == 1
    memo.save()
    assert json.loads(memo_file.read_text())["version"] == MEMO_VERSION


def test_a_memo_that_cannot_be_written_is_reported_not_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    memo = Memo(str(blocker / "sub" / "memo.json"))  # a folder under a file: cannot exist
    memo.derive("k", "a", [str(blocker)], lambda: 1)
    memo.save()
    report = memo.report()
    assert report["error"] and "cannot write" in report["error"] and report["misses"] == 1


# ---- the whole probe -----------------------------------------------------------------------------


def _facts(venv: Path, memo_file: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from ddtree_deploy.remote import facts as host_facts

    data = host_facts.gather([str(venv)], False, "x", None, str(memo_file))
    Facts.model_validate(data)
    report = data.pop("probe_memo")
    data.pop("duration_s")
    data.pop("host_info")  # memory and disk free move between runs
    data.pop("services")  # listeners of this machine move between runs
    return data, report


@pytest.mark.skipif(not have_gcc(), reason="needs gcc (scripts/setup.sh installs it)")
def test_the_probe_gives_the_same_facts_from_its_memo_and_sees_each_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ddtree_deploy.remote import facts_venv

    monkeypatch.setattr(facts_venv, "RACY_S", 0.0)  # the venv is made just before
    venv, sp = make_venv(tmp_path / "venv")
    torch_cu130(sp)
    sglang_tree(sp, ddtree_spec_text(), ddtree=True)
    real_packages(sp, "0.6.8.post1", "0.1.32")
    rel = "sgl_kernel/common_ops.abi3.so"
    shared_object(sp, rel, ["libcudart.so.12"])
    memo_file = tmp_path / "memo.json"

    caches = sorted(sp.rglob("__pycache__"))
    first, report = _facts(venv, memo_file)
    assert report["misses"] > 0 and report["error"] is None
    assert sorted(sp.rglob("__pycache__")) == caches  # the probe writes nothing into the venv
    again, report = _facts(venv, memo_file)
    assert again == first and report["hits"] > 0 and report["misses"] == 0
    no_memo, _ = _facts(venv, tmp_path / "other.json")
    assert no_memo == first

    def one(data: dict[str, Any]) -> dict[str, Any]:
        (v,) = data["venvs"]
        return v

    # A rebuilt extension (now CUDA 13), sglang's spec_info.py without DDTREE, flashinfer
    # without mm_mxfp8: each is seen on the next run.
    shared_object(sp, rel, ["libcudart.so.13"])
    (sp / "sglang/srt/speculative/spec_info.py").write_text(real_spec_text())
    init = sp / "flashinfer" / "__init__.py"
    init.write_text(init.read_text().replace("mm_mxfp8", "mm_other"))
    changed, report = _facts(venv, memo_file)
    assert report["misses"] >= 3
    kernel = next(e for e in one(changed)["extensions"] if e["path"] == rel)
    assert kernel["needed"] == ["libcudart.so.13"] and kernel["cuda_majors"] == [13]
    assert one(first)["sglang"]["knows_ddtree"] and not one(changed)["sglang"]["knows_ddtree"]
    assert one(first)["names"]["flashinfer"] == ["mm_mxfp8"]
    assert one(changed)["names"]["flashinfer"] == []
    assert changed == _facts(venv, tmp_path / "third.json")[0]  # as a probe without memo sees it


# ---- the probe kept as a compiled module on the host ---------------------------------------------


def test_the_probe_is_kept_compiled_by_its_hash_and_old_versions_go(tmp_path: Path) -> None:
    import subprocess
    import sys

    from ddtree_deploy.facts.gather import PROBE_BOOT, probe_name

    def run(source: str, home: Path, name: str | None = None) -> dict[str, Any]:
        env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
        name = name or probe_name(source.encode())
        proc = subprocess.run([sys.executable, "-I", "-S", "-c", PROBE_BOOT, name,
                               "--host-name", "x"], input=source.encode(), capture_output=True,
                              env=env, timeout=60, check=False)
        assert proc.returncode == 0 and proc.stderr == b"", proc.stderr.decode()
        return json.loads(proc.stdout)  # type: ignore[no-any-return]

    from ddtree_deploy.remote.bundle import probe_source

    home = tmp_path / "home"
    folder = home / ".cache" / "ddtree-deploy" / "probe"
    source = probe_source()
    assert run(source, home)["host"] == "x"
    (module,) = [p.name for p in folder.glob("probe_*.py")]
    (compiled,) = [p.name for p in (folder / "__pycache__").iterdir()]
    assert compiled.startswith(module[:-3])  # compiled although PYTHONDONTWRITEBYTECODE is set
    assert run(source, home)["host"] == "x"
    newer = source + "\n# another version\n"
    assert run(newer, home)["host"] == "x"
    assert [p.name for p in folder.glob("probe_*.py")] != [module]  # only the newer one is left
    assert len(list(folder.glob("probe_*.py"))) == 1
    assert len(list((folder / "__pycache__").iterdir())) == 1
    blocked = tmp_path / "file-home"
    blocked.write_text("")  # a home that cannot hold a cache: the probe still runs
    assert run(source, blocked)["host"] == "x"
    for bad in ("../../evil", "probe_../x"):  # a name that is no hash: run as sent, kept nowhere
        assert run(source, home, bad)["host"] == "x"
    assert len(list(folder.glob("probe_*.py"))) == 1 and not list(home.glob("**/evil*"))


def test_a_memo_of_another_probe_version_or_python_is_dropped(tmp_path: Path) -> None:
    memo_file, data = tmp_path / "memo.json", tmp_path / "a"
    data.write_text("x")
    calls: list[str] = []

    def derive(code: str) -> tuple[int, int]:
        memo = Memo(str(memo_file), code)
        memo.derive("k", "a", [str(data)], lambda: calls.append(code) or "v")
        memo.save()
        return memo.hits, memo.misses

    assert derive("v1") == (0, 1)
    assert derive("v1") == (1, 0)
    assert derive("v2") == (0, 1)  # a newer probe derives again: its parsers may differ
    assert calls == ["v1", "v2"]
    saved = json.loads(memo_file.read_text())
    assert saved["code"].startswith("v2|") and saved["code"].endswith(sys.version)


def test_the_extension_walk_is_reused_until_a_folder_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk for shared objects is kept with the signature of every folder it listed: an
    added, removed or renamed shared object anywhere below (or a new folder) shows at once."""
    from ddtree_deploy.remote import facts_venv
    from ddtree_deploy.remote.facts_venv import shared_objects

    monkeypatch.setattr(facts_venv, "RACY_S", 0.0)  # the folders here change within it

    sp = tmp_path / "site-packages"
    for rel in ("a/x.so", "a/b/c/y.so.1", "nvidia/cu13/lib/libcudart.so.13", "d.dist-info/w.so"):
        (sp / rel).parent.mkdir(parents=True, exist_ok=True)
        (sp / rel).write_bytes(b"\x7fELF")
    memo_file = tmp_path / "memo.json"

    def walk() -> tuple[list[str], int]:
        memo = Memo(str(memo_file), "v")
        found, complete = shared_objects(str(sp), None, memo)
        memo.save()
        assert complete and found == shared_objects(str(sp))[0]  # the same as without a memo
        return found, memo.hits

    assert walk() == (["a/b/c/y.so.1", "a/x.so"], 0)
    assert walk() == (["a/b/c/y.so.1", "a/x.so"], 1)
    (sp / "a/b/c/z.so").write_bytes(b"")  # deep inside
    assert walk() == (["a/b/c/y.so.1", "a/b/c/z.so", "a/x.so"], 0)
    (sp / "a/b/c/y.so.1").rename(sp / "a/b/c/y.so.2")
    assert walk()[0] == ["a/b/c/y.so.2", "a/b/c/z.so", "a/x.so"]
    (sp / "e/f").mkdir(parents=True)
    (sp / "e/f/g.so").write_bytes(b"")  # a new folder tree
    assert walk()[0] == ["a/b/c/y.so.2", "a/b/c/z.so", "a/x.so", "e/f/g.so"]
    (sp / "a/x.so").unlink()
    assert walk() == (["a/b/c/y.so.2", "a/b/c/z.so", "e/f/g.so"], 0)
    assert walk()[1] == 1


def test_a_walk_over_a_folder_changed_just_now_is_not_kept(tmp_path: Path) -> None:
    """Within RACY_S of a folder's last change, a second change in the same clock tick could
    leave its times as they were: such a walk is used but not remembered."""
    from ddtree_deploy.remote.facts_venv import shared_objects

    sp = tmp_path / "site-packages"
    (sp / "a").mkdir(parents=True)
    (sp / "a/x.so").write_bytes(b"")
    memo_file = tmp_path / "memo.json"
    for _ in range(2):
        memo = Memo(str(memo_file), "v")
        assert shared_objects(str(sp), None, memo) == (["a/x.so"], True)
        memo.save()
        assert (memo.hits, memo.misses) == (0, 1)  # not kept, so not found the second time
