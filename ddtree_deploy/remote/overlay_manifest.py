"""Read a venv's distributions from their dist-info RECORDs and print one JSON object.

Runs on the host with the venv's own python and nothing but the standard library:

    <venv>/bin/python - [--venv V] [--site-packages SP] [--verify] -- PATTERN...

(the script arrives on stdin). For every dist-info in site-packages whose
canonical name matches a PATTERN (fnmatch), it reads METADATA (Name, Version)
and RECORD: each file's sha256 and size come from RECORD; files RECORD lists
without a hash (RECORD itself, some *.pyc) are hashed on the spot, and skipped
when absent. Paths are normalised (``a/./b`` -> ``a/b``) and stay relative to
site-packages, so ``../../../bin/torchrun`` is kept as it is.

With --verify every file is also read back and compared with RECORD; the
differences are listed under ``mismatches``. Problems that make a distribution
unusable for an overlay (no RECORD, two dist-infos of one name, an absolute
path) are listed under ``errors``; the workstation refuses the manifest then.

The workstation side (the command and reading the answer) is overlay/manifest.py.
"""

from __future__ import annotations

import argparse
import base64
import csv
import fnmatch
import hashlib
import io
import json
import os
import posixpath
import re
import sys
import sysconfig
from typing import Any

CHUNK = 1024 * 1024


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def hash_file(path: str) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(CHUNK)
            if not block:
                break
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size


def record_hash(value: str) -> str | None:
    """``sha256=<urlsafe b64, no padding>`` -> hex; None for another algorithm or garbage."""
    algo, _, b64 = value.partition("=")
    if algo != "sha256" or not b64:
        return None
    try:
        raw = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
    except (ValueError, TypeError):
        return None
    return raw.hex() if len(raw) == 32 else None


def read_metadata(dist_info: str) -> tuple[str, str]:
    """(Name, Version) from the METADATA headers (the body is not read)."""
    name = version = ""
    with open(os.path.join(dist_info, "METADATA"), encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                break
            key, _, value = line.partition(":")
            if key == "Name" and not name:
                name = value.strip()
            elif key == "Version" and not version:
                version = value.strip()
    if not name or not version:
        raise ValueError("METADATA has no Name or Version")
    return name, version


def read_record(site: str, dist_info: str, errors: list[str]) -> list[dict[str, Any]]:
    """The files of one distribution as [{path, sha256, size}], sorted by path."""
    files: dict[str, dict[str, Any]] = {}
    with open(os.path.join(dist_info, "RECORD"), encoding="utf-8", newline="") as f:
        rows = list(csv.reader(io.StringIO(f.read())))
    for row in rows:
        if not row or not row[0]:
            continue
        raw = row[0]
        if raw.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", raw):
            errors.append(f"{os.path.basename(dist_info)}: RECORD lists an absolute path: {raw}")
            continue
        path = posixpath.normpath(raw.replace("\\", "/"))
        full = os.path.join(site, path)
        sha = record_hash(row[1]) if len(row) > 1 else None
        size_text = row[2] if len(row) > 2 else ""
        if sha is not None and size_text.isdecimal():
            files[path] = {"path": path, "sha256": sha, "size": int(size_text)}
            continue
        if not os.path.isfile(full):
            continue  # listed without a usable hash and absent: nothing to describe
        sha, size = hash_file(full)
        files[path] = {"path": path, "sha256": sha, "size": size}
    return [files[p] for p in sorted(files)]


def verify(site: str, dist: dict[str, Any]) -> list[str]:
    """Files on disk that no longer match RECORD, as 'path: why'."""
    bad = []
    for entry in dist["files"]:
        full = os.path.join(site, entry["path"])
        if not os.path.isfile(full):
            bad.append(f"{entry['path']}: missing")
            continue
        sha, size = hash_file(full)
        if size != entry["size"]:
            bad.append(f"{entry['path']}: size {size}, RECORD says {entry['size']}")
        elif sha != entry["sha256"]:
            bad.append(f"{entry['path']}: sha256 differs from RECORD")
    return bad


def scan(venv: str, site: str, patterns: list[str], check: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "venv": venv,
        "site_packages": site,
        "python": ".".join(str(n) for n in sys.version_info[:3]),
        "dists": {},
        "errors": [],
    }
    if check:
        out["mismatches"] = {}
    errors: list[str] = out["errors"]
    try:
        entries = sorted(e.name for e in os.scandir(site) if e.name.endswith(".dist-info"))
    except OSError as exc:
        errors.append(f"cannot read site-packages {site}: {exc.strerror or exc}")
        return out
    wanted = [canonical(p) for p in patterns]
    first_seen: dict[str, str] = {}
    for folder in entries:
        path = os.path.join(site, folder)
        if not os.path.isdir(path) or not os.listdir(path):
            continue  # an empty folder left behind describes nothing
        try:
            name, version = read_metadata(path)
        except (OSError, ValueError) as exc:
            guess = canonical(folder[: -len(".dist-info")].split("-")[0])
            if any(fnmatch.fnmatchcase(guess, p) for p in wanted):
                errors.append(f"{folder}: unreadable METADATA: {exc}")
            continue
        key = canonical(name)
        if not any(fnmatch.fnmatchcase(key, p) for p in wanted):
            continue
        if key in first_seen:
            errors.append(f"{key} is installed twice: {first_seen[key]} and {folder} "
                          "(a broken earlier install); remove one")
            continue
        first_seen[key] = folder
        try:
            files = read_record(site, path, errors)
        except OSError as exc:
            errors.append(f"{folder}: no readable RECORD ({exc.strerror or exc}); "
                          "it cannot be overlaid")
            continue
        dist = {"name": key, "version": version, "dist_info": folder, "files": files}
        out["dists"][key] = dist
        if check:
            bad = verify(site, dist)
            if bad:
                out["mismatches"][key] = bad
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="manifest_remote")
    parser.add_argument("--venv", default=sys.prefix)
    parser.add_argument("--site-packages", default=None)
    parser.add_argument("--verify", action="store_true")
    parser.add_argument("patterns", nargs="*")
    args = parser.parse_args(argv)
    site = args.site_packages or sysconfig.get_paths()["purelib"]
    result = scan(os.path.abspath(args.venv), os.path.abspath(site), args.patterns, args.verify)
    json.dump(result, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
