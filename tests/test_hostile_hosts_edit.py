"""recommend --write on real-world hosts files: the edit keeps what the file was.

Every case is data: a hosts file as people write them (CRLF, four-space indentation,
indented sequences, a BOM, comments after the block the edit removes), the choice written,
and the lines that must differ afterwards: exactly the ones the choice changes. The write
keeps the file's symlink, owner and mode, leaves no temporary (a full disk, SIGTERM), and a
refusal names hosts.yaml, not a temporary file.
"""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path

import pytest

from ddtree_deploy.atomicfile import FileWriteError, Terminated
from ddtree_deploy.bench import hostsedit
from ddtree_deploy.bench.recommend import Choice
from ddtree_deploy.config.hosts import load_config
from ddtree_deploy.errors import ConfigError, ExitCode, UsageError


def _choice(algorithm: str, budget: int | None = None, topk: int | None = None) -> Choice:
    return Choice("overall", "c", "c", algorithm, budget, topk, False, 1.1, 0.1, 0.0, 4, None)


TREE = _choice("ddtree", 31, 8)
FLASH = _choice("dflash")

TWO_SPACES = """\
# site hosts
version: 1
hosts:
  gpu1:
    address: 10.0.0.5   # the box
    venvs:
      serve: {path: /opt/v, role: serving}
deployments:
  svc:
    host: gpu1
    venv: serve
    cuda_lane: cu130
    sglang: {version: 0.5.11}
    algorithm: ddtree   # chosen by bench
    ddtree:
      budget: 15
      topk: 8
    # keep: this note is about the port below
    port: 30001
    model_path: /m/t
    draft_model_path: /m/d
"""

FOUR_SPACES = """\
version: 1
hosts:
    gpu1:
        address: 10.0.0.5
        venvs:
            serve: {path: /opt/v, role: serving}
deployments:
    svc:
        host: gpu1
        venv: serve
        cuda_lane: cu130
        sglang:
            version: 0.5.11
            extra_packages:
              - soundfile==0.13.1
        algorithm: dflash     # for now
        model_path: /m/t
        draft_model_path: /m/d
        extra_args:
          - --skip-tokenizer-init
        port: 30001
"""

LAST_BLOCK = """\
version: 1
hosts:
  gpu1:
    address: 10.0.0.5
    venvs:
      serve: {path: /opt/v, role: serving}
deployments:
  svc:
    host: gpu1
    venv: serve
    cuda_lane: cu130
    sglang: {version: 0.5.11}
    model_path: /m/t
    draft_model_path: /m/d
    algorithm: ddtree
    ddtree:
      budget: 15
      topk: 8
  # --- the next service: keep this heading ---
  other:
    host: gpu1
    venv: serve
    cuda_lane: cu130
    sglang: {version: 0.5.11}
    model_path: /m/t
    port: 30002
"""


def _crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


# (case id, file text, choice, lines removed, lines added) — nothing else may change
CASES: list[tuple[str, str, Choice, list[str], list[str]]] = [
    ("two-spaces-removed-block-comment-kept", TWO_SPACES, FLASH,
     ["    algorithm: ddtree   # chosen by bench", "    ddtree:", "      budget: 15",
      "      topk: 8"],
     ["    algorithm: dflash   # chosen by bench"]),
    ("two-spaces-budget", TWO_SPACES, TREE, ["      budget: 15"],
     ["      budget: 31", "      shadow_linear: false"]),
    ("four-spaces-and-indented-sequences", FOUR_SPACES, TREE,
     ["        algorithm: dflash     # for now"],
     ["        algorithm: ddtree     # for now", "        ddtree:", "            budget: 31",
      "            topk: 8", "            shadow_linear: false"]),
    ("four-spaces-sequences-under-four", FOUR_SPACES.replace("    - ", "      - "), TREE,
     ["        algorithm: dflash     # for now"],
     ["        algorithm: ddtree     # for now", "        ddtree:", "            budget: 31",
      "            topk: 8", "            shadow_linear: false"]),
    ("crlf", _crlf(TWO_SPACES), TREE, ["      budget: 15"],
     ["      budget: 31", "      shadow_linear: false"]),
    ("crlf-four-spaces", _crlf(FOUR_SPACES), FLASH, [], []),
    ("bom", "\ufeff" + TWO_SPACES, FLASH,
     ["    algorithm: ddtree   # chosen by bench", "    ddtree:", "      budget: 15",
      "      topk: 8"],
     ["    algorithm: dflash   # chosen by bench"]),
    ("explicit-start-and-directive", "# site\n%YAML 1.2\n---\n" + TWO_SPACES, TREE,
     ["      budget: 15"], ["      budget: 31", "      shadow_linear: false"]),
    ("document-end-marker", TWO_SPACES + "...\n", FLASH,
     ["    algorithm: ddtree   # chosen by bench", "    ddtree:", "      budget: 15",
      "      topk: 8"],
     ["    algorithm: dflash   # chosen by bench"]),
    ("no-final-newline", TWO_SPACES.rstrip("\n"), TREE, ["      budget: 15"],
     ["      budget: 31", "      shadow_linear: false"]),
    ("trailing-blank-lines-and-comment", TWO_SPACES + "# end\n\n\n", TREE, ["      budget: 15"],
     ["      budget: 31", "      shadow_linear: false"]),
    ("comment-after-last-removed-block", LAST_BLOCK, FLASH,
     ["    algorithm: ddtree", "    ddtree:", "      budget: 15", "      topk: 8"],
     ["    algorithm: dflash"]),
]


def _lines(text: str) -> list[str]:
    return text.replace("\ufeff", "").split("\r\n" if "\r\n" in text else "\n")


