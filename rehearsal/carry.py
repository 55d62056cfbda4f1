"""The GPU rehearsal's carry set, built on the workstation and installed on the GPU host.

  python -m rehearsal.carry build .carry            # workstation, repo root: wheels + manifest
  python -m rehearsal.carry install .carry --target /opt/torch/.venv   # on the GPU host
  python -m rehearsal.carry lock                    # refresh sizes/sha256 in carry-set.tsv

`build` downloads the wheels of rehearsal/carry-set.tsv into a cache outside the repository
(checking each sha256), repacks sglang-kernel for SM 9.0, builds this project's wheel, and writes
them with DEST/manifest.json; it fails before downloading anything if working tree + carry set
would exceed 63 MiB (a device call carries 64). `install` checks every file against the manifest,
installs the `venv` wheels into the venv with pip (no index, no deps), the tool and its `tool`
wheels into a folder of their own, and writes DEST/bin/ddtree-deploy, which runs the tool with the
venv's Python. Exit codes: 0 done, 1 refused or failed (one message on stderr), 2 usage.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from rehearsal.carry_repack import PROFILES, record_problems, repack_profile
from rehearsal.carry_set import (
    CARRY_SET,
    LIMIT_BYTES,
    MANIFEST_FORMAT,
    MANIFEST_NAME,
    MIB,
    CarryError,
    Entry,
    carry_set_for,
    check_budget,
    folder_bytes,
    load_carry_set,
    read_manifest,
    replace_rows,
    sha256_file,
    tree_bytes,
    unlocked,
    verify_manifest,
)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = Path.home() / ".cache" / "ddtree-deploy" / "rehearsal" / "wheels"
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64")
#: what build writes into DEST (and removes there on a rebuild); nothing else is touched
OWNED = ("venv", "tool", "bin", "tool-site", MANIFEST_NAME)
PROJECT = "ddtree-deploy"

Fetch = Callable[[str, str, Path], Path]  # (name, version, into folder) -> the downloaded file
BuildProject = Callable[[Path, Path], Path]  # (repo, out folder) -> the project's wheel
Out = Callable[[str], None]


def _say(msg: str) -> None:
    print(msg, flush=True)


# -- workstation: downloads and the project's wheel --------------------------------------------


def pip_fetch(name: str, version: str, folder: Path) -> Path:
    """`pip download` one cp312/py3 wheel for the GPU host's platform into an empty `folder`."""
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp"]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    cmd += ["--dest", str(folder), f"{name}=={version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines()
                 if ln.strip() and "is ignored: it is neither a file nor a directory" not in ln]
        raise CarryError(f"pip download {name}=={version} failed: " + " / ".join(lines[-3:]))
    got = sorted(folder.glob("*.whl"))
    if len(got) != 1:
        raise CarryError(f"pip download {name}=={version} left {len(got)} wheels, expected one")
    return got[0]


def _uv() -> str:
    for cand in (os.environ.get("DDTREE_UV"), shutil.which("uv"), "/opt/ddtree-deploy-uv/bin/uv"):
        if cand and Path(cand).is_file():
            return cand
    raise CarryError("uv not found (DDTREE_UV, PATH, /opt/ddtree-deploy-uv/bin/uv): "
                     "run scripts/setup.sh")


def uv_build_project(repo: Path, out: Path) -> Path:
    """The project's own wheel (templates, overlays, payload, hosts.yaml inside: pyproject's
    force-include), built from the working tree as it is."""
    proc = subprocess.run([_uv(), "build", "--wheel", "--quiet", "--out-dir", str(out)],
                          cwd=repo, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CarryError("uv build --wheel failed: " + " / ".join(proc.stderr.splitlines()[-3:]))
    got = sorted(out.glob("ddtree_deploy-*.whl"))
    if len(got) != 1:
        raise CarryError(f"uv build left {len(got)} ddtree_deploy wheels in {out}, expected one")
    return got[0]


def cached(entry: Entry, cache: Path, fetch: Fetch, out: Out) -> Path:
    """The entry's registry wheel in `cache`, downloaded if absent; CarryError on a sha mismatch."""
    path = cache / entry.filename
    if path.is_file():
        got = sha256_file(path)
        if got != entry.sha256:
            raise CarryError(f"{path}: sha256 {got}, the carry set (line {entry.line}) says "
                             f"{entry.sha256}; refusing it (delete the file to download again)")
        return path
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".dl-") as tmp:
        out(f"  download {entry.name}=={entry.version}")
        got_path = fetch(entry.name, entry.version, Path(tmp))
        if got_path.name != entry.filename:
            raise CarryError(f"{entry.name}=={entry.version}: the registry gave {got_path.name}, "
                             f"the carry set (line {entry.line}) names {entry.filename}")
        got = sha256_file(got_path)
        if got != entry.sha256:
            raise CarryError(f"{entry.filename}: downloaded sha256 {got}, the carry set (line "
                             f"{entry.line}) says {entry.sha256}; refusing it")
        got_path.replace(path)
    return path


