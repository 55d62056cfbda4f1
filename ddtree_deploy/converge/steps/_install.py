"""Install Python packages into a host's venv with uv, from a wheelhouse the workstation ships.

GPU hosts (and the lab's containers) often have no route to the registry. The
workstation downloads the wheels a host needs with `pip download` for the host's
Python and glibc (`wheelhouse`), pushes the ones the host lacks into
~/.ddtree-deploy/wheelhouse/ and runs `uv pip install --offline --no-index
--find-links` there (`install`). uv itself comes from the host when it has one,
else from the uv wheel on the registry (`ensure_uv`, in `_install_uv.py`).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement
from packaging.requirements import Requirement as Pep508
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from ddtree_deploy import xdg
from ddtree_deploy.converge.steps._install_uv import ensure_uv, here, remote_home
from ddtree_deploy.errors import CommandTimeout, ConfigError, DeployError, RemoteCommandError
from ddtree_deploy.transport import Command, ExecTransport
from ddtree_deploy.transport.command import mask_secrets

__all__ = [
    "Requirement",
    "ensure_uv",
    "host_wheelhouse",
    "install",
    "platform_tags",
    "satisfied",
    "uninstall",
    "wheelhouse",
]

GLIBC_FLOOR = 17  # manylinux_2_17 (manylinux2014): the oldest tag still published widely
PIP_TIMEOUT = 1800.0
UV_TIMEOUT = 1800.0
MANIFEST = "index.json"
_PY = re.compile(r"3\.(\d+)(?:\.(\d+))?\Z")
_GLIBC = re.compile(r"2\.(\d+)(?:\.\d+)*\Z")
_PIP_FILE = re.compile(r"(?:Saved|File was already downloaded)\s+(\S.*\.whl)\s*$")


def _parse(text: str) -> Pep508:
    try:
        return Pep508(text)
    except InvalidRequirement as exc:
        raise ConfigError(f"not a valid requirement: {text!r} ({exc})") from None


@dataclass(frozen=True)
class Requirement:
    """One package to install: PEP 508 text, and whether its dependencies come along.

    deps=False for sglang itself (its dependencies are the CUDA lane and the pinned
    extras, managed separately); True for extras such as soundfile (cffi, pycparser).
    """

    text: str
    deps: bool

    def __post_init__(self) -> None:
        req = _parse(self.text)
        if req.url:
            raise ConfigError(f"a direct URL cannot come from the wheelhouse: {self.text!r}")

    @property
    def name(self) -> str:
        return canonicalize_name(_parse(self.text).name)


def satisfied(req_text: str, distributions: dict[str, str]) -> bool:
    """Whether the installed `distributions` (name -> version, from facts) meet `req_text`.

    Names are compared canonically; prereleases count when the specifier names them
    or allows any version. A version that is not PEP 440 never satisfies.
    """
    req = _parse(req_text)
    want = canonicalize_name(req.name)
    found = next((v for n, v in distributions.items() if canonicalize_name(n) == want), None)
    if found is None:
        return False
    try:
        version = Version(found)
    except InvalidVersion:
        return False
    return req.specifier.contains(version, prereleases=True)


# -- workstation: the wheelhouse ---------------------------------------------


def _python_tag(python_version: str) -> tuple[str, str]:
    """'3.11.2' -> ('cp311', '3.11.2'); bad input gives a ConfigError."""
    m = _PY.match(python_version.strip())
    if not m:
        raise ConfigError(f"not a CPython 3 version: {python_version!r} (expected like 3.11.2)")
    return f"cp3{m.group(1)}", python_version.strip()


def platform_tags(glibc: str | None) -> list[str]:
    """The wheel platforms a glibc host takes: manylinux_2_17 .. 2_N, manylinux2014, any.

    An unknown glibc (None) is taken as the manylinux2014 floor (2.17).
    """
    minor = GLIBC_FLOOR
    if glibc is not None:
        m = _GLIBC.match(glibc.strip())
        if not m:
            raise ConfigError(f"not a glibc version: {glibc!r} (expected like 2.36)")
        minor = int(m.group(1))
    tags = [f"manylinux_2_{n}_x86_64" for n in range(GLIBC_FLOOR, minor + 1)]
    if minor >= GLIBC_FLOOR:
        tags.append("manylinux2014_x86_64")
    return [*tags, "any"]


def _manifest(folder: Path) -> dict[str, list[str]]:
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(v, list)}


def _save_manifest(folder: Path, data: dict[str, list[str]]) -> None:
    from ddtree_deploy.atomicfile import replace_file

    replace_file(folder / MANIFEST, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def _pip_download(req: Requirement, folder: Path, version: str, plats: list[str],
                  beside: ExecTransport | None = None) -> list[str]:
    # --progress-bar off: its bars are drawn for a terminal; what pip says line by line
    # (Collecting, Downloading NAME (SIZE), Saved) is what apply shows while it runs
    argv = [sys.executable, "-m", "pip", "download", "--only-binary=:all:",
            "--python-version", version, "--implementation", "cp",
            "--dest", str(folder), "--progress-bar", "off", "--disable-pip-version-check"]
    for plat in plats:
        argv += ["--platform", plat]
    if not req.deps:
        argv.append("--no-deps")
    argv.append(req.text)
    try:
        proc = here(beside).run(Command(tuple(argv), env={"COLUMNS": "1000"}),
                                timeout=PIP_TIMEOUT)
    except CommandTimeout:
        raise DeployError(f"pip download {req.text} took over {PIP_TIMEOUT:g}s") from None
    if proc.exit_code != 0:
        tail = "\n".join(("  | " + ln) for ln in mask_secrets(proc.stderr, proc.secrets)
                         .strip().splitlines()[-12:])
        raise DeployError(
            f"pip could not download {req.text} for CPython {version} "
            f"({plats[-2] if len(plats) > 1 else 'pure Python'} and older):\n{tail}",
            hint=f"the workstation needs the registry, or put the wheels into {folder}",
            output=proc.error_output(),
        )
    names: list[str] = []
    for line in proc.stdout.splitlines():
        m = _PIP_FILE.search(line)
        if m and Path(m.group(1)).name not in names:
            names.append(Path(m.group(1)).name)
    missing = [n for n in names if not (folder / n).is_file()]
    if not names or missing:
        raise DeployError(f"pip download {req.text} reported no wheel files in {folder}"
                          + (f" (missing: {', '.join(missing)})" if missing else ""))
    return names


def wheelhouse(
    reqs: list[Requirement],
    *,
    python_version: str,
    glibc: str | None,
    cache: Path | None = None,
    beside: ExecTransport | None = None,
) -> list[Path]:
    """The wheel files a host (CPython `python_version`, `glibc`) needs for `reqs`.

    Downloads with pip's own resolver for the target interpreter and platforms into
    <cache>/wheelhouse/cp3XX/ (cache: the XDG cache folder unless given). What each
    requirement resolved to is remembered there (index.json), so asking again runs
    no pip and touches no network while the files are still in place. pip's commands and
    output are told as `beside`'s are (see `here`).
    """
    tag, version = _python_tag(python_version)
    plats = platform_tags(glibc)
    folder = (cache if cache is not None else xdg.cache_dir()) / "wheelhouse" / tag
    folder.mkdir(parents=True, exist_ok=True)
    manifest = _manifest(folder)
    out: list[Path] = []
    for req in reqs:
        key = f"{_parse(req.text)}|deps={req.deps}|python={version}|glibc={glibc}"
        names = manifest.get(key)
        if not names or not all((folder / n).is_file() for n in names):
            names = _pip_download(req, folder, version, plats, beside)
            manifest[key] = names
            _save_manifest(folder, manifest)
        out += [folder / n for n in names if folder / n not in out]
    return out


# -- host: push and install ---------------------------------------------------


def host_wheelhouse(t: ExecTransport) -> str:
    """The host's wheel folder: ~/.ddtree-deploy/wheelhouse of the connecting user."""
    return f"{remote_home(t)}/.ddtree-deploy/wheelhouse"


