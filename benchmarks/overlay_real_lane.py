"""Benchmark: the overlay on the real CUDA 13 lane vs the story's two `scp -r` hops.

The registry's nvidia-cublas 13.1.1.3, nvidia-cuda-nvrtc 13.0.88, nvidia-cusparse 12.6.3.3
and nvidia-nccl-cu13 2.30.7 wheels (`pip download`, kept in the XDG cache, never in the
repository) are installed into ct129's /root/ml-env (`pip install --no-deps
--force-reinstall`); the lab's links are shaped to 1 Gbit/s each way (`lab up
--link-rate 1gbit`). Then, alternating in each round:

- scp: `scp -r` of ct129's site-packages/nvidia to the workstation, then on to ct200;
- cold: `overlay --abi cu130 --to ct200:<fresh clone>` with an empty blob cache;
- warm: the same into a second fresh clone (the cache is warm: one hop);
- densify: the cold command leaves the cache's recompression running (detached, idle
  priority): the wait for it is timed on its own, then
- warm uses the recompressed cache (a later target; its frames go as stored where the
  target has zstd);
- unchanged: the warm command again;
- fleet: an empty cache, fresh clones on ct200 and the --extra hosts in one command;
  each extra target costs (fleet - cold) / extra.

Prints the median of the rounds (each round's figures too), each ratio against its
goal, and the per-stage seconds of the median overlay runs (from `--json`).
`--roots A B ...` compares checkouts of the tool side by side (e.g. a `git archive` of the
commit before a change, and the working tree): in each round, after the scp hops, every
overlay figure is taken for each root in turn (the CLI run with PYTHONPATH=root), and each
root gets its own medians and ratios against the same scp; with --cold-modes every mode
runs for each root (`--cold-only`: only those). Each root has its own OpenSSH control
folder, so none reuses a master (its cipher fixed at connect) another root started.
`--host-zstd` copies the workstation's zstd binary (the lab's containers are the same
Debian) into every lab host's /usr/local/bin first, as the real hosts have it; removed
at the end.
`--cold-modes never,always,auto` adds, in each round after the scp hops, one cold run per
mode (`overlay --compress MODE`, an empty cache and a fresh clone each; the order rotates
from round to round; each run's cache recompression waited for before the next), with the
CPU seconds of every lab host and of the workstation during each run and each scp hop
(benchmarks/cpu_by_host.py, from /proc); `--cold-only` skips the other cases.

    flock /tmp/ddtree-lab-session.lock .venv/bin/python benchmarks/overlay_real_lane.py \
        [--rounds 3] [--extra 2] [--host-zstd] [--roots /tmp/before /tmp/after] \
        [--cold-modes never,always,auto [--cold-only]]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cpu_by_host import CpuReport, lab_namespaces, run_measured
from lane_rounds import GOALS, Hosts, overlay_round, report, wait_gone

from ddtree_deploy import xdg
from ddtree_lab import manager

CLI = str(Path(sys.executable).with_name("ddtree-deploy"))
WHEELS = {"nvidia-cublas": "13.1.1.3", "nvidia-cuda-nvrtc": "13.0.88",
          "nvidia-cusparse": "12.6.3.3", "nvidia-nccl-cu13": "2.30.7"}


def wheel_dir() -> Path:
    folder = xdg.cache_dir() / "bench" / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    have = {p.name.split("-")[0].replace("_", "-") for p in folder.glob("*.whl")}
    missing = [f"{n}=={v}" for n, v in WHEELS.items() if n not in have]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d",
                        str(folder), *missing], check=True)
    return folder


def ssh_opts() -> list[str]:
    lab = manager.lab_state_dir()
    return ["-F", "none", "-i", str(lab / "id_ed25519"), "-o", "IdentitiesOnly=yes",
            "-o", f"UserKnownHostsFile={lab / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes",
            "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]


def ssh(address: str, script: str, timeout: float = 600) -> str:
    r = subprocess.run(["ssh", *ssh_opts(), f"root@{address}", script], capture_output=True,
                       text=True, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"{address}: {script[:80]}: {r.stderr.strip()[-500:]}")
    return r.stdout


def hosts_file(work: Path, rows: list[manager.HostStatus]) -> Path:
    lab = manager.lab_state_dir()
    text = "version: 1\nhosts:\n" + "".join(
        f"  {r.name}:\n    address: {r.address}\n    user: root\n"
        f"    identity_file: {lab / 'id_ed25519'}\n    known_hosts: {lab / 'known_hosts'}\n"
        for r in rows)
    path = work / "hosts.yaml"
    path.write_text(text)
    return path


def host_zstd(addresses: list[str], remove: bool = False) -> None:
    for a in addresses:
        if remove:
            ssh(a, "rm -f /usr/local/bin/zstd")
        else:
            subprocess.run(["scp", "-q", *ssh_opts(), shutil.which("zstd") or "/usr/bin/zstd",
                            f"root@{a}:/usr/local/bin/zstd"], check=True, timeout=120)


def install_lane(src: str, wheels: Path) -> None:
    files = sorted(wheels.glob("*.whl"))
    names = " ".join(f"/root/bench-wheels/{p.name}" for p in files)
    ssh(src, "mkdir -p /root/bench-wheels")
    subprocess.run(["scp", "-q", *ssh_opts(), *map(str, files),
                    f"root@{src}:/root/bench-wheels/"], check=True, timeout=900)
    ssh(src, f"/root/ml-env/bin/python -m pip install -q --no-deps --force-reinstall "
             f"--no-index {names} && rm -rf /root/bench-wheels", timeout=900)


def scp_hops(src: str, dst: str, site: str, scratch: Path) -> float:
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    ssh(dst, "rm -rf /tmp/scp-dst && mkdir -p /tmp/scp-dst")
    t0 = time.monotonic()
    subprocess.run(["scp", "-q", "-r", *ssh_opts(), f"root@{src}:{site}/nvidia", str(scratch)],
                   check=True, timeout=900)
    subprocess.run(["scp", "-q", "-r", *ssh_opts(), str(scratch / "nvidia"),
                    f"root@{dst}:/tmp/scp-dst/"], check=True, timeout=900)
    took = time.monotonic() - t0
    shutil.rmtree(scratch, ignore_errors=True)
    ssh(dst, "rm -rf /tmp/scp-dst")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--extra", type=int, default=2, help="extra fleet hosts (ct201, ...)")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--host-zstd", action="store_true")
    ap.add_argument("--roots", nargs="+", default=[], metavar="ROOT",
                    help="checkouts to compare, alternating in each round (default: the "
                         "installed tool)")
    ap.add_argument("--cold-modes", default="", metavar="MODE,...",
                    help="cold runs with `overlay --compress MODE` for each mode (auto, "
                         "always, never), alternating in each round, with CPU per host")
    ap.add_argument("--cold-only", action="store_true",
                    help="with --cold-modes: only the scp hops and those cold runs")
    args = ap.parse_args()
    args.modes = [m for m in args.cold_modes.split(",") if m]
    if any(m not in ("auto", "always", "never") for m in args.modes):
        ap.error("--cold-modes: expected auto, always and never, comma-separated")
    if args.cold_only and not args.modes:
        ap.error("--cold-only goes with --cold-modes")
    wheels = wheel_dir()
    manager.up(extra=args.extra, link_rate=args.rate)
    try:
        run(args, wheels)
    finally:
        manager.down()  # no shaped links or extra hosts left behind


def run(args: argparse.Namespace, wheels: Path) -> None:
    rows = manager.status()
    by = {r.name: r.address for r in rows}
    work = Path(tempfile.mkdtemp(prefix="bench-ovl-"))
    hosts = hosts_file(work, rows)
    env = {**os.environ, "XDG_CACHE_HOME": str(work / "cache")}  # the bench's own blob cache
    blobs = work / "cache" / xdg.APP / "blobs"
    install_lane(by["ct129"], wheels)
    if args.host_zstd:
        host_zstd(list(by.values()))
    try:
        rounds_of(args, by, hosts, env, blobs, work)
    finally:
        if args.host_zstd:
            host_zstd(list(by.values()), remove=True)
        shutil.rmtree(work, ignore_errors=True)


def rounds_of(args: argparse.Namespace, by: dict[str, str], hosts: Path, env: dict[str, str],
              blobs: Path, work: Path) -> None:
    site = ssh(by["ct129"], "ls -d /root/ml-env/lib/python3*/site-packages").strip()
    size = ssh(by["ct129"], f"du -sb {site}/nvidia").split()[0]
    fleet_hosts = ["ct200"] + [f"ct{201 + i}" for i in range(args.extra)]
    base = [CLI, "--hosts", str(hosts), "overlay", "--abi", "cu130", "--json"]

    def clone(host: str, venv: str, env: dict[str, str]) -> None:
        ssh(by[host], f"rm -rf {venv}")
        subprocess.run([CLI, "--hosts", str(hosts), "venv", "clone", host, "/root/venv", venv],
                       check=True, capture_output=True, env=env, timeout=600)

    def remove(host: str, path: str) -> None:
        ssh(by[host], f"rm -rf {path}")

    lab_hosts = Hosts(clone, remove, "ct200", fleet_hosts)
    envs = root_envs(args.roots or [""], env, work)
    roots = [] if args.cold_only else list(envs)
    rounds: dict[str, list[dict[str, float]]] = {r: [] for r in roots}
    stages: dict[str, dict[str, list[dict]]] = {
        r: {"cold": [], "warm": [], "unchanged": [], "fleet": []} for r in roots}
    ab = ColdAB(args.modes, by, base, blobs, clone, envs) if args.modes else None
    for n in range(args.rounds):
        if ab is not None:
            scp, cpu = scp_measured(by["ct129"], by["ct200"], site, work / "scp", ab)
            ab.scp.append((scp, cpu))
            print(f"round {n + 1}: scp {scp:.2f}s; {cpu.line()}", flush=True)
            ab.round(n)
        else:
            scp = scp_hops(by["ct129"], by["ct200"], site, work / "scp")
        for root in roots:
            row = {"scp": scp, **overlay_round(base, lab_hosts, blobs, envs[root],
                                                 stages[root])}
            rounds[root].append(row)
            print(f"round {n + 1}{' ' + root if root else ''}: "
                  + ", ".join(f"{k} {v:.2f}s" for k, v in row.items()), flush=True)
    for root in roots:
        report(root, rounds[root], stages[root], f"{size} bytes in ct129's site-packages/nvidia",
               args.rate, args.extra)
    if ab is not None:
        ab.report(size, args)
    for renv in envs.values():  # the masters each checkout kept (ssh_persist)
        subprocess.run([CLI, "--hosts", str(hosts), "hosts", "disconnect"], env=renv,
                       capture_output=True, timeout=60, check=False)


def root_envs(roots: list[str], env: dict[str, str], work: Path) -> dict[str, dict[str, str]]:
    """Each checkout's environment: the CLI runs with PYTHONPATH=root, and with a
    control folder of its own (XDG_RUNTIME_DIR), so that no checkout's command goes
    through an OpenSSH master another checkout started (a master's options, its
    cipher among them, are fixed when it connects)."""
    envs = {}
    for i, root in enumerate(roots):
        runtime = work / f"r{i}"
        runtime.mkdir(mode=0o700)
        envs[root] = {**env, "XDG_RUNTIME_DIR": str(runtime), **({"PYTHONPATH": root}
                                                                  if root else {})}
    return envs


def scp_measured(src: str, dst: str, site: str, scratch: Path,
                 ab: ColdAB) -> tuple[float, CpuReport]:
    """The two scp hops, as scp_hops, each with the CPU of every host counted."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    ssh(dst, "rm -rf /tmp/scp-dst && mkdir -p /tmp/scp-dst")
    hops = []
    for argv in (["scp", "-q", "-r", *ssh_opts(), f"root@{src}:{site}/nvidia", str(scratch)],
                 ["scp", "-q", "-r", *ssh_opts(), str(scratch / "nvidia"),
                  f"root@{dst}:/tmp/scp-dst/"]):
        proc, cpu = run_measured(argv, dict(os.environ), ab.namespaces, ab.masters)
        if proc.returncode != 0:
            raise SystemExit(f"scp: exit {proc.returncode}: {proc.stderr[-500:]}")
        hops.append(cpu)
    shutil.rmtree(scratch, ignore_errors=True)
    ssh(dst, "rm -rf /tmp/scp-dst")
    return sum(c.wall for c in hops), _added(hops)