def dropped_summary(dropped: tuple[str, ...], patterns: tuple[str, ...]) -> dict[str, int]:
    """How many files each drop pattern removed (a wheel's signature files count under RECORD.*)."""
    counts = dict.fromkeys(patterns, 0)
    for name in dropped:
        hit = next((p for p in patterns if fnmatch.fnmatchcase(name, p)), "RECORD.*")
        counts[hit] = counts.get(hit, 0) + 1
    return counts


def _where(dest: Path, repo: Path, out: Out) -> None:
    """Say so when DEST will not travel as a carried path: outside the checkout it does not travel
    at all; inside but not git-ignored it travels as untracked files (and shows in git status)."""
    if repo != dest and repo not in dest.parents:
        out(f"warning: {dest} is outside {repo}: a device call will not send it")
        return
    ignored = subprocess.run(["git", "-C", str(repo), "check-ignore", "-q", str(dest)],
                             capture_output=True).returncode == 0
    if not ignored:
        out(f"warning: {dest} is not git-ignored: add it to .gitignore and name it in `carry`")


def _prepare_dest(dest: Path) -> None:
    if dest.exists() and not dest.is_dir():
        raise CarryError(f"{dest} exists and is not a folder")
    if dest.is_dir():
        foreign = sorted(p.name for p in dest.iterdir() if p.name not in OWNED)
        if foreign:
            raise CarryError(f"{dest} holds files build did not write ({', '.join(foreign)}); "
                             "name an empty or new folder")
    for name in OWNED:
        p = dest / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
    dest.mkdir(parents=True, exist_ok=True)


