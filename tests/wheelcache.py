"""The real wheels the tests need, declared once in tests/wheels.toml.

scripts/test.sh fetches them all before any tier runs (`python tests/wheelcache.py fetch`):
once, into .test-wheels/ at the repository's root (git-ignored), each checked by its sha256
(a file that does not match is fetched again; one that still does not match is an error).
A test asks for one by name and version: ``wheel("sglang", "0.5.11")`` returns its path. A
wheel not fetched is a failure in CI (CI set) and a skip elsewhere, naming the command that
fetches it; a wheel missing from the manifest is always a failure.

    python tests/wheelcache.py fetch                 # every wheel of the manifest (idempotent)
    python tests/wheelcache.py lookup sglang==0.5.17 # a [[wheel]] block from PyPI to paste
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import sys
import tomllib
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, canonicalize_version, parse_wheel_filename
from packaging.version import Version
from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "tests" / "wheels.toml"
CACHE = ROOT / ".test-wheels"
FETCH = "python tests/wheelcache.py fetch"
INDEX = "https://pypi.org/simple"
# `lookup`'s default target: the lab hosts' Python (3.11, Debian 12: glibc 2.36) on x86_64,
# the same wheels the lab's own wheelhouse picks.
PYTHON, GLIBC, ARCH = (3, 11), (2, 36), "x86_64"


class ManifestError(Exception):
    """tests/wheels.toml is not what it should be (the message names the entry and field)."""


class Wheel(BaseModel):
    """One [[wheel]] entry: a file at a URL, pinned by its sha256."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    name: str
    version: str
    file: str
    url: str
    sha256: str
    used_by: str  # which tests, and why

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            raise ValueError("expected 64 lowercase hex digits")
        return value

    @field_validator("url")
    @classmethod
    def _https(cls, value: str) -> str:
        if not value.startswith("https://"):
            raise ValueError("expected an https:// URL")
        return value

    @model_validator(mode="after")
    def _file_is_the_wheel(self) -> Wheel:
        try:
            name, version, _build, _tags = parse_wheel_filename(self.file)
        except ValueError as exc:
            raise ValueError(f"file: not a wheel's file name ({exc})") from None
        if name != canonicalize_name(self.name) or version != Version(self.version):
            raise ValueError(f"file: {self.file} is not {self.name} {self.version}")
        if not self.url.endswith("/" + self.file):
            raise ValueError(f"url: does not end with /{self.file}")
        return self

    @property
    def key(self) -> tuple[str, str]:
        return canonicalize_name(self.name), canonicalize_version(self.version)

    @property
    def path(self) -> Path:
        return CACHE / self.file


