"""Gather facts: the probe goes to the host on stdin and comes back as JSON, in one round trip."""

from __future__ import annotations

import hashlib
import time
from functools import lru_cache
from typing import Any

from pydantic import ValidationError

from ddtree_deploy.config.hosts import Config, HostSpec
from ddtree_deploy.errors import RemoteCommandError
from ddtree_deploy.facts.cache import DEFAULT_MAX_AGE_S, FactsCache
from ddtree_deploy.facts.model import Facts
from ddtree_deploy.remote.bundle import FACTS, text
from ddtree_deploy.remote.runner import run_json
from ddtree_deploy.transport import Command
from ddtree_deploy.transport.base import ExecTransport
from ddtree_deploy.transport.connect import open_transport
from ddtree_deploy.transport.fanout import Outcome, fan_out

PROBE_TIMEOUT_S = 60.0
PROBE_BOOT = text("facts_boot.py")  # runs the probe sent on stdin as a module kept by its hash


def probe_source() -> str:
    """The probe as one stdlib-only script."""
    return FACTS.source()


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



def parse_output(host: str, data: dict[str, Any], duration: float) -> Facts:
    """The probe's JSON answer -> Facts, stamped with the host's name and the time taken."""
    data["host"] = host
    data["taken_at"] = time.time()
    data["duration_s"] = round(duration, 3)
    try:
        return Facts.model_validate(data)
    except ValidationError as exc:
        raise RemoteCommandError(f"{host}: the facts probe answered facts of the wrong form "
                                 f"({exc})") from exc


def gather(config: Config, spec: HostSpec, extra_venvs: list[str] | None = None,
           *, transport: ExecTransport | None = None) -> Facts:
    """Run the probe on the host: over `transport` when given, else over the host's
    connection for reads (an OpenSSH master kept open between runs, where allowed)."""
    cmd = probe_command(spec, extra_venvs, model_paths(config, spec))
    timeout = min(spec.command_timeout, PROBE_TIMEOUT_S)
    hint = "the facts probe needs python3 (3.8+) on the host"
    start = time.monotonic()
    if transport is not None:
        data = run_json(transport, cmd, timeout=timeout, what="the facts probe", hint=hint)
    else:
        with open_transport(config, spec, reuse=True) as t:
            start = time.monotonic()
            data = run_json(t, cmd, timeout=timeout, what="the facts probe", hint=hint)
    return parse_output(spec.name, data, time.monotonic() - start)


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

    fresh: set[str] = set()

    def one(name: str) -> Facts:
        spec = config.host(name)
        extra = (extra_venvs or {}).get(name, [])
        if not refresh:
            cached = cache.load(spec, max_age_s)
            if cached is not None and all(cached.venv(p) for p in extra) \
                    and all(cached.model(p) for p in model_paths(config, spec)):
                return cached
        facts = gather(config, spec, extra)
        fresh.add(name)
        return facts

    outcomes = fan_out(hosts, one, concurrency=concurrency)
    # Saved here, not in each host's thread: a cache that cannot be written (a full state
    # disk) is this machine's problem, one error naming the file, never a host's failure.
    for outcome in outcomes:
        if outcome.value is not None and outcome.host in fresh:
            cache.save(config.host(outcome.host), outcome.value)
    return outcomes