def build(dest: Path, *, repo: Path = REPO, carry_set: Path = CARRY_SET,
          cache: Path = DEFAULT_CACHE, limit: int = LIMIT_BYTES, fetch: Fetch = pip_fetch,
          build_project: BuildProject = uv_build_project, out: Out = _say) -> dict:
    """Fill `dest` and return its manifest (also written as dest/manifest.json)."""
    entries = load_carry_set(carry_set)
    todo = unlocked(entries)
    if todo:
        raise CarryError(f"{carry_set}: {', '.join(e.name for e in todo)} lack sha256/filename/"
                         "carried; run `python -m rehearsal.carry lock`")
    for e in entries:
        if e.repack and e.repack not in PROFILES:
            raise CarryError(f"{carry_set}, line {e.line}: unknown repack profile {e.repack!r} "
                             f"(known: {', '.join(PROFILES)})")
    dest = dest.resolve()
    _where(dest, repo.resolve(), out)
    carried = [e for e in entries if e.carried_here]
    tree = tree_bytes(repo, exclude=dest)
    with tempfile.TemporaryDirectory(prefix="ddtree-carry-") as tmp:
        project = build_project(repo, Path(tmp))
        planned = sum(e.carried for e in carried) + project.stat().st_size
        total = check_budget({"working tree": tree, "carry set (listed sizes)": planned}, limit,
                             when="before downloading")
        out(f"planned: tree {tree / MIB:.2f} MiB + carry {planned / MIB:.2f} MiB = "
            f"{total / MIB:.2f} MiB (limit {limit / MIB:.0f} MiB)")
        sources = {e.name: cached(e, cache, fetch, out) for e in carried}
        _prepare_dest(dest)
        files: list[dict] = []
        for e in carried:
            folder = dest / e.into
            folder.mkdir(exist_ok=True)
            src = sources[e.name]
            record: dict = {"name": e.name, "version": e.version, "into": e.into, "why": e.why,
                            "source_sha256": e.sha256, "source_size": e.size}
            if e.repack:
                out(f"  repack {e.filename} ({e.repack})")
                res = repack_profile(src, folder, e.repack)
                bad = record_problems(res.path)
                if bad:
                    raise CarryError(f"repacked {res.path.name}: RECORD wrong: {bad[0]}")
                record |= {"repack": e.repack, "dropped": dropped_summary(
                    res.dropped, PROFILES[e.repack][0])}
                path = res.path
            else:
                path = folder / src.name
                shutil.copyfile(src, path)
            record |= {"path": path.relative_to(dest).as_posix(), "sha256": sha256_file(path),
                       "size": path.stat().st_size}
            files.append(record)
        (dest / "tool").mkdir(exist_ok=True)
        pw = dest / "tool" / project.name
        shutil.copyfile(project, pw)
        files.append({"name": PROJECT, "version": project.name.split("-")[1], "into": "tool",
                      "why": "this tool, run on the GPU host against the real stack",
                      "path": pw.relative_to(dest).as_posix(), "sha256": sha256_file(pw),
                      "size": pw.stat().st_size})
    manifest: dict = {
        "format": MANIFEST_FORMAT,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "carry_set_sha256": sha256_file(carry_set),
        "files": files,
        "not_carried": [{"name": e.name, "version": e.version, "why": e.why}
                        for e in entries if not e.carried_here],
    }
    wheels = sum(f["size"] for f in files)
    manifest["sizes"] = {"tree": tree, "wheels": wheels, "limit": limit}
    (dest / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    actual = folder_bytes(dest)
    try:
        total = check_budget({"working tree": tree, "carry folder": actual}, limit,
                             when="after building")
    except CarryError:
        (dest / MANIFEST_NAME).unlink()  # no manifest: install refuses the folder
        raise
    out(f"total: tree {tree / MIB:.2f} MiB + {dest.name}/ {actual / MIB:.2f} MiB = "
        f"{total / MIB:.2f} MiB of {limit / MIB:.0f} MiB ({len(files)} files)")
    return manifest


def lock(carry_set: Path = CARRY_SET, *, cache: Path = DEFAULT_CACHE, fetch: Fetch = pip_fetch,
         out: Out = _say) -> int:
    """Write each carried entry's filename, size, sha256 and carried size (the repacked size for a
    repacked wheel) into `carry_set`, from the registry's wheel: the one already in `cache` for
    that name and version, else a fresh download into it. Returns the number of rows rewritten."""
    entries = load_carry_set(carry_set)
    updated: list[Entry] = []
    for e in entries:
        if not e.carried_here:
            continue
        out(f"  {e.name}=={e.version}")
        have = sorted(cache.glob(f"{e.name.replace('-', '_')}-{e.version}-*.whl"))
        if len(have) == 1:
            path = have[0]
        else:
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache, prefix=".dl-") as tmp:
                got = fetch(e.name, e.version, Path(tmp))
                path = cache / got.name
                got.replace(path)
        carried = path.stat().st_size
        if e.repack:
            with tempfile.TemporaryDirectory(prefix="ddtree-carry-lock-") as tmp:
                carried = repack_profile(path, Path(tmp), e.repack).size
        updated.append(Entry(e.name, e.version, e.into, e.repack, path.stat().st_size,
                             carried, sha256_file(path), path.name, e.why, e.line))
    carry_set.write_text(replace_rows(carry_set.read_text(encoding="utf-8"), updated),
                         encoding="utf-8")
    return len(updated)


# -- GPU host: install --------------------------------------------------------------------------

_CHECK = r"""
import importlib, json, sys
from importlib import metadata
sys.path.insert(0, sys.argv[1])
skip = set(json.loads(sys.argv[2]))
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
bad = []
for text in metadata.distribution("ddtree-deploy").requires or []:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if canonicalize_name(req.name) in skip:
        continue
    try:
        have = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        bad.append(f"{req}: not installed")
        continue
    if not req.specifier.contains(have, prereleases=True):
        bad.append(f"{req}: {have} is installed")
importlib.import_module("ddtree_deploy.cli.app")
print(json.dumps(bad))
"""


def _venv_python(venv: Path) -> Path:
    for name in ("python3", "python"):
        p = venv / "bin" / name
        if p.is_file():
            return p
    raise CarryError(f"{venv}: no bin/python3 there; --target takes a virtual environment's folder")


