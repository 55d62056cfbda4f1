"""The carry set: the committed list of wheels the GPU rehearsal takes to the GPU host, the size
budget of one device call, and the manifest that `carry build` writes and `carry install` checks.

Stdlib only: `carry install` runs on the GPU host with nothing but its own Python.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

MIB = 1024 * 1024
#: what one device call may carry (working tree + carried paths) is 64 MiB; 1 MiB stays spare
#: (2 until session 4, when the tree's raw GPU results reached 5.09 MiB: 62.02 MiB in all).
LIMIT_BYTES = 63 * MIB
CARRY_SET = Path(__file__).with_name("carry-set.tsv")
#: one carry set per SGLang release: 0.5.11 (the patch set) is ``carry-set.tsv``, another release's
#: is ``carry-set-<release>.tsv`` (the plugin form)
DEFAULT_RELEASE = "0.5.11"


def carry_set_for(release: str) -> Path:
    """The carry set of ``release``; CarryError naming the sets there are when it has none."""
    path = CARRY_SET if release == DEFAULT_RELEASE else CARRY_SET.with_name(
        f"carry-set-{release}.tsv")
    if not path.is_file():
        have = [DEFAULT_RELEASE] + sorted(p.stem.removeprefix("carry-set-")
                                          for p in CARRY_SET.parent.glob("carry-set-*.tsv"))
        raise CarryError(f"no carry set for SGLang {release} (there are: {', '.join(have)})")
    return path
MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = "ddtree-rehearsal-carry/1"
COLUMNS = ("name", "version", "into", "repack", "size", "carried", "sha256", "filename", "why")
#: where an entry goes: the GPU host's venv, the tool's own folder, or nowhere (listed with why not)
INTO = ("venv", "tool", "skip")
#: the tool's requirements the GPU host's venv already has (KINDS.md's package list, 2026-11-17):
#: not carried; `carry install` checks their versions against the tool's own metadata
HOST_HAS = ("typer", "rich", "pyyaml", "jinja2", "packaging", "matplotlib")


class CarryError(Exception):
    """A carry-set problem reported to the user as one clear message (exit 1)."""


@dataclass(frozen=True)
class Entry:
    """One row of the carry set. `size`/`sha256`/`filename` are the registry's wheel; `carried` is
    the bytes expected in DEST (the repacked size for a repacked wheel)."""

    name: str
    version: str
    into: str
    repack: str
    size: int
    carried: int
    sha256: str
    filename: str
    why: str
    line: int = 0

    @property
    def carried_here(self) -> bool:
        return self.into != "skip"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _int(text: str, where: str, field: str) -> int:
    if text == "-":
        return 0
    try:
        value = int(text)
    except ValueError:
        raise CarryError(f"{where}: field {field!r} must be a whole number of bytes or '-', "
                         f"got {text!r}") from None
    if value < 0:
        raise CarryError(f"{where}: field {field!r} must not be negative, got {value}")
    return value


def parse_carry_set(text: str, source: str) -> list[Entry]:
    """Rows of tab-separated COLUMNS; '#' lines and blank lines are comments; the first other
    line is the header and must name COLUMNS in order."""
    entries: list[Entry] = []
    header_seen = False
    names: set[str] = set()
    for no, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip() or raw.startswith("#"):
            continue
        cells = raw.split("\t")
        where = f"{source}, line {no}"
        if not header_seen:
            if tuple(cells) != COLUMNS:
                raise CarryError(f"{where}: expected the header {' '.join(COLUMNS)} "
                                 f"(tab-separated), got {raw!r}")
            header_seen = True
            continue
        if len(cells) != len(COLUMNS):
            raise CarryError(f"{where}: expected {len(COLUMNS)} tab-separated fields "
                             f"({', '.join(COLUMNS)}), got {len(cells)}")
        row = dict(zip(COLUMNS, cells, strict=True))
        if row["into"] not in INTO:
            raise CarryError(f"{where}: field 'into' must be one of {', '.join(INTO)}, "
                             f"got {row['into']!r}")
        key = row["name"].lower().replace("-", "_")
        if key in names:
            raise CarryError(f"{where}: {row['name']} is listed twice (two versions of one "
                             "package stop the whole install)")
        names.add(key)
        sha = row["sha256"]
        if row["into"] != "skip" and sha != "-" and (
            len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha)
        ):
            raise CarryError(f"{where}: field 'sha256' must be 64 lowercase hex digits or '-', "
                             f"got {sha!r}")
        fn = row["filename"]
        if row["into"] != "skip" and fn != "-" and (
            "/" in fn or "\\" in fn or not fn.endswith(".whl")
        ):
            raise CarryError(f"{where}: field 'filename' must be a wheel's file name, got {fn!r}")
        entries.append(Entry(
            name=row["name"], version=row["version"], into=row["into"],
            repack="" if row["repack"] == "-" else row["repack"],
            size=_int(row["size"], where, "size"), carried=_int(row["carried"], where, "carried"),
            sha256="" if sha == "-" else sha, filename="" if fn == "-" else fn,
            why=row["why"], line=no,
        ))
    if not header_seen:
        raise CarryError(f"{source}: no header line ({' '.join(COLUMNS)})")
    return entries


def load_carry_set(path: Path = CARRY_SET) -> list[Entry]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CarryError(f"cannot read the carry set {path}: {exc.strerror}") from None
    return parse_carry_set(text, str(path))


def format_entry(e: Entry) -> str:
    cells = [e.name, e.version, e.into, e.repack or "-", str(e.size) if e.size else "-",
             str(e.carried) if e.carried else "-", e.sha256 or "-", e.filename or "-", e.why]
    return "\t".join(cells)


def replace_rows(text: str, entries: list[Entry]) -> str:
    """`text` with each entry's row (by line number) rewritten; comments and order kept."""
    lines = text.splitlines()
    for e in entries:
        lines[e.line - 1] = format_entry(e)
    return "\n".join(lines) + "\n"