_LIST = (
    'for f in "$1"/*.whl; do [ -f "$f" ] && '
    'printf "%s\\t%s\\n" "${f##*/}" "$(wc -c < "$f")"; done; exit 0'
)


def _push(t: ExecTransport, wheels: list[Path], hostdir: str) -> list[str]:
    """Push the wheels the host's folder lacks (by name and size); returns the names pushed."""
    t.run(Command.of("mkdir", "-p", "--", hostdir)).check()
    have: dict[str, int] = {}
    for line in t.run(Command.shell(_LIST, hostdir)).check().stdout.splitlines():
        name, _, count = line.partition("\t")
        if count.strip().isdecimal():
            have[name] = int(count)
    pushed: list[str] = []
    for wheel in wheels:
        try:
            size = wheel.stat().st_size
        except OSError as exc:
            raise DeployError(f"wheel not readable on the workstation: {wheel} ({exc})") from None
        if have.get(wheel.name) == size:
            continue
        with wheel.open("rb") as src:
            t.put_stream(src, f"{hostdir}/{wheel.name}", mode=0o644)
        pushed.append(wheel.name)
    return pushed


def _venv_python(t: ExecTransport, venv: str, *, sudo: bool) -> str:
    python = venv.rstrip("/") + "/bin/python"
    if not t.run(Command.of("test", "-x", python, sudo=sudo)).ok:
        raise RemoteCommandError(f"{t.host}: no venv at {venv} ({python} is missing)")
    return python