def load(path: Path = MANIFEST) -> dict[tuple[str, str], Wheel]:
    """The manifest's wheels by (canonical name, version); ManifestError names what is wrong."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ManifestError(f"{path}: {exc}") from None
    extra = set(raw) - {"wheel"}
    if extra:
        raise ManifestError(f"{path}: unknown table(s) {sorted(extra)}: expected [[wheel]] only")
    wheels: dict[tuple[str, str], Wheel] = {}
    for i, entry in enumerate(raw.get("wheel", []), 1):
        where = f"{path}: [[wheel]] #{i} ({entry.get('file', entry.get('name', '?'))})"
        try:
            wheel = Wheel.model_validate(entry)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}"
                                 for e in exc.errors())
            raise ManifestError(f"{where}: {problems}") from None
        if wheel.key in wheels:
            raise ManifestError(f"{where}: {wheel.name} {wheel.version} is listed twice")
        wheels[wheel.key] = wheel
    return wheels


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


@functools.cache
def _verified(path: Path, sha256: str) -> bool:
    return path.is_file() and sha256_of(path) == sha256


def wheel(name: str, version: str) -> Path:
    """The fetched, sha256-checked file of `name` `version` from the manifest.

    Not in the manifest: a failure. Not fetched (or altered): a failure in CI, a skip elsewhere.
    """
    import pytest

    try:
        entry = load().get((canonicalize_name(name), canonicalize_version(version)))
    except ManifestError as exc:
        pytest.fail(str(exc))
    if entry is None:
        pytest.fail(f"{name} {version} is not in tests/wheels.toml: add it there "
                    "(python tests/wheelcache.py lookup NAME==VERSION)")
    if _verified(entry.path, entry.sha256):
        return entry.path
    state = "does not match its sha256" if entry.path.exists() else "is not fetched"
    reason = f".test-wheels/{entry.file} {state} (scripts/test.sh fetches it: {FETCH})"
    if os.environ.get("CI"):
        pytest.fail(f"in CI a wheel a test needs must be there: {reason}")
    pytest.skip(reason)


# -- fetching ------------------------------------------------------------------------------


def _download(entry: Wheel) -> str | None:
    """Fetch one wheel into the cache unless it is there and matches; None, or what failed."""
    import httpx

    if _verified.__wrapped__(entry.path, entry.sha256):
        return None
    CACHE.mkdir(exist_ok=True)
    partial = entry.path.with_name(entry.file + ".part")
    last = ""
    for _attempt in range(3):
        h = hashlib.sha256()
        try:
            with httpx.stream("GET", entry.url, follow_redirects=True, timeout=60.0) as r:
                r.raise_for_status()
                with partial.open("wb") as out:
                    for chunk in r.iter_bytes(1 << 20):
                        h.update(chunk)
                        out.write(chunk)
        except (httpx.HTTPError, OSError) as exc:
            last = f"{type(exc).__name__}: {exc}"
            continue
        if h.hexdigest() != entry.sha256:
            partial.unlink(missing_ok=True)
            return (f"{entry.file}: sha256 {h.hexdigest()} from {entry.url}, "
                    f"the manifest says {entry.sha256}")
        partial.replace(entry.path)
        return None
    partial.unlink(missing_ok=True)
    return f"{entry.file}: not fetched from {entry.url} ({last})"


def fetch(entries: Iterable[Wheel]) -> list[str]:
    """Fetch every entry (four at a time); what failed, one line each."""
    todo = list(entries)
    with ThreadPoolExecutor(max_workers=4) as pool:
        return [e for e in pool.map(_download, todo) if e]


def stale(wheels: dict[tuple[str, str], Wheel]) -> list[Path]:
    """Files in the cache that no entry names (left by an entry since removed)."""
    named = {w.file for w in wheels.values()}
    return sorted(p for p in CACHE.glob("*") if p.name not in named) if CACHE.is_dir() else []


# -- lookup: a manifest entry from the registry ----------------------------------------------


def _preferred_tags() -> list[Tag]:
    platforms = [f"manylinux_{GLIBC[0]}_{m}_{ARCH}" for m in range(GLIBC[1], 16, -1)]
    platforms += [f"manylinux2014_{ARCH}", f"linux_{ARCH}"]
    return [*cpython_tags(PYTHON, platforms=platforms),
            *compatible_tags(PYTHON, "cp311", platforms=platforms)]


def lookup(requirement: str) -> str:
    """A [[wheel]] block for NAME==VERSION: the registry's file best for `lookup`'s target."""
    import httpx

    name, _, version = requirement.partition("==")
    if not name or not version:
        raise ManifestError(f"{requirement!r}: expected NAME==VERSION")
    r = httpx.get(f"{INDEX}/{canonicalize_name(name)}/", timeout=60.0,
                  headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    r.raise_for_status()
    rank = {tag: i for i, tag in enumerate(_preferred_tags())}
    best: tuple[int, dict[str, object]] | None = None
    for f in r.json()["files"]:
        filename = str(f["filename"])
        if not filename.endswith(".whl") or f.get("yanked"):
            continue
        _n, v, _b, tags = parse_wheel_filename(filename)
        if v != Version(version):
            continue
        score = min((rank[t] for t in tags if t in rank), default=None)
        if score is not None and (best is None or score < best[0]):
            best = (score, f)
    if best is None:
        raise ManifestError(f"{requirement}: no wheel on {INDEX} for CPython "
                            f"{PYTHON[0]}.{PYTHON[1]}, glibc {GLIBC[0]}.{GLIBC[1]}, {ARCH}")
    f = best[1]
    hashes = f["hashes"]
    assert isinstance(hashes, dict)
    return (f'[[wheel]]\nname = "{name}"\nversion = "{version}"\nfile = "{f["filename"]}"\n'
            f'url = "{f["url"]}"\nsha256 = "{hashes["sha256"]}"\nused_by = "TODO: which tests"\n')


def main(argv: list[str] | None = None) -> int:
    import httpx

    parser = argparse.ArgumentParser(prog="tests/wheelcache.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    get = sub.add_parser("fetch", help="fetch the wheels of tests/wheels.toml into .test-wheels/")
    get.add_argument("names", nargs="*", metavar="NAME",
                     help="only these packages (all their versions); default: every wheel")
    look = sub.add_parser("lookup", help="print a [[wheel]] block for NAME==VERSION")
    look.add_argument("requirements", nargs="+", metavar="NAME==VERSION")
    args = parser.parse_args(argv)
    try:
        if args.command == "lookup":
            print("\n".join(lookup(r) for r in args.requirements), end="")
            return 0
        wheels = load()
    except (ManifestError, httpx.HTTPError) as exc:
        print(f"wheelcache: {exc}", file=sys.stderr)
        return 2
    if args.names:
        wanted = {canonicalize_name(n) for n in args.names}
        unknown = wanted - {name for name, _v in wheels}
        if unknown:
            print(f"wheelcache: not in tests/wheels.toml: {', '.join(sorted(unknown))}",
                  file=sys.stderr)
            return 2
        wheels = {k: w for k, w in wheels.items() if k[0] in wanted}
    failed = fetch(wheels.values())
    for line in failed:
        print(f"wheelcache: {line}", file=sys.stderr)
    for path in [] if args.names else stale(wheels):
        print(f"wheelcache: {path.name} is in no entry of tests/wheels.toml (left as is)",
              file=sys.stderr)
    size = sum(w.path.stat().st_size for w in wheels.values() if w.path.is_file())
    print(f"wheels: {len(wheels) - len(failed)} of {len(wheels)} in .test-wheels/ "
          f"({size / 1e6:.0f} MB), each matching its sha256")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
