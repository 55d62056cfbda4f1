"""tests/wheelcache.py: the manifest of the wheels the tests need, its fetch and its lookups.

The fetch is tested against a local HTTP server (a thread serving bytes from memory): a
wheel is written only when its sha256 matches, a cached one that matches is not fetched again,
an altered one is replaced.
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import wheelcache
from wheelcache import ManifestError, Wheel

FILE = "demo-1.0-py3-none-any.whl"
GOOD = b"PK demo wheel bytes"


def _entry(**changes: str) -> dict[str, str]:
    entry = {"name": "demo", "version": "1.0", "file": FILE,
             "url": f"https://files.example/p/{FILE}",
             "sha256": hashlib.sha256(GOOD).hexdigest(), "used_by": "test_wheelcache"}
    return {**entry, **changes}


def _toml(path: Path, *entries: dict[str, str]) -> Path:
    path.write_text("".join("[[wheel]]\n" + "".join(f'{k} = "{v}"\n' for k, v in e.items())
                            for e in entries))
    return path


def test_the_repositorys_manifest_loads_one_entry_per_wheel() -> None:
    wheels = wheelcache.load()
    assert ("sglang", "0.5.11") in wheels and ("nvidia-cuda-runtime", "13.0.96") in wheels
    assert all(w.used_by.strip() and w.path.parent == wheelcache.CACHE for w in wheels.values())
    assert len({w.file for w in wheels.values()}) == len(wheels)


@pytest.mark.parametrize(("change", "said"), [
    ({"sha256": "abc"}, "sha256: Value error, expected 64 lowercase hex digits"),
    ({"url": f"http://files.example/{FILE}"}, "url: Value error, expected an https:// URL"),
    ({"url": "https://files.example/other.whl"}, f"does not end with /{FILE}"),
    ({"version": "1.1"}, f"{FILE} is not demo 1.1"),
    ({"file": "demo-1.0.tar.gz"}, "not a wheel's file name"),
    ({"size": "12"}, "size: Extra inputs are not permitted"),
])
def test_a_bad_entry_is_refused_naming_it_and_its_field(tmp_path: Path, change: dict[str, str],
                                                        said: str) -> None:
    manifest = _toml(tmp_path / "wheels.toml", _entry(name="first", file="first-1.0-py3-none-any"
                                                      ".whl", url="https://f.example/first-1.0"
                                                      "-py3-none-any.whl"), _entry(**change))
    with pytest.raises(ManifestError) as info:
        wheelcache.load(manifest)
    assert f"{manifest}: [[wheel]] #2 (" in str(info.value) and said in str(info.value)


def test_a_wheel_listed_twice_and_an_unknown_table_are_refused(tmp_path: Path) -> None:
    twice = _toml(tmp_path / "twice.toml", _entry(), _entry(name="Demo", version="1.0.0"))
    with pytest.raises(ManifestError, match=r"#2 .*Demo 1.0.0 is listed twice"):
        wheelcache.load(twice)
    other = tmp_path / "other.toml"
    other.write_text("[wheels]\nname = 'x'\n")
    with pytest.raises(ManifestError, match=r"unknown table\(s\) \['wheels'\]"):
        wheelcache.load(other)


class _Served:
    """A local HTTP server (a thread) answering every GET with `body`, counting requests."""

    def __init__(self) -> None:
        self.body = GOOD
        self.gets = 0
        served = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                served.gets += 1
                self.send_response(200)
                self.send_header("Content-Length", str(len(served.body)))
                self.end_headers()
                self.wfile.write(served.body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/p/{FILE}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()


@pytest.fixture()
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[_Served]:
    monkeypatch.setattr(wheelcache, "CACHE", tmp_path / "cache")
    s = _Served()
    yield s
    s.server.shutdown()
    s.server.server_close()


def _local(served: _Served) -> Wheel:
    # model_construct: the manifest refuses plain http, the local server has no TLS
    return Wheel.model_construct(**_entry(url=served.url))


def test_fetch_writes_the_wheel_once_and_replaces_an_altered_one(served: _Served) -> None:
    entry = _local(served)
    assert wheelcache.fetch([entry]) == []
    assert entry.path.read_bytes() == GOOD and served.gets == 1
    assert wheelcache.fetch([entry]) == [] and served.gets == 1  # cached: not fetched again
    entry.path.write_bytes(b"altered")
    assert wheelcache.fetch([entry]) == []
    assert entry.path.read_bytes() == GOOD and served.gets == 2
    assert sorted(p.name for p in wheelcache.CACHE.iterdir()) == [FILE]


def test_fetch_refuses_bytes_that_do_not_match_the_sha256(served: _Served) -> None:
    entry = _local(served)
    served.body = b"PK something else"
    (error,) = wheelcache.fetch([entry])
    assert error == (f"{FILE}: sha256 {hashlib.sha256(served.body).hexdigest()} from "
                     f"{served.url}, the manifest says {entry.sha256}")
    assert list(wheelcache.CACHE.iterdir()) == []  # nothing kept, no partial file


def test_an_unreachable_url_is_an_error_naming_it(served: _Served) -> None:
    entry = Wheel.model_construct(**_entry(url=f"http://127.0.0.1:1/p/{FILE}"))
    (error,) = wheelcache.fetch([entry])
    assert error.startswith(f"{FILE}: not fetched from http://127.0.0.1:1/p/{FILE} (")


def test_a_test_without_its_wheel_fails_in_ci_and_skips_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wheelcache, "CACHE", tmp_path)  # empty: nothing fetched
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"in CI a wheel a test needs must be there: "
                       r"\.test-wheels/sglang-0\.5\.11-.*\.whl is not fetched \(scripts/test.sh"):
        wheelcache.wheel("sglang", "0.5.11")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match=r"is not fetched .*wheelcache.py fetch"):
        wheelcache.wheel("SGLang", "0.5.11.0")  # names and versions compared canonically


def test_a_wheel_missing_from_the_manifest_always_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.fail.Exception, match="sglang 0.4.0 is not in tests/wheels.toml"):
        wheelcache.wheel("sglang", "0.4.0")


def test_a_fetched_wheel_is_returned_and_an_altered_one_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = wheelcache.load()[("pycparser", "2.23")]
    monkeypatch.setattr(wheelcache, "CACHE", tmp_path)
    monkeypatch.setenv("CI", "true")
    (tmp_path / entry.file).write_bytes(b"not the wheel")
    with pytest.raises(pytest.fail.Exception, match="does not match its sha256"):
        wheelcache.wheel("pycparser", "2.23")