def _uv(t: ExecTransport, argv: list[str], what: str, *, sudo: bool) -> str:
    result = t.run(Command(tuple(argv), sudo=sudo), timeout=UV_TIMEOUT)
    output = (result.stdout + result.stderr).strip()
    if not result.ok:
        tail = "\n".join("  | " + ln for ln in mask_secrets(result.stderr, result.secrets)
                         .strip().splitlines()[-15:])
        raise RemoteCommandError(f"{t.host}: uv could not {what} (exit {result.exit_code}):\n"
                                 f"{tail}", output=result.error_output())
    return output


def install(
    t: ExecTransport,
    venv: str,
    reqs: list[Requirement],
    wheels: list[Path],
    *,
    sudo: bool,
) -> str:
    """Install `reqs` into `venv` on the host, offline, from the pushed `wheels`.

    One uv call for the deps=False requirements (with --no-deps), one for the rest.
    Returns uv's output; an unmet requirement raises RemoteCommandError with uv's words.
    """
    if not reqs:
        return ""
    uv = ensure_uv(t, sudo=sudo)
    python = _venv_python(t, venv, sudo=sudo)
    hostdir = host_wheelhouse(t)
    _push(t, wheels, hostdir)
    base = [uv, "pip", "install", "--python", python, "--offline", "--no-index",
            "--find-links", hostdir]
    outputs: list[str] = []
    alone = [r.text for r in reqs if not r.deps]
    along = [r.text for r in reqs if r.deps]
    if alone:
        outputs.append(_uv(t, [*base, "--no-deps", *alone], f"install {' '.join(alone)}",
                           sudo=sudo))
    if along:
        outputs.append(_uv(t, [*base, *along], f"install {' '.join(along)}", sudo=sudo))
    return "\n".join(o for o in outputs if o)


def uninstall(t: ExecTransport, venv: str, names: list[str], *, sudo: bool) -> str:
    """Remove the distributions `names` from `venv` (uv pip uninstall); returns uv's output."""
    if not names:
        return ""
    for name in names:
        _parse(name)
    uv = ensure_uv(t, sudo=sudo)
    python = _venv_python(t, venv, sudo=sudo)
    return _uv(t, [uv, "pip", "uninstall", "--python", python, *names],
               f"uninstall {' '.join(names)}", sudo=sudo)
