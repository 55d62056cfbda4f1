"""Gather facts: the probe goes to the host on stdin and comes back as JSON, in one round trip."""

from __future__ import annotations

import hashlib
import json
import time
from functools import lru_cache
from pathlib import Path

from pydantic import ValidationError

from ddtree_deploy.config import Config, HostSpec
from ddtree_deploy.connect import open_transport
from ddtree_deploy.errors import RemoteCommandError
from ddtree_deploy.facts.cache import DEFAULT_MAX_AGE_S, FactsCache
from ddtree_deploy.facts.model import Facts
from ddtree_deploy.fanout import Outcome, fan_out
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.base import ExecTransport

PROBE_TIMEOUT_S = 60.0

# Runs the probe (sent on stdin) as a module kept in the user's cache on the host, named by its
# hash (argv[1], from the workstation): Python compiles it once and imports the cached bytecode
# after that. The kept file must equal what was sent, else it is written again; other versions
# are removed then. A home that cannot be written only means the probe is compiled each time.
# Run with `-I -S` (stdlib only: no site, no PYTHON* variables) and only os and sys loaded
# until a rewrite is needed: Python's start is most of a host's share of an inventory.
PROBE_BOOT = """
import os, sys
src, name = sys.stdin.buffer.read(), sys.argv[1]
home = os.path.expanduser("~/.cache/ddtree-deploy/probe")
try:
    if not (name.startswith("probe_") and name[6:].isalnum()):
        raise ValueError(name)
    path = os.path.join(home, name + ".py")
    try:
        with open(path, "rb") as fh:
            kept = fh.read() == src
    except OSError:
        kept = False
    pyc = os.path.join(home, "__pycache__", name + "." + sys.implementation.cache_tag + ".pyc")
    if not kept or not os.path.exists(pyc):
        import glob, py_compile, tempfile
        if not kept:  # absent, or cut short by a crash: write it whole, then swap it in
            os.makedirs(home, mode=0o700, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".probe-", dir=home)
            with os.fdopen(fd, "wb") as fh:
                fh.write(src)
            os.chmod(tmp, 0o600)
            os.replace(tmp, path)
            for old in glob.glob(os.path.join(home, "probe_*")) + glob.glob(
                    os.path.join(home, "__pycache__", "probe_*")):
                if os.path.basename(old).split(".")[0] != name:
                    os.unlink(old)
        py_compile.compile(path, doraise=True)  # also where PYTHONDONTWRITEBYTECODE is set
    sys.path.append(home)  # after the standard library: nothing there shadows it
    probe = __import__(name)
except Exception:  # no usable cache: run it as sent
    probe = type(sys)("probe")
    exec(compile(src, "<probe>", "exec"), probe.__dict__)
sys.exit(probe.main(sys.argv[2:] + ["--memo-code", name]))  # its memo is this version's
"""


def probe_source() -> str:
    """The probe as one stdlib-only script."""
    try:
        from ddtree_deploy.facts.bundle import probe_source as bundled
    except ImportError:
        return (Path(__file__).with_name("probe.py")).read_text(encoding="utf-8")
    return bundled()


@lru_cache(maxsize=4)
def probe_name(source: bytes) -> str:
    """The probe's module name on hosts: its hash (also the version its memo is tied to)."""
    return "probe_" + hashlib.sha256(source).hexdigest()[:16]


def model_paths(config: Config, spec: HostSpec) -> list[str]:
    """The model folders the host's entry and its deployments name."""
    paths = [str(p) for p in spec.models.values()]
    for dep in config.deployments_on(spec):
        paths += [str(p) for p in (dep.model_path, dep.draft_model_path) if p is not None]
    return list(dict.fromkeys(paths))


def probe_command(
    spec: HostSpec, extra_venvs: list[str] | None = None, models: list[str] | None = None
) -> Command:
    args = ["--host-name", spec.name, "--discover"]
    for path in [*(str(v.path) for v in spec.venvs.values()), *(extra_venvs or [])]:
        args += ["--venv", path]
    for path in models or []:
        args += ["--model", path]
    source = probe_source().encode()
    return Command(argv=("python3", "-I", "-S", "-c", PROBE_BOOT, probe_name(source), *args),
                   stdin=source)


def parse_output(host: str, stdout: str, duration: float) -> Facts:
    """The probe's JSON -> Facts, stamped with the host's name and the time taken."""
    try:
        data = json.loads(stdout)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        data["host"] = host
        data["taken_at"] = time.time()
        data["duration_s"] = round(duration, 3)
        return Facts.model_validate(data)
    except (ValueError, ValidationError) as exc:
        head = stdout.strip()[:200] or "(no output)"
        raise RemoteCommandError(f"{host}: the facts probe returned no valid JSON ({exc}); "
                                 f"it printed: {head}") from exc


def gather(config: Config, spec: HostSpec, extra_venvs: list[str] | None = None,
           *, transport: ExecTransport | None = None) -> Facts:
    """Run the probe on the host: over `transport` when given, else over the host's
    connection for reads (an OpenSSH master kept open between runs, where allowed)."""
    cmd = probe_command(spec, extra_venvs, model_paths(config, spec))
    timeout = min(spec.command_timeout, PROBE_TIMEOUT_S)
    if transport is not None:
        result = transport.run(cmd, timeout=timeout)
    else:
        with open_transport(config, spec, reuse=True) as t:
            result = t.run(cmd, timeout=timeout)
    if result.exit_code == 127 or "python3: not found" in result.stderr:
        raise RemoteCommandError(f"{spec.name}: python3 is not installed on the host; "
                                 "the facts probe needs it")
    if not result.ok:
        raise RemoteCommandError(f"{spec.name}: the facts probe failed (exit {result.exit_code}): "
                                 f"{result.stderr.strip()[-400:]}")
    return parse_output(spec.name, result.stdout, result.duration)


def collect(
    config: Config,
    hosts: list[str],
    *,
    cache: FactsCache,
    refresh: bool = False,
    max_age_s: float = DEFAULT_MAX_AGE_S,
    concurrency: int = 8,
    extra_venvs: dict[str, list[str]] | None = None,
) -> list[Outcome[Facts]]:
    """Facts for each host, from the cache when fresh, else gathered (in parallel)."""

    def one(name: str) -> Facts:
        spec = config.host(name)
        extra = (extra_venvs or {}).get(name, [])
        if not refresh:
            cached = cache.load(spec, max_age_s)
            if cached is not None and all(cached.venv(p) for p in extra) \
                    and all(cached.model(p) for p in model_paths(config, spec)):
                return cached
        facts = gather(config, spec, extra)
        cache.save(spec, facts)
        return facts

    return fan_out(hosts, one, concurrency=concurrency)
