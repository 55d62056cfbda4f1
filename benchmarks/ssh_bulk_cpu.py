"""Benchmark: where the CPU of a bulk stream over OpenSSH goes (mux or direct, by cipher).

The lab up with `--link-rate` (tc tbf both ways on each host's link, as
overlay_real_lane.py and overlay_streams.py run it). BYTES of random data (made once in
memory, kept in /dev/shm here and in /root on the source host) then go, alternating in each
round (the variants' order rotates from round to round):

- up: the workstation's file into `ssh ct200 'cat >/dev/null'` (the overlay's push);
- down: `ssh ct129 'cat FILE'` into /dev/null here (the overlay's fetch);

for each variant:

- mux: the tool's own OpenSSH options (OpenSshTransport's argv for a stream: its base
  options, HostKeyAlgorithms, ControlMaster=auto, ControlPersist, -T -e none), through a
  master started before the measured stream (its own control socket per cipher, in a
  private temporary folder: a master's cipher is fixed when it connects);
- direct: the same options with `-S none -o ControlMaster=no`: the client connects itself
  (its key exchange and authentication are in the measured run, a few ms of CPU);
- each with the tool's default cipher (the one negotiated is printed), `-c
  aes128-gcm@openssh.com` and `-c chacha20-poly1305@openssh.com` (`-c` stands over the
  transport's `-o Ciphers=`). "default" is the tool's own preference read from `_base`:
  OpenSSH's default, chacha20-poly1305 first, in runs F1-F3; aes128-gcm first since the
  transport's CIPHERS (RESULTS, overlay, run G), so it now measures what aes128-gcm does.

CPU seconds from /proc (benchmarks/cpu_by_host.py's sampler): the local ssh client exactly
(this process's children's rusage), the master exactly (alive at both ends of the run), the
host's processes exactly (its PID namespace; `sshd` by program, sampled every 0.2 s) and the
whole machine (/proc/stat, with its irq + softirq: the veths, tc and TCP), and the system
(kernel) part of the workstation's and of sshd's seconds (stime). Prints every run,
then the medians per variant and direction: MB/s, CPU-s per GB on the workstation (client +
master) and on the host (sshd).

    flock /tmp/ddtree-lab-session.lock .venv/bin/python benchmarks/ssh_bulk_cpu.py \
        [--rounds 3] [--mib 512] [--rate 1gbit|none]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cpu_by_host import TICK, WORKSTATION, _busy_ticks, _Sampler, lab_namespaces

from ddtree_deploy.transport.openssh import OpenSshTransport
from ddtree_lab import manager

CIPHERS = {"default": None, "aes128-gcm": "aes128-gcm@openssh.com",
           "chacha20": "chacha20-poly1305@openssh.com"}
REMOTE_FILE = "/root/ssh-bulk-cpu.bin"
SOURCE, TARGET = "ct129", "ct200"  # the overlay's fetch comes from ct129, its push goes to ct200


@dataclass
class Run:
    variant: str
    direction: str
    wall: float
    client: float  # the local ssh process
    master: float  # the ControlMaster (0 for direct)
    host: float  # every process of the far host
    sshd: float  # its sshd processes (sampled)
    machine: float
    irq: float
    ws_sys: float = 0.0  # the client's and the master's system (kernel) part
    sshd_sys: float = 0.0  # the host's sshd's system part (sampled)

    def mbps(self, nbytes: int) -> float:
        return nbytes / 1e6 / self.wall


def tool_argv(t: OpenSshTransport, control: Path | None, cipher: str | None,
              script: str) -> list[str]:
    """The argv the transport runs for a stream (openssh.py `_exec`), with its control socket
    at `control` (None: a direct connection) and the cipher, if any."""
    base = [*t._base, *t.cipher_options()]  # the tool's preference, as `_exec` adds it
    at = base.index("-S")
    base[at + 1] = str(control) if control is not None else "none"
    head = [base[0], *(["-c", cipher] if cipher else []), *base[1:]]
    algorithms = ",".join(t._pin())
    mux = (["-o", "ControlMaster=auto", "-o", "ControlPersist=900s"] if control is not None
           else ["-o", "ControlMaster=no"])
    return [*head, "-o", f"HostKeyAlgorithms={algorithms}", *mux, "-T", "-e", "none", "--",
            t.target, script]


def negotiated(argv: list[str]) -> str:
    """The cipher and MAC a connection with these options negotiates (ssh -v's kex line)."""
    verbose = [argv[0], "-o", "LogLevel=DEBUG1", *argv[1:]]  # the first value given wins
    done = subprocess.run(verbose, capture_output=True, text=True, timeout=30, check=False)
    lines = [ln for ln in done.stderr.splitlines() if "kex: server->client cipher" in ln]
    return lines[0].split("cipher:", 1)[1].strip() if lines else "unknown"


def _stime(pid: int) -> int | None:
    """A process's system ticks (stime, the 15th field of /proc/PID/stat)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[12])
    except (OSError, IndexError, ValueError):
        return None


def measure(argv: list[str], stdin: Path | None, namespaces: dict[str, str],
            addresses: tuple[str, ...], host: str) -> tuple[float, ...]:
    s = _Sampler(namespaces, addresses)
    start = s.sample(initial=True)
    sys_first: dict[tuple[int, int], int] = {}
    sys_last: dict[tuple[int, int], int] = {}

    def kernel_part() -> None:  # the system ticks of the master and the host's sshd
        for key, (h, comm, _) in list(s.last.items()):
            if (h == WORKSTATION or (h == host and comm.startswith("sshd"))) \
                    and (t := _stime(key[0])) is not None:
                sys_first.setdefault(key, t)
                sys_last[key] = t

    kernel_part()
    busy0, irq0 = _busy_ticks()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.2):
            s.sample()
            kernel_part()

    thread = threading.Thread(target=loop, daemon=True)
    t0 = time.monotonic()
    with (stdin.open("rb") if stdin else open(os.devnull, "rb")) as fh, \
            subprocess.Popen(argv, stdin=fh, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE) as child:
        s.command.add(child.pid)
        thread.start()
        try:
            _, err = child.communicate(timeout=600)
        finally:
            stop.set()
            thread.join()
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    end = s.sample()
    kernel_part()
    busy1, irq1 = _busy_ticks()
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv[-2:])}: exit {child.returncode}: "
                         f"{err.decode(errors='replace')[-400:]}")
    client = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    master = (end.get(WORKSTATION, 0) - start.get(WORKSTATION, 0)) / TICK
    host_s = (end.get(host, 0) - start.get(host, 0)) / TICK
    sshd = sum((own - s.first.get(key, 0)) / TICK for key, (h, comm, own) in s.last.items()
               if h == host and comm.startswith("sshd"))
    ksys = {h: sum(sys_last[k] - sys_first[k] for k in sys_last if s.last[k][0] == h) / TICK
            for h in (WORKSTATION, host)}
    return (wall, client, master, host_s, sshd, (busy1 - busy0) / TICK,
            (irq1 - irq0) / TICK, after.ru_stime - before.ru_stime + ksys[WORKSTATION],
            ksys[host])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--rate", default="1gbit", help="the lab's link rate, or none")
    args = ap.parse_args()
    nbytes = args.mib << 20
    manager.up(link_rate=None if args.rate == "none" else args.rate)
    lab = manager.lab_state_dir()
    runs: list[Run] = []
    masters: list[list[str]] = []
    try:
        rows = {r.name: r.address for r in manager.status()}
        addresses = tuple(rows.values())
        namespaces = lab_namespaces()
        inv = {v: k for k, v in namespaces.items()}
        assert SOURCE in inv and TARGET in inv, namespaces
        tr = {h: OpenSshTransport(rows[h], known_hosts=lab / "known_hosts", user="root",
                                  identity_file=lab / "id_ed25519", persist=900, name=h)
              for h in (SOURCE, TARGET)}
        with tempfile.TemporaryDirectory(prefix="sshcpu-") as sockdir, \
                tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
            local = Path(shm) / "blob"
            local.write_bytes(os.urandom(nbytes))
            put = tool_argv(tr[SOURCE], None, None, f"cat > {REMOTE_FILE}")
            with local.open("rb") as fh:
                subprocess.run(put, stdin=fh, check=True, timeout=600)
            for h in (SOURCE, TARGET):
                print(f"{h}: the default negotiates "
                      f"{negotiated(tool_argv(tr[h], None, None, 'true'))}", flush=True)
            variants = [(f"{mode} {name}", mode, cipher) for mode in ("mux", "direct")
                        for name, cipher in CIPHERS.items()]
            for n in range(args.rounds):
                k = n % len(variants)
                for label, mode, cipher in variants[k:] + variants[:k]:
                    for direction, host, script, stdin in (
                            ("up", TARGET, "cat >/dev/null", local),
                            ("down", SOURCE, f"cat {REMOTE_FILE}", None)):
                        control = None
                        if mode == "mux":
                            control = Path(sockdir) / f"{host}-{label.split()[1]}"
                            warm = tool_argv(tr[host], control, cipher, "true")
                            if warm not in masters:
                                masters.append(warm)
                            subprocess.run(warm, check=True, timeout=60,
                                           stdin=subprocess.DEVNULL)
                        argv = tool_argv(tr[host], control, cipher, script)
                        r = Run(label, direction, *measure(argv, stdin, namespaces,
                                                           addresses, host))
                        runs.append(r)
                        print(f"round {n + 1} {label:18} {direction:4} {r.wall:6.2f}s "
                              f"{r.mbps(nbytes):6.1f} MB/s  CPU-s: client {r.client:.2f} "
                              f"master {r.master:.2f} | {host} {r.host:.2f} (sshd "
                              f"{r.sshd:.2f}) | machine {r.machine:.2f} (irq {r.irq:.2f}) | "
                              f"system part: workstation {r.ws_sys:.2f}, sshd {r.sshd_sys:.2f}",
                              flush=True)
            for warm in masters:  # end the masters: -O exit on their sockets
                subprocess.run([*warm[:-3], "-O", "exit", *warm[-2:-1]], timeout=10,
                               check=False, capture_output=True)
            subprocess.run(tool_argv(tr[SOURCE], None, None, f"rm -f {REMOTE_FILE}"),
                           timeout=60, check=False)
    finally:
        manager.down()
    gb = nbytes / 1e9
    print(f"\n{args.mib} MiB per stream over a {args.rate} link, medians of {args.rounds} "
          "rounds (CPU-s per GB of payload):")
    print("| variant | direction | MB/s | workstation: client + master [system part] | host: "
          "sshd [system part] (all its processes) | machine (irq+softirq) |")
    print("|---|---|---|---|---|---|")
    for label in dict.fromkeys(r.variant for r in runs):
        for direction in ("up", "down"):
            sel = [r for r in runs if r.variant == label and r.direction == direction]

            def med(f: str, sel: list[Run] = sel) -> float:
                return statistics.median(getattr(r, f) for r in sel)

            ws = statistics.median((r.client + r.master) / gb for r in sel)
            print(f"| {label} | {direction} | {statistics.median(r.mbps(nbytes) for r in sel):.0f}"
                  f" | {ws:.2f} ({med('client') / gb:.2f} + {med('master') / gb:.2f}) "
                  f"[{med('ws_sys') / gb:.2f}] | {med('sshd') / gb:.2f} "
                  f"[{med('sshd_sys') / gb:.2f}] ({med('host') / gb:.2f}) | "
                  f"{med('machine') / gb:.2f} ({med('irq') / gb:.2f}) |")
    print(json.dumps([r.__dict__ for r in runs]))


if __name__ == "__main__":
    main()