def _run(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = " / ".join((proc.stderr or proc.stdout).strip().splitlines()[-4:])
        raise CarryError(f"{what} failed (exit {proc.returncode}): {tail}")
    return proc.stdout


def launcher_text(python: Path, tool_dir: Path) -> str:
    code = ("import sys; sys.path.insert(0, sys.argv.pop(1)); sys.argv[0] = 'ddtree-deploy'; "
            "from ddtree_deploy.cli.app import main; main()")
    return (f"#!/bin/sh\n# written by `python -m rehearsal.carry install`: the tool, on {python}\n"
            f"exec {shlex.quote(str(python))} -c {shlex.quote(code)} "
            f"{shlex.quote(str(tool_dir))} \"$@\"\n")


def install(dest: Path, venv: Path, *, tool_dir: Path | None = None,
            run: Callable[[list[str], str], str] = _run, out: Out = _say) -> Path:
    """Verify and install `dest`; returns the launcher's path."""
    dest = dest.resolve()
    data = read_manifest(dest)
    paths = verify_manifest(dest, data)
    out(f"verified {len(paths)} files against {dest / MANIFEST_NAME}")
    python = _venv_python(venv.resolve())
    tool_dir = (tool_dir or dest / "tool-site").resolve()
    by_into: dict[str, list[str]] = {"venv": [], "tool": []}
    for f, p in zip(data["files"], paths, strict=True):
        by_into[f["into"]].append(str(p))
    pip = [str(python), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
           "--no-compile", "--upgrade", "--disable-pip-version-check"]
    if by_into["venv"]:
        run(pip + by_into["venv"], f"pip install into {venv}")
        out(f"installed {len(by_into['venv'])} wheels into {venv}")
    tool_dir.mkdir(parents=True, exist_ok=True)
    run(pip + ["--target", str(tool_dir)] + by_into["tool"], f"pip install --target {tool_dir}")
    out(f"installed {len(by_into['tool'])} wheels into {tool_dir}")
    skip = sorted({n["name"].lower().replace("_", "-") for n in data.get("not_carried", [])})
    bad = json.loads(run([str(python), "-c", _CHECK, str(tool_dir), json.dumps(skip)],
                         "checking the tool's requirements") or "[]")
    if bad:
        raise CarryError(f"the tool's requirements are not met in {venv} + {tool_dir}: "
                         + "; ".join(bad) + " (add the wheels to rehearsal/carry-set.tsv)")
    launcher = dest / "bin" / "ddtree-deploy"
    launcher.parent.mkdir(exist_ok=True)
    launcher.write_text(launcher_text(python, tool_dir), encoding="utf-8")
    launcher.chmod(0o755)
    version = run([str(launcher), "--version"], "ddtree-deploy --version").strip()
    out(f"ready: {launcher} ({version}); not carried: {', '.join(skip) or 'nothing'}")
    return launcher


# -- command line -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rehearsal.carry", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="download, repack and write the carry folder (workstation)")
    b.add_argument("dest", type=Path, help="a git-ignored folder in the repository, e.g. .carry")
    b.add_argument("--release", default="0.5.11", help="the SGLang release whose carry set is "
                   "built (rehearsal/carry-set[-RELEASE].tsv; default %(default)s)")
    b.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="download cache (outside "
                   "the repository; default %(default)s)")
    b.add_argument("--limit-mib", type=float, default=LIMIT_BYTES / MIB,
                   help="working tree + carry folder limit (default %(default)s)")
    i = sub.add_parser("install", help="verify and install the carry folder (GPU host)")
    i.add_argument("dest", type=Path)
    i.add_argument("--target", type=Path, required=True, help="the venv that gets the wheels")
    i.add_argument("--tool-dir", type=Path, default=None,
                   help="where the tool's own wheel goes (default DEST/tool-site)")
    lk = sub.add_parser("lock", help="write sizes and sha256 of the registry's wheels into "
                        "rehearsal/carry-set.tsv (downloads what the cache lacks)")
    lk.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    lk.add_argument("--release", default="0.5.11")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "build":
            build(args.dest, carry_set=carry_set_for(args.release), cache=args.cache,
                  limit=int(args.limit_mib * MIB))
        elif args.cmd == "install":
            install(args.dest, args.target, tool_dir=args.tool_dir)
        else:
            path = carry_set_for(args.release)
            _say(f"locked {lock(path, cache=args.cache)} rows of {path}")
    except CarryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
