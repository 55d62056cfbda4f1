"""A full disk under every file the tool writes for itself: the path named, nothing left.

Every writer is data: a function that writes one of the tool's files into a folder. On a
full disk (every write answered ENOSPC, as /dev/full does) each must fail with one
FileWriteError naming the file and the reason (exit 1) -- or, for a cache that is only a
speed-up, not fail at all -- and leave no temporary file behind (an empty `*.tmp` was).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ddtree_deploy.atomicfile import FileWriteError
from ddtree_deploy.config.schema import HostSpec
from ddtree_deploy.errors import ExitCode


class _Facts:
    def model_dump_json(self, indent: int) -> str:
        return "{}"


def _facts_cache(folder: Path) -> Path:
    from ddtree_deploy.facts.cache import FactsCache

    return FactsCache(folder).save(HostSpec(name="ct200", address="10.0.0.2"), _Facts())  # type: ignore[arg-type]


def _results(folder: Path) -> Path:
    from ddtree_deploy.bench.results import Results

    res = Results.open(folder / "results.json", host="h", service="s")
    res.save()
    return res.path


def _wheelhouse_manifest(folder: Path) -> Path:
    from ddtree_deploy.converge.steps import _install

    _install._save_manifest(folder, {"a": ["b"]})
    return folder / _install.MANIFEST


def _bundle(folder: Path) -> Path:
    from ddtree_deploy.remote import bundle

    bundle._keep(folder / "probe-x.py", "print(1)\n", "probe-*.py")
    return folder / "probe-x.py"


# (case id, writer, whether the failure is raised (False: a cache that is silently skipped))
WRITERS: list[tuple[str, Callable[[Path], Path], bool]] = [
    ("facts-cache", _facts_cache, True),
    ("bench-results", _results, True),
    ("wheelhouse-manifest", _wheelhouse_manifest, True),
    ("bundle-cache", _bundle, False),
]


@pytest.fixture()
def full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    real = tempfile.mkstemp

    def on_a_full_disk(**kwargs: object) -> tuple[int, str]:
        fd, name = real(**kwargs)  # type: ignore[call-overload]
        os.close(fd)
        return os.open("/dev/full", os.O_WRONLY), name

    monkeypatch.setattr("ddtree_deploy.atomicfile.tempfile.mkstemp", on_a_full_disk)


@pytest.mark.parametrize(("case", "writer", "raises"), WRITERS, ids=[w[0] for w in WRITERS])
def test_a_full_disk_names_the_file_and_leaves_nothing(tmp_path: Path, full_disk: None,
                                                       case: str,
                                                       writer: Callable[[Path], Path],
                                                       raises: bool) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    if raises:
        with pytest.raises(FileWriteError) as info:
            writer(folder)
        assert info.value.exit_code == ExitCode.FAILED
        assert "No space left on device" in str(info.value)
        assert str(folder) in str(info.value)
    else:
        writer(folder)
    leftovers = [p.name for p in folder.rglob("*") if p.is_file()]
    assert leftovers == []


@pytest.mark.parametrize(("case", "writer", "raises"), WRITERS, ids=[w[0] for w in WRITERS])
def test_with_room_each_writer_leaves_only_its_file(tmp_path: Path, case: str,
                                                    writer: Callable[[Path], Path],
                                                    raises: bool) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    written = writer(folder)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    assert written in files
    assert not [p for p in files if p.name.endswith(".tmp")]


def test_a_full_state_disk_is_not_blamed_on_the_host(tmp_path: Path, full_disk: None,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The facts were gathered: the cache that cannot be written is this machine's error,
    raised once for the command, not a failed host."""
    from ddtree_deploy.config.hosts import load_config
    from ddtree_deploy.facts import gather
    from ddtree_deploy.facts.cache import FactsCache

    hosts = tmp_path / "hosts.yaml"
    hosts.write_text("version: 1\nhosts:\n  ct200:\n    address: 10.0.0.2\n")
    monkeypatch.setattr(gather, "gather", lambda config, spec, extra: _Facts())
    cache = FactsCache(tmp_path / "facts")
    with pytest.raises(FileWriteError) as info:
        gather.collect(load_config(hosts), ["ct200"], cache=cache, refresh=True)
    assert str(tmp_path / "facts") in str(info.value)
    assert "ct200:" not in str(info.value).split(str(tmp_path))[0]
    assert [p for p in (tmp_path / "facts").rglob("*") if p.is_file()] == []


def test_a_fifo_planted_as_a_facts_cache_file_is_skipped_not_waited_on(tmp_path: Path) -> None:
    from ddtree_deploy.facts.cache import FactsCache

    cache = FactsCache(tmp_path / "facts")
    spec = HostSpec(name="ct200", address="10.0.0.2")
    path = cache.save(spec, _Facts())  # type: ignore[arg-type]
    path.unlink()
    os.mkfifo(path)
    assert cache.load(spec) is None  # returns at once: a plain read would wait for a writer