def _added(cpus: list[CpuReport]) -> CpuReport:
    hosts: dict[str, float] = {}
    programs: dict[str, dict[str, float]] = {}
    for c in cpus:
        for h, v in c.hosts.items():
            hosts[h] = hosts.get(h, 0.0) + v
        for h, p in c.programs.items():
            mine = programs.setdefault(h, {})
            for k, v in p.items():
                mine[k] = mine.get(k, 0.0) + v
    return CpuReport(sum(c.wall for c in cpus), hosts, programs, sum(c.machine for c in cpus),
                     sum(c.irq for c in cpus))


class ColdAB:
    """Cold runs, one per compression mode in each round, with the CPU of every host."""

    def __init__(self, modes: list[str], by: dict[str, str], base: list[str], blobs: Path,
                 clone, envs: dict[str, dict[str, str]]) -> None:
        self.modes, self.by, self.base, self.blobs, self.clone = modes, by, base, blobs, clone
        self.envs = envs  # each checkout's (root_envs): every mode runs for each
        self.cases = [(m, r) for m in modes for r in envs]
        self.namespaces = lab_namespaces()
        self.masters = tuple(by.values())
        self.scp: list[tuple[float, CpuReport]] = []
        self.runs: dict[str, list[tuple[float, CpuReport, dict]]] = {
            self.label(m, r): [] for m, r in self.cases}

    def label(self, mode: str, root: str) -> str:
        return f"{mode} {root}" if len(self.envs) > 1 else mode

    def round(self, n: int) -> None:
        k = n % len(self.cases)
        for mode, root in self.cases[k:] + self.cases[:k]:
            env = self.envs[root]
            shutil.rmtree(self.blobs, ignore_errors=True)
            self.clone("ct200", "/root/bv-ab", env)
            proc, cpu = run_measured([*self.base, "--to", "ct200:/root/bv-ab", "--compress",
                                      mode], env, self.namespaces, self.masters)
            if proc.returncode != 0:
                raise SystemExit(f"cold --compress {mode}: exit {proc.returncode}: "
                                 f"{proc.stderr[-1500:]}")
            j = json.loads(proc.stdout)
            dens = wait_gone(j.get("recompressing_cache", {}).get("pid"))
            ssh(self.by["ct200"], "rm -rf /root/bv-ab")
            self.runs[self.label(mode, root)].append((cpu.wall, cpu, j))
            choice = j.get("source_compression", {})
            print(f"round {n + 1}: cold --compress {self.label(mode, root)} {cpu.wall:.2f}s "
                  f"(compressed: {choice.get('compress')}, {choice.get('reason')}); "
                  f"stream {j.get('seconds', {}).get('transfer.stream')}s; {cpu.line()}; "
                  f"recompression after it {dens:.1f}s", flush=True)
            print(f"  programs: {json.dumps(cpu.as_dict()['programs'])}", flush=True)

    def report(self, size: str, args: argparse.Namespace) -> None:
        scp = statistics.median(w for w, _ in self.scp)
        print(f"\ncold compression A/B; lane: {size} bytes; links {args.rate} each way; "
              f"{args.rounds} rounds, medians:")
        print(f"two scp -r hops: {scp:.2f}s; CPU-s per host (median): "
              f"{_median_hosts([c for _, c in self.scp])}")
        for mode, runs in self.runs.items():
            wall = statistics.median(w for w, _, _ in runs)
            ratio = wall / scp
            verdict = "met" if ratio <= GOALS["cold"] else "NOT met"
            print(f"cold --compress {mode + ':':7} {wall:.2f}s  ratio {ratio:.2f} (goal <= "
                  f"{GOALS['cold']}, {verdict}); CPU-s per host (median): "
                  f"{_median_hosts([c for _, c, _ in runs])}")
            mid = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
            print(f"  stages of the median run: {json.dumps(mid[2].get('seconds', {}))}")
            print(f"  its choice: {json.dumps(mid[2].get('source_compression'))}")
            print(f"  its CPU by program: {json.dumps(mid[1].as_dict()['programs'])}")


def _median_hosts(cpus: list[CpuReport]) -> str:
    keys = sorted({h for c in cpus for h in c.hosts})
    parts = [f"{h} {statistics.median(c.hosts.get(h, 0.0) for c in cpus):.1f}" for h in keys]
    rest = statistics.median(c.machine - sum(c.hosts.values()) for c in cpus)
    irq = statistics.median(c.irq for c in cpus)
    machine = statistics.median(c.machine for c in cpus)
    return ", ".join(parts) + f", rest {rest:.1f} (irq+softirq {irq:.1f}), machine {machine:.1f}"


if __name__ == "__main__":
    from ddtree_lab import lock

    with lock.session():  # the whole run holds the lab
        main()
