"""What an sglang release itself requires (its wheel's METADATA Requires-Dist, read from the
real wheel into `sglang_requires.json`, each entry with its source), and the hosts.yaml pins
that conflict with it.

A deployment moves to another release by changing `sglang.version`; its `extra_packages` may
still pin what the old release wanted (0.5.11's transformers 5.6.0 or flashinfer 0.6.8.post1,
where 0.5.17 pins 5.12.1 and 0.6.15.post1). `conflicts` names every such pin; plan refuses
until hosts.yaml is fixed. `missing` names what the release adds to the installed one's
requirements that the venv lacks: apply installs sglang itself without its dependencies (the
lane and the extras bring them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

DATA = Path(__file__).with_name("sglang_requires.json")
# The environment a host's wheels are chosen for (the lab hosts and the GPU host alike).
HOST_ENV = {"sys_platform": "linux", "platform_machine": "x86_64", "platform_system": "Linux",
            "os_name": "posix", "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "extra": ""}


@dataclass(frozen=True)
class Conflict:
    pin: str  # as hosts.yaml has it
    release: str  # the release's own requirement of that name
    source: str


def release_requires(version: str, python: str = "3.11") -> list[Requirement] | None:
    """The release's requirements that apply on a Linux x86_64 host (None: not recorded)."""
    entry = json.loads(DATA.read_text(encoding="utf-8")).get(version)
    if entry is None:
        return None
    env = dict(HOST_ENV, python_version=".".join(python.split(".")[:2]),
               python_full_version=python)
    out = []
    for text in entry["requires"]:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(env):
            out.append(req)
    return out


def source(version: str) -> str | None:
    entry = json.loads(DATA.read_text(encoding="utf-8")).get(version)
    return None if entry is None else str(entry["source"])


def _pinned(req: Requirement) -> Version | None:
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "==="):
        try:
            return Version(specs[0].version)
        except InvalidVersion:
            return None
    return None


def conflicts(version: str, pins: list[str], python: str = "3.11") -> list[Conflict]:
    """Every pin of `pins` (PEP 508, as hosts.yaml lists them) that the release's own
    requirement of the same name excludes."""
    own = release_requires(version, python)
    if own is None:
        return []
    by_name = {canonicalize_name(r.name): r for r in own}
    out = []
    for text in pins:
        try:
            pin = Requirement(text)
        except InvalidRequirement:
            continue  # hosts.yaml's validation names it
        theirs = by_name.get(canonicalize_name(pin.name))
        if theirs is None or not str(theirs.specifier):
            continue
        mine, exact = _pinned(pin), _pinned(theirs)
        clash = (mine is not None and not theirs.specifier.contains(mine, prereleases=True)) or (
            mine is None and exact is not None and str(pin.specifier)
            and not pin.specifier.contains(exact, prereleases=True))
        if clash:
            out.append(Conflict(text, str(theirs), source(version) or "?"))
    return out


def missing(version: str, installed: str | None, have: dict[str, str], listed: list[str],
            python: str = "3.11") -> list[str]:
    """The packages the release requires that the installed release did not (both recorded),
    neither in the venv nor in `listed` (hosts.yaml's extra packages)."""
    own = release_requires(version, python) or []
    old = release_requires(installed, python) if installed else None
    if old is None or installed == version:
        return []
    names = {canonicalize_name(n) for n in have} | {canonicalize_name(r.name) for r in old}
    for text in listed:
        try:
            names.add(canonicalize_name(Requirement(text).name))
        except InvalidRequirement:
            continue
    return sorted({r.name for r in own if canonicalize_name(r.name) not in names},
                  key=str.lower)
