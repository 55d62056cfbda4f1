"""`lab up | down | status`: bring the rehearsal hosts up, take them down, report.

`up` first clears whatever a killed run left behind (containers, mounts,
namespaces), found from the state file and by scanning the machine, so CI can
start from any state. Caches (rootfs, layers, wheels) stay across `down`;
`down --purge` removes them and the lab's keys too.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from ddtree_deploy import xdg
from ddtree_deploy.errors import TransportError
from ddtree_lab import container, keys, lock, netns, provision, rootfs, wheelhouse
from ddtree_lab.errors import LabError
from ddtree_lab.topology import SUBNET_PREFIX, LabHost, gpu_spec_json, lab_hosts

Report = Callable[[str], None]


@dataclass
class HostState:
    name: str
    address: str
    pid: int
    netns: str
    veth: str
    run_dir: str
    link_rate: str | None = None  # tc tbf rate on both ends of its link, None: unshaped


@dataclass
class HostStatus:
    name: str
    address: str
    running: bool
    ssh: bool
    pid: int | None


def lab_state_dir() -> Path:
    return xdg.state_dir() / "lab"


def lab_cache_dir() -> Path:
    return xdg.cache_dir() / "lab"


def _state_file() -> Path:
    return lab_state_dir() / "state.json"


def _load_state() -> list[HostState]:
    try:
        raw = json.loads(_state_file().read_text())
        return [HostState(**h) for h in raw.get("hosts", [])]
    except (OSError, ValueError, TypeError):
        return []


def _save_state(hosts: list[HostState]) -> None:
    _state_file().parent.mkdir(parents=True, exist_ok=True)
    tmp = _state_file().with_suffix(".tmp")
    tmp.write_text(json.dumps({"hosts": [asdict(h) for h in hosts]}, indent=2))
    tmp.replace(_state_file())


def _require_root() -> None:
    if os.geteuid() != 0:
        raise LabError("the lab needs root (systemd-nspawn, mounts, network namespaces)")


def _end_kept_connection(address: str) -> bool:
    """End the OpenSSH master the tool keeps to a lab host (facts: ssh_persist), if any."""
    from ddtree_deploy.config.schema import HostSpec
    from ddtree_deploy.transport import openssh
    from ddtree_deploy.transport.connect import openssh_transport

    if not openssh.available():
        return False
    spec = HostSpec.model_validate({"name": address, "address": address,
                                    "identity_file": str(lab_state_dir() / "id_ed25519"),
                                    "known_hosts": str(lab_state_dir() / "known_hosts")})
    try:
        return openssh_transport(spec).disconnect()
    except TransportError:  # no usable control folder: then no master either
        return False


def down(purge: bool = False, report: Report = lambda _m: None, wait_s: float = 0.0) -> list[str]:
    """Stop every lab container and remove mounts, namespaces and run folders.

    Holds the lab lock (waiting up to wait_s for another holder, then LabBusyError).
    """
    _require_root()
    with lock.hold(wait_s, waiting=lambda who: report(f"waiting for the lab: in use by {who}")):
        return _down(purge, report)


def _down(purge: bool, report: Report) -> list[str]:
    removed: list[str] = []
    run_root = lab_state_dir() / "run"
    for host in _load_state():
        if _end_kept_connection(host.address):
            report(f"ended the kept SSH connection to {host.name}")
            removed.append(f"ssh master {host.name}")
    pids = {h.pid for h in _load_state()} | set(container.nspawn_pids_for(run_root))
    for pid in sorted(pids):
        if container.pid_alive(pid) and any(
            a.startswith(f"--directory={run_root.resolve()}") for a in container.pid_cmdline(pid)
        ):
            report(f"stopping container (nspawn pid {pid})")
            container.stop(pid)
            removed.append(f"container pid {pid}")
    for pid in container.kill_orphans():
        report(f"killed orphaned container init (pid {pid})")
        removed.append(f"orphaned container pid {pid}")
    for point in container.mounts_under(run_root) + container.mounts_under(lab_cache_dir()):
        removed.append(f"mount {point}")
    container.unmount_all(run_root)
    container.unmount_all(lab_cache_dir())
    names = {h.netns: h.veth for h in _load_state()}
    for ns in netns.stale():
        names.setdefault(ns, ns[:15])
    for ns, veth in sorted(names.items()):
        netns.delete(ns, veth)
        removed.append(f"netns {ns}")
    netns.unguard_subnet(SUBNET_PREFIX)
    container.remove_tree(run_root)  # refuses if a mount could not be undone
    _state_file().unlink(missing_ok=True)
    if purge:
        for folder in (lab_cache_dir(), lab_state_dir()):
            if folder.exists():
                container.remove_tree(folder)
                removed.append(f"folder {folder}")
    return removed


def up(
    extra: int = 0, report: Report = lambda _m: None, boot_timeout: float = 60.0,
    wait_s: float = 0.0, link_rate: str | None = None,
) -> list[LabHost]:
    """Bring the lab up from whatever state the machine is in; return its hosts.

    Holds the lab lock (waiting up to wait_s for another holder, then LabBusyError).
    `link_rate` (a tc rate, "1gbit") shapes each host's link both ways; the next `up`
    without it and `down` leave the links unshaped (their namespaces are made anew).
    """
    _require_root()
    rate = netns.check_rate(link_rate) if link_rate is not None else None
    with lock.hold(wait_s, waiting=lambda who: report(f"waiting for the lab: in use by {who}")):
        return _up(extra, report, boot_timeout, rate)


def _up(extra: int, report: Report, boot_timeout: float, rate: str | None) -> list[LabHost]:
    hosts = lab_hosts(extra)
    leftovers = _down(False, report)
    if leftovers:
        report(f"cleared {len(leftovers)} leftovers of an earlier run")
    cache = lab_cache_dir()
    t0 = time.monotonic()
    report("root file system (debootstrap, cached)")
    base = rootfs.ensure_rootfs(cache)
    report("wheelhouse (registry wheels and stand-ins, cached)")
    wheel_root = cache / "wheels"
    real = wheelhouse.download_real(wheel_root / "real")
    wheels = {**real, **wheelhouse.build_standins(wheel_root / "standin", real)}
    layers: dict[str, Path] = {}
    for host in hosts:
        if host.kind not in layers:
            report(f"provisioning layer for {host.kind} (venvs, GPU stand-ins, cached)")
            layers[host.kind] = provision.ensure_layer(cache, base, host, wheels, wheel_root)
    lab_dir = lab_state_dir()
    client = keys.client_key(lab_dir)
    keys.write_known_hosts(lab_dir, hosts)
    states: list[HostState] = []
    try:
        netns.guard_subnet(SUBNET_PREFIX)
        for host in hosts:
            states.append(_start(host, base, layers[host.kind], lab_dir, client, rate))
            _save_state(states)
        report(f"booting {len(hosts)} hosts")
        with ThreadPoolExecutor(max_workers=min(8, len(states))) as pool:
            list(pool.map(lambda s: container.wait_for_ssh(s.address, boot_timeout, s.pid),
                          states))
    except BaseException:
        _down(False, report)
        raise
    shaped = f", links shaped to {rate} each way" if rate else ""
    report(f"lab up in {time.monotonic() - t0:.1f}s{shaped}")
    return hosts


def _start(host: LabHost, base: Path, layer: Path, lab_dir: Path, client: Path,
           rate: str | None) -> HostState:
    run_dir = lab_dir / "run" / host.name
    container.reset_dir(run_dir)
    merged = run_dir / "root"
    container.mount_overlay([layer, base], run_dir / "upper", run_dir / "work", merged)
    spec = json.dumps(gpu_spec_json(host), indent=2).encode()
    files = provision.run_files(host, spec, keys.host_key(lab_dir, host),
                                client.with_suffix(".pub"))
    provision.write_files(merged, files)
    os.chmod(merged / "root/.ssh", 0o700)
    netns.create(host)
    if rate is not None:
        netns.shape(host.netns, host.veth, rate)
    pid = container.boot(host, merged, run_dir / "console.log")
    return HostState(host.name, host.address, pid, host.netns, host.veth, str(run_dir), rate)


def status() -> list[HostStatus]:
    out = []
    for h in _load_state():
        alive = container.pid_alive(h.pid)
        ssh = False
        if alive:
            try:
                container.wait_for_ssh(h.address, 1.5, h.pid)
                ssh = True
            except LabError:
                ssh = False
        out.append(HostStatus(h.name, h.address, alive, ssh, h.pid if alive else None))
    return out