def unlocked(entries: list[Entry]) -> list[Entry]:
    return [e for e in entries if e.carried_here and not (e.sha256 and e.filename and e.carried)]


# -- the size of one device call ----------------------------------------------------------------


def tree_bytes(repo: Path, exclude: Path | None = None) -> int:
    """Bytes the device tool sends as the working tree: git-tracked files plus untracked files git
    does not ignore (what `git ls-files -co --exclude-standard` lists), less anything under
    `exclude` (the carry folder, counted on its own)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "ls-files", "-co", "--exclude-standard", "-z"],
            check=True, capture_output=True,
        ).stdout
    except FileNotFoundError:
        raise CarryError("git is not installed: it measures the working tree") from None
    except subprocess.CalledProcessError as exc:
        msg = exc.stderr.decode(errors="replace").strip()
        raise CarryError(f"{repo} is not a git checkout ({msg})") from None
    ex = exclude.resolve() if exclude is not None else None
    total = 0
    for rel in out.split(b"\0"):
        if not rel:
            continue
        path = repo / os.fsdecode(rel)
        if ex is not None and (path.resolve() == ex or ex in path.resolve().parents):
            continue
        try:
            st = path.lstat()  # a deleted-but-tracked file sends nothing; a link travels as a link
        except FileNotFoundError:
            continue
        total += st.st_size
    return total


def folder_bytes(folder: Path) -> int:
    if not folder.exists():
        return 0
    return sum(p.lstat().st_size for p in folder.rglob("*") if not p.is_dir() or p.is_symlink())


def check_budget(parts: dict[str, int], limit: int = LIMIT_BYTES, *, when: str = "") -> int:
    """The total of `parts`; CarryError naming each part if it is over `limit`."""
    total = sum(parts.values())
    if total > limit:
        detail = ", ".join(f"{k} {v / MIB:.2f} MiB" for k, v in parts.items())
        raise CarryError(
            f"{when + ': ' if when else ''}working tree + carry set would be {total / MIB:.2f} MiB "
            f"({detail}), over the {limit / MIB:.0f} MiB a device call may carry (64 MiB with 2 "
            "spare); drop or shrink an entry of rehearsal/carry-set.tsv, or make the tree smaller"
        )
    return total


# -- the manifest -------------------------------------------------------------------------------


def _safe_rel(rel: object, where: str) -> PurePosixPath:
    if not isinstance(rel, str) or not rel:
        raise CarryError(f"{where}: 'path' must be a non-empty string")
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or "\\" in rel:
        raise CarryError(f"{where}: 'path' must stay inside the carry folder, got {rel!r}")
    return p


def read_manifest(dest: Path) -> dict:
    path = dest / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CarryError(f"{path}: no manifest; run `python -m rehearsal.carry build {dest}` on "
                         "the workstation first") from None
    except (OSError, ValueError) as exc:
        raise CarryError(f"{path}: not a readable JSON manifest ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise CarryError(f"{path}: expected a manifest of format {MANIFEST_FORMAT!r}")
    files = data.get("files")
    if not isinstance(files, list) or not files:
        raise CarryError(f"{path}: 'files' must be a non-empty list")
    for i, f in enumerate(files):
        where = f"{path}, files[{i}]"
        if not isinstance(f, dict):
            raise CarryError(f"{where}: expected an object")
        _safe_rel(f.get("path"), where)
        if f.get("into") not in ("venv", "tool"):
            raise CarryError(f"{where}: 'into' must be venv or tool, got {f.get('into')!r}")
        if not isinstance(f.get("sha256"), str) or not isinstance(f.get("size"), int):
            raise CarryError(f"{where}: needs 'sha256' (string) and 'size' (integer)")
    return data


def verify_manifest(dest: Path, data: dict) -> list[Path]:
    """Each listed file's path in `dest`, after checking its size and sha256; CarryError naming
    every file that is missing or differs."""
    problems: list[str] = []
    paths: list[Path] = []
    for f in data["files"]:
        path = dest / _safe_rel(f["path"], "manifest")
        paths.append(path)
        if not path.is_file():
            problems.append(f"{f['path']}: missing")
            continue
        size = path.stat().st_size
        if size != f["size"]:
            problems.append(f"{f['path']}: {size} bytes, the manifest says {f['size']}")
            continue
        got = sha256_file(path)
        if got != f["sha256"]:
            problems.append(f"{f['path']}: sha256 {got}, the manifest says {f['sha256']}")
    if problems:
        raise CarryError(f"{dest / MANIFEST_NAME}: the carry folder does not match its manifest "
                         "(refusing to install):\n  " + "\n  ".join(problems))
    return paths
