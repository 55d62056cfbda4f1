"""Files named on the command line (cli_files): a failed write leaves the old file whole and
no temporary file behind; reads refuse what is not a regular file without blocking."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from hang_guard import call_guarded

from ddtree_deploy.cli import files as cli_files
from ddtree_deploy.errors import DeployError, UsageError


def test_a_full_disk_leaves_the_old_file_whole(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "plan.json"
    out.write_text("the old plan")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cli_files.os, "fsync", full)
    with pytest.raises(DeployError, match="cannot write: No space left on device"):
        cli_files.write_output(cli_files.output_path(str(out), "--out"), "x" * 4096, "--out")
    assert out.read_text() == "the old plan"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_a_write_replaces_the_file_at_once(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    out.write_text("old")
    before = out.stat().st_ino
    cli_files.write_output(out, "new", "--out")
    assert out.read_text() == "new" and out.stat().st_ino != before  # renamed over, not rewritten


def test_a_fifo_with_a_reader_is_written(tmp_path: Path) -> None:
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        cli_files.write_output(fifo, "through the pipe", "--out")
        assert os.read(reader, 100) == b"through the pipe"
    finally:
        os.close(reader)


@pytest.mark.parametrize("make", ["fifo", "folder", "missing"])
def test_inputs_that_are_not_regular_files(tmp_path: Path, make: str) -> None:
    path = tmp_path / "in"
    if make == "fifo":
        os.mkfifo(path)
    elif make == "folder":
        path.mkdir()
    with pytest.raises(UsageError, match=r"--plan .*(not a regular file|No such file)"):
        cli_files.read_input(path, "--plan")


def _secret_file(tmp_path: Path, make: str) -> Path:
    path = tmp_path / "key"
    if make == "fifo":
        os.mkfifo(path)  # no writer: a plain read waits forever
    elif make == "folder":
        path.mkdir()
    elif make == "huge":
        path.write_bytes(b"k" * (1 << 20))
    elif make == "binary":
        path.write_bytes(b"ab\xfbSECRET")
    elif make == "dev-zero":
        return Path("/dev/zero")  # a plain read fills the memory (MemoryError, a traceback)
    return path


# (how the secret file is made, what the refusal says)
SECRET_FILES = [("fifo", "not a regular file"), ("dev-zero", "not a regular file"),
                ("folder", "is a directory"), ("huge", "larger than 64 KiB"),
                ("binary", "as UTF-8 text (its content is not shown)")]


@pytest.mark.parametrize(("make", "says"), SECRET_FILES, ids=[m for m, _ in SECRET_FILES])
def test_a_secret_file_is_read_bounded_and_never_shown(tmp_path: Path, make: str,
                                                       says: str) -> None:
    from ddtree_deploy.errors import ConfigError
    from ddtree_deploy.service import endpoint

    path = _secret_file(tmp_path, make)
    with pytest.raises(ConfigError) as info:  # the FIFO hung here before the fix
        call_guarded(lambda: endpoint.read_secrets(None, path, "svc"), "reading the secret")
    message = str(info.value)
    assert message.startswith(f"deployments.svc.hf_token_file: cannot read the HF_TOKEN from "
                              f"{path}") or message.startswith(
        f"deployments.svc.hf_token_file: {path} must hold"), message
    assert says in message, message
    assert "SECRET" not in message and "0xfb" not in message, message


# A venv on a host holds a FIFO where the facts probe reads a file: the probe waited on it
# until the workstation killed it (60 s), and the host had no facts at all.
def test_the_probe_reads_a_venvs_files_without_waiting_on_a_fifo(tmp_path: Path) -> None:
    from ddtree_deploy.remote.facts_elf import ElfError, elf_dynamic
    from ddtree_deploy.remote.facts_venv import read_text

    fifo = tmp_path / "METADATA"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        call_guarded(lambda: read_text(str(fifo)), "reading a FIFO as METADATA")
    with pytest.raises(ElfError, match="not a regular file"):
        call_guarded(lambda: elf_dynamic(str(fifo)), "reading a FIFO as a shared object")
    text = tmp_path / "RECORD"
    text.write_bytes(b"torch/_C.so,,\n\xff\n")
    assert read_text(str(text)) == "torch/_C.so,,\n\ufffd\n"  # a regular file: read as before


def test_a_models_config_that_is_a_fifo_is_an_error_not_a_wait(tmp_path: Path) -> None:
    from ddtree_deploy.remote.facts import model_dir

    os.mkfifo(tmp_path / "config.json")
    entry = call_guarded(lambda: model_dir(str(tmp_path)), "reading a FIFO as config.json")
    assert entry["config"] is None and "not a regular file" in entry["error"], entry
    (tmp_path / "config.json").unlink()
    (tmp_path / "config.json").write_text('{"block_size": 16}')
    assert model_dir(str(tmp_path))["config"] == {"block_size": 16}
