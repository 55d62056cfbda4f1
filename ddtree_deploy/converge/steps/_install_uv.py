"""uv on a host: the host's own, else the binary from the uv wheel, pushed once.

The workstation downloads the manylinux x86_64 uv wheel (`pip download`), takes the
static `uv` binary out of it (uv-*.data/scripts/uv) and pushes it to
~/.ddtree-deploy/bin/uv on the host; later runs re-use it while `uv --version`
still names the pinned version.
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

from ddtree_deploy import xdg
from ddtree_deploy.errors import CommandTimeout, DeployError, RemoteCommandError
from ddtree_deploy.transport import Command, ExecTransport
from ddtree_deploy.transport.command import mask_secrets
from ddtree_deploy.transport.local import LocalTransport

UV_VERSION = "0.13.9"  # the uv the workstation uses; pushed to hosts that have none
UV_PLATFORM = "manylinux_2_17_x86_64"
_VERSION = re.compile(r"^uv (\d+\.\d+\.\d+\S*)")
# A host's own uv: on PATH, or where its installers put it (not on a non-login PATH).
_FIND = (
    'p=$(command -v uv 2>/dev/null) && case "$p" in /*) printf "%s\\n" "$p"; exit 0;; esac; '
    'for p in "$HOME/.local/bin/uv" "$HOME/.cargo/bin/uv"; do '
    '[ -x "$p" ] && { printf "%s\\n" "$p"; exit 0; }; done; exit 1'
)


def remote_home(t: ExecTransport) -> str:
    """$HOME of the connecting user on the host (absolute, no trailing slash)."""
    home = t.run(Command.shell('printf "%s" "$HOME"')).check().stdout.strip()
    if not home.startswith("/"):
        raise RemoteCommandError(f"{t.host}: $HOME is not set to an absolute path ({home!r})")
    return home.rstrip("/") or "/"


def uv_version(t: ExecTransport, uv: str, *, sudo: bool) -> str | None:
    """The version `uv --version` prints on the host, or None when it does not run."""
    result = t.run(Command.of(uv, "--version", sudo=sudo), timeout=60)
    m = _VERSION.match(result.stdout.strip()) if result.ok else None
    return m.group(1) if m else None


def here(beside: ExecTransport | None) -> LocalTransport:
    """The workstation as a transport, for what a step runs here (pip download): its commands
    are told to `beside`'s observers and listeners marked "(workstation)", with the same
    values masked."""
    local = LocalTransport("workstation")
    if beside is not None:
        local.tell_as(beside, "workstation")
    return local


def uv_binary(version: str = UV_VERSION, *, cache: Path | None = None,
              beside: ExecTransport | None = None) -> Path:
    """The uv binary of the manylinux x86_64 wheel, downloaded and extracted once (pip's
    command and lines told as `beside`'s are: see `here`)."""
    folder = (cache if cache is not None else xdg.cache_dir()) / "uv"
    binary = folder / version / "uv"
    if binary.is_file():
        return binary
    folder.mkdir(parents=True, exist_ok=True)
    wheels = sorted(folder.glob(f"uv-{version}-*.whl"))
    if not wheels:
        argv = (sys.executable, "-m", "pip", "download", f"uv=={version}", "--only-binary=:all:",
                "--platform", UV_PLATFORM, "--no-deps", "--dest", str(folder),
                "--progress-bar", "off", "--disable-pip-version-check")
        try:
            proc = here(beside).run(Command(argv), timeout=600)
        except CommandTimeout:
            raise DeployError(f"pip download uv=={version} took over 600s") from None
        wheels = sorted(folder.glob(f"uv-{version}-*.whl"))
        if not proc.ok or not wheels:
            tail = "\n".join("  | " + ln for ln in mask_secrets(proc.stderr, proc.secrets)
                             .strip().splitlines()[-8:])
            raise DeployError(f"could not download the uv {version} wheel:\n{tail}",
                              hint=f"put uv-{version}-py3-none-{UV_PLATFORM}*.whl into {folder}",
                              output=proc.error_output())
    _extract(wheels[0], binary)
    return binary


def _extract(wheel: Path, binary: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as zf:
            member = next((n for n in zf.namelist()
                           if re.fullmatch(r"uv-[^/]+\.data/scripts/uv", n)), None)
            if member is None:
                raise DeployError(f"{wheel.name} holds no uv-*.data/scripts/uv")
            data = zf.read(member)
    except (OSError, zipfile.BadZipFile) as exc:
        raise DeployError(f"cannot read the uv wheel {wheel}: {exc}") from None
    from ddtree_deploy.atomicfile import replace_file

    replace_file(binary, data, mode=0o755)  # a full disk: the path named, no temporary left


def ensure_uv(
    t: ExecTransport,
    *,
    sudo: bool,
    version: str = UV_VERSION,
    cache: Path | None = None,
) -> str:
    """The path of a working uv on the host, pushing the pinned one when the host has none.

    The host's own uv (found and run as the installing user: root when `sudo`) wins;
    else ~/.ddtree-deploy/bin/uv when it reports `version`; else that file is
    (re)written from the uv wheel on the workstation.
    """
    found = t.run(Command.shell(_FIND, sudo=sudo), timeout=60)
    own = found.stdout.strip().splitlines()[0] if found.ok and found.stdout.strip() else ""
    if own and uv_version(t, own, sudo=sudo):
        return own
    target = f"{remote_home(t)}/.ddtree-deploy/bin/uv"
    if uv_version(t, target, sudo=sudo) == version:
        return target
    machine = t.run(Command.of("uname", "-m")).check().stdout.strip()
    if machine != "x86_64":
        raise DeployError(f"{t.host}: no uv there, and the shipped uv is for x86_64, not "
                          f"{machine}", hint="install uv on the host (it is on PyPI as 'uv')")
    binary = uv_binary(version, cache=cache, beside=t)
    t.run(Command.of("mkdir", "-p", "--", target.rsplit("/", 1)[0])).check()
    with binary.open("rb") as src:
        t.put_stream(src, target, mode=0o755)
    got = uv_version(t, target, sudo=sudo)
    if got != version:
        raise RemoteCommandError(f"{t.host}: the pushed uv at {target} does not run "
                                 f"(uv --version gave {got!r}, expected {version})")
    return target
