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
  OpenSSH masters it talks through (detached, so never waited for: counted like a host's);
- the machine: /proc/stat's busy time, so what nobody above used (other jobs, the kernel's
  network softirqs outside any process) is shown as the rest.

Run as root (the lab is), so every /proc/<pid>/ns/pid can be read.
"""

from __future__ import annotations

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


def _busy_ticks() -> int:
    cpu = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    vals = [int(v) for v in cpu[:8]]  # user nice system idle iowait irq softirq steal
    return sum(vals) - vals[3] - vals[4]


@dataclass
class CpuReport:
    """Seconds of CPU per host and per (host, program), the command's wall time."""

    wall: float
    hosts: dict[str, float]
    programs: dict[str, dict[str, float]]
    machine: float

    def line(self) -> str:
        hosts = ", ".join(f"{h} {s:.1f}" for h, s in sorted(self.hosts.items()))
        rest = self.machine - sum(self.hosts.values())
        return f"CPU-s: {hosts}; the rest of the machine {rest:.1f} (machine {self.machine:.1f})"

    def as_dict(self) -> dict[str, object]:
        return {"wall": round(self.wall, 2), "machine": round(self.machine, 2),
                "hosts": {k: round(v, 2) for k, v in self.hosts.items()},
                "programs": {h: {k: round(v, 2) for k, v in sorted(p.items(), key=lambda kv:
                                                                   -kv[1]) if v >= 0.05}
                             for h, p in self.programs.items()}}


@dataclass
class _Sampler:
    namespaces: dict[str, str]
    masters: tuple[str, ...]  # substrings of an OpenSSH master's command line (lab addresses)
    first: dict[tuple[int, int], int] = field(default_factory=dict)
    last: dict[tuple[int, int], tuple[str, str, int]] = field(default_factory=dict)
    others: set[tuple[int, int]] = field(default_factory=set)  # not the lab's: never again

    def host_of(self, pid: int) -> str | None:
        ns = _pidns(pid)
        if ns in self.namespaces:
            return self.namespaces[ns]
        argv = _cmdline(pid)
        if argv and argv[0].endswith("ssh") and "ControlPersist" in " ".join(argv) \
                and any(m in a for a in argv for m in self.masters):
            return WORKSTATION
        return None

    def sample(self, initial: bool = False) -> dict[str, int]:
        """One pass over /proc; the per-host exact sums (own + waited) of live processes."""
        totals: dict[str, int] = defaultdict(int)
        for pid in _pids():
            p = _read(pid)
            if p is None:
                continue
            key = (pid, p.start)
            if key in self.others:
                continue
            if key in self.last:
                host = self.last[key][0]
            else:
                h = self.host_of(pid)
                if h is None:
                    self.others.add(key)
                    continue
                host = h
            self.last[key] = (host, p.comm, p.own)
            if initial:
                self.first[key] = p.own
            totals[host] += p.own + p.waited
        return totals


def run_measured(argv: list[str], env: dict[str, str], namespaces: dict[str, str],
                 masters: tuple[str, ...], *, timeout: float = 900,
                 interval: float = 0.5) -> tuple[subprocess.CompletedProcess[str], CpuReport]:
    """Run argv to its end (stdout, stderr captured) with the CPU of every lab host counted."""
    s = _Sampler(namespaces, masters)
    start = s.sample(initial=True)
    busy0 = _busy_ticks()
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval):
            s.sample()

    thread = threading.Thread(target=loop, daemon=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    thread.start()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    finally:
        stop.set()
        thread.join()
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    end = s.sample()
    machine = (_busy_ticks() - busy0) / TICK
    hosts = {h: (end.get(h, 0) - start.get(h, 0)) / TICK for h in set(start) | set(end)}
    cli = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    hosts[WORKSTATION] = hosts.get(WORKSTATION, 0.0) + cli
    programs: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for key, (host, comm, own) in s.last.items():
        programs[host][comm] += (own - s.first.get(key, 0)) / TICK
    programs[WORKSTATION]["the command (rusage)"] += cli
    return proc, CpuReport(wall, hosts, {h: dict(p) for h, p in programs.items()}, machine)