@pytest.mark.parametrize(("case", "text", "choice", "removed", "added"), CASES,
                         ids=[c[0] for c in CASES])
def test_the_edit_changes_only_the_chosen_lines(tmp_path: Path, case: str, text: str,
                                                choice: Choice, removed: list[str],
                                                added: list[str]) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_bytes(text.encode("utf-8"))
    load_config(path)
    old, new = hostsedit.new_text(path, "svc", choice)
    hostsedit.write(path, new)
    written = path.read_bytes().decode("utf-8")
    assert written == new
    before, after = _lines(text), _lines(written)
    assert [ln for ln in before if ln not in after] == removed
    assert [ln for ln in after if ln not in before] == added
    if "\r\n" in text:
        assert written.count("\n") == written.count("\r\n")
    assert written.startswith("\ufeff") == text.startswith("\ufeff")
    assert len(after) - len(before) == len(added) - len(removed)  # no line lost or doubled
    assert written.endswith("\n") == text.endswith("\n")
    dep = load_config(path).deployment("svc")
    assert dep.algorithm == choice.algorithm
    assert [p.name for p in tmp_path.iterdir()] == ["hosts.yaml"]


def test_a_linked_hosts_file_is_written_through_its_link(tmp_path: Path) -> None:
    shared = tmp_path / "shared" / "hosts.yaml"
    shared.parent.mkdir()
    shared.write_text(TWO_SPACES)
    link = tmp_path / "hosts.yaml"
    link.symlink_to(shared)
    _, new = hostsedit.new_text(link, "svc", FLASH)
    hostsedit.write(link, new)
    assert link.is_symlink() and link.resolve() == shared.resolve()
    assert shared.read_text() == new


def test_a_hard_linked_hosts_file_is_refused_not_split(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(TWO_SPACES)
    os.link(path, tmp_path / "other-name.yaml")
    _, new = hostsedit.new_text(path, "svc", FLASH)
    with pytest.raises(UsageError) as info:
        hostsedit.write(path, new)
    assert getattr(info.value, "exit_code", None) == ExitCode.USAGE
    assert "2 hard links" in str(info.value) and str(path) in str(info.value)
    assert path.read_text() == TWO_SPACES


def test_a_read_only_hosts_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(TWO_SPACES)
    os.chmod(path, 0o444)
    _, new = hostsedit.new_text(path, "svc", FLASH)
    with pytest.raises(UsageError) as info:
        hostsedit.write(path, new)
    assert "read-only (mode 0444)" in str(info.value) and str(path) in str(info.value)
    assert path.read_text() == TWO_SPACES


def test_owner_and_mode_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(TWO_SPACES)
    os.chmod(path, 0o640)
    owner = (12345, 12345) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    if os.geteuid() == 0:
        os.chown(path, *owner)
    _, new = hostsedit.new_text(path, "svc", FLASH)
    hostsedit.write(path, new)
    st = path.stat()
    assert (st.st_uid, st.st_gid) == owner
    assert stat.S_IMODE(st.st_mode) == 0o640


def test_a_refused_edit_names_hosts_yaml_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(TWO_SPACES)
    _, new = hostsedit.new_text(path, "svc", _choice("ddtree", 5000, 8))  # budget over 1024
    with pytest.raises(ConfigError) as info:
        hostsedit.write(path, new)
    assert info.value.exit_code == ExitCode.USAGE
    assert f"{path}:" in str(info.value) and "deployments.svc.ddtree.budget" in str(info.value)
    assert ".tmp" not in str(info.value)
    assert path.read_text() == TWO_SPACES
    assert [p.name for p in tmp_path.iterdir()] == ["hosts.yaml"]


def test_sigterm_while_writing_leaves_no_temporary(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "hosts.yaml"
    path.write_text(TWO_SPACES)
    _, new = hostsedit.new_text(path, "svc", FLASH)
    real_chmod = os.chmod

    def chmod_then_term(p: object, mode: int) -> None:
        real_chmod(p, mode)  # type: ignore[arg-type]
        signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr("ddtree_deploy.atomicfile.os.chmod", chmod_then_term)
    with pytest.raises(Terminated):
        hostsedit.write(path, new)
    assert path.read_text() == TWO_SPACES
    assert [p.name for p in tmp_path.iterdir()] == ["hosts.yaml"]
    assert signal.getsignal(signal.SIGTERM) is not None


def test_a_full_disk_names_the_file_and_leaves_no_temporary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/dev/full answers every write with ENOSPC, as a full state disk does."""
    from ddtree_deploy.facts.cache import FactsCache

    real_mkstemp = __import__("tempfile").mkstemp

    def on_a_full_disk(**kwargs: object) -> tuple[int, str]:
        fd, name = real_mkstemp(**kwargs)
        os.close(fd)
        return os.open("/dev/full", os.O_WRONLY), name

    monkeypatch.setattr("ddtree_deploy.atomicfile.tempfile.mkstemp", on_a_full_disk)
    path = tmp_path / "hosts.yaml"
    path.write_text(TWO_SPACES)
    _, new = hostsedit.new_text(path, "svc", FLASH)
    with pytest.raises(FileWriteError) as info:
        hostsedit.write(path, new)
    assert str(path) in str(info.value) and "No space left on device" in str(info.value)
    assert info.value.exit_code == ExitCode.FAILED
    assert [p.name for p in tmp_path.iterdir()] == ["hosts.yaml"]
    cache = FactsCache(tmp_path / "facts")
    from ddtree_deploy.atomicfile import replace_file

    with pytest.raises(FileWriteError) as info:
        replace_file(cache.root / "x.json", b"{}")
    assert str(cache.root / "x.json") in str(info.value)
    assert list((tmp_path / "facts").iterdir()) == []
