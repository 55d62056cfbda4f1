"""CPU seconds per lab host (and per program on it) while one command runs, from /proc.

The lab's hosts are systemd-nspawn containers of this machine, each in its own PID
namespace, so their processes are this machine's processes: no agent on the hosts.

- per host, exact: at the start and the end, the sum over its live processes of
  utime + stime + cutime + cstime (a process that ended during the run is in the cutime of
  the process that reaped it: its sshd, its shell, the container's init), end minus start;
- per program (sshd, zstd, python3 ...), close: a sampler thread reads every process every
  `interval` seconds and keeps each one's last utime + stime (a process that ends loses at
  most its last interval; pipelines that run for the whole stream lose a few percent);
- the workstation: the command's own rusage (it and every child it waited for) and the
  OpenSSH masters it talks through (detached, so never waited for: counted like a host's;
  a master retitles itself `<control path> [mux]`, so it is known by its TCP connection to
  a lab address);
- the machine: /proc/stat's busy time, so what nobody above used (other jobs, kernel
  threads, the kernel's irq and softirq time) is shown as the rest, with the irq/softirq
  part and the other processes by program (sampled as above).

Run as root (the lab is), so every /proc/<pid>/ns/pid can be read.
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
WORKSTATION = "workstation"
OTHER = "other processes (sampled)"
COMMAND = "the command's processes (sampled)"


@dataclass
class _Proc:
    comm: str
    ppid: int
    start: int
    own: int  # utime + stime, ticks
    waited: int  # cutime + cstime, ticks


def _read(pid: int) -> _Proc | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    head, _, rest = raw.rpartition(")")
    comm = head.partition("(")[2]
    f = rest.split()
    # fields after the name: state ppid ... utime(12) stime(13) cutime(14) cstime(15) ...
    # starttime(20), counted from the state field at 0
    return _Proc(comm, int(f[1]), int(f[19]), int(f[11]) + int(f[12]), int(f[13]) + int(f[14]))


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _pidns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def lab_namespaces() -> dict[str, str]:
    """PID namespace -> lab host name, from each systemd-nspawn's --machine and its child."""
    machines: dict[int, str] = {}
    for pid in _pids():
        argv = _cmdline(pid)
        if argv and argv[0].endswith("systemd-nspawn"):
            for a in argv:
                if a.startswith("--machine="):
                    machines[pid] = a.split("=", 1)[1]
    out: dict[str, str] = {}
    for pid in _pids():
        p = _read(pid)
        if p is not None and p.ppid in machines and (ns := _pidns(pid)):
            out[ns] = machines[p.ppid]
    return out


def _busy_ticks() -> tuple[int, int]:
    """(busy, irq + softirq) ticks of the whole machine."""
    cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    vals = [int(v) for v in cpu[:8]]  # user nice system idle iowait irq softirq steal
    return sum(vals) - vals[3] - vals[4], vals[5] + vals[6]


def _tcp_peers(addresses: tuple[str, ...]) -> set[str]:
    """Socket inodes of this namespace's TCP connections to any of the addresses."""
    def hexed(a: str) -> str:
        return "".join(f"{int(o):02X}" for o in reversed(a.split(".")))

    want = {hexed(a) for a in addresses}
    inodes: set[str] = set()
    with contextlib.suppress(OSError):
        for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            f = row.split()
            if f[2].split(":")[0] in want:
                inodes.add(f[9])
    return inodes


def _talks_to(pid: int, inodes: set[str]) -> bool:
    try:
        links = [os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")]
    except OSError:
        return False
    return any(link[8:-1] in inodes for link in links if link.startswith("socket:["))


@dataclass
class CpuReport:
    """Seconds of CPU per host and per (host, program), the command's wall time."""

    wall: float
    hosts: dict[str, float]
    programs: dict[str, dict[str, float]]  # OTHER: processes of nobody above
    machine: float
    irq: float = 0.0  # the machine's irq + softirq seconds (part of the rest)

    def line(self) -> str:
        hosts = ", ".join(f"{h} {s:.1f}" for h, s in sorted(self.hosts.items()))
        rest = self.machine - sum(self.hosts.values())
        return (f"CPU-s: {hosts}; the rest of the machine {rest:.1f} (irq+softirq "
                f"{self.irq:.1f}; machine {self.machine:.1f})")

    def as_dict(self) -> dict[str, object]:
        return {"wall": round(self.wall, 2), "machine": round(self.machine, 2),
                "irq": round(self.irq, 2),
                "hosts": {k: round(v, 2) for k, v in self.hosts.items()},
                "programs": {h: {k: round(v, 2) for k, v in sorted(p.items(), key=lambda kv:
                                                                   -kv[1]) if v >= 0.05}
                             for h, p in self.programs.items()}}


@dataclass
class _Sampler:
    namespaces: dict[str, str]
    masters: tuple[str, ...]  # the lab's addresses: an OpenSSH master connected to one
    first: dict[tuple[int, int], int] = field(default_factory=dict)
    last: dict[tuple[int, int], tuple[str, str, int]] = field(default_factory=dict)

    command: set[int] = field(default_factory=set)  # the command's process tree

    def host_of(self, pid: int, p: _Proc) -> str:
        ns = _pidns(pid)
        if ns in self.namespaces:
            return self.namespaces[ns]
        if p.comm == "ssh" and any(a.endswith("[mux]") for a in _cmdline(pid)) \
                and _talks_to(pid, _tcp_peers(self.masters)):
            return WORKSTATION
        if pid in self.command or p.ppid in self.command:  # in its rusage once waited for
            self.command.add(pid)
            return COMMAND
        return OTHER

    def sample(self, initial: bool = False) -> dict[str, int]:
        """One pass over /proc; the per-host exact sums (own + waited) of live processes."""
        totals: dict[str, int] = defaultdict(int)
        for pid in _pids():
            p = _read(pid)
            if p is None:
                continue
            key = (pid, p.start)
            host = self.last[key][0] if key in self.last else self.host_of(pid, p)
            self.last[key] = (host, p.comm, p.own)
            if initial:
                self.first[key] = p.own
            if host not in (OTHER, COMMAND):
                totals[host] += p.own + p.waited
        return totals


def run_measured(argv: list[str], env: dict[str, str], namespaces: dict[str, str],
                 masters: tuple[str, ...], *, timeout: float = 900,
                 interval: float = 0.5) -> tuple[subprocess.CompletedProcess[str], CpuReport]:
    """Run argv to its end (stdout, stderr captured) with the CPU of every lab host counted."""
    s = _Sampler(namespaces, masters)
    start = s.sample(initial=True)
    busy0, irq0 = _busy_ticks()
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            s.sample()

    thread = threading.Thread(target=loop, daemon=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=env) as child:
        s.command.add(child.pid)
        thread.start()
        try:
            out, err = child.communicate(timeout=timeout)
        finally:
            stop.set()
            thread.join()
    proc = subprocess.CompletedProcess(argv, child.returncode, out, err)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    end = s.sample()
    busy1, irq1 = _busy_ticks()
    machine, irq = (busy1 - busy0) / TICK, (irq1 - irq0) / TICK
    hosts = {h: (end.get(h, 0) - start.get(h, 0)) / TICK for h in set(start) | set(end)}
    cli = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    hosts[WORKSTATION] = hosts.get(WORKSTATION, 0.0) + cli
    programs: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for key, (host, comm, own) in s.last.items():
        programs[host][comm] += (own - s.first.get(key, 0)) / TICK
    programs[WORKSTATION]["the command (rusage)"] += cli
    return proc, CpuReport(wall, hosts, {h: dict(p) for h, p in programs.items()}, machine,
                           irq)
