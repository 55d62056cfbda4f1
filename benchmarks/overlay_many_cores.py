"""Benchmark: the overlay's real-lane figures where the hosts have cores to spare.

The lab runs every host on this workstation's 2 cores, so its cold stream is CPU-bound
(benchmarks/RESULTS.md, runs E-G). This runs the same cases as overlay_real_lane.py
(benchmarks/lane_rounds.py) on one machine with many cores (the GPU host's 16), its hosts
each an OpenSSH sshd of its own on 127.0.0.1 behind a link of its own:

- hosts: `src` (the lane's source), `dst` and `dst2`, `dst3`, ... (the fleet); each
  sshd listens on a port of its own, and the workstation (this process and the CLI it runs)
  reaches it only through a link shaper (benchmarks/linkshaper.py: a TCP forwarder holding
  each direction to --rate bytes per second, 125000000 = 1 Gbit/s of payload, as the lab's
  `tc tbf rate 1gbit` on every link). The hosts share the machine's file system: each has
  a home of its own (WORK/h-NAME), and nothing tells the tool that they are one machine.
- the lane: the lab's four CUDA 13 distributions (nvidia-cublas, -cuda-nvrtc, -cusparse,
  -nccl-cu13), copied file by file (their RECORD) from an installed site-packages
  (--site: on the GPU host, torch 2.11.0+cu130's venv) into a fresh source venv; a lane
  file of its own (nvlane) names them.
- in each round: the story's two `scp -r` hops (src's site-packages/nvidia to here, then to
  dst), the issue's bare pipeline (`ssh src tar | zstd -1 -T0 | ssh dst 'zstd -d | tar x'`:
  no hashing, cache, backup or swap), then cold, densify, warm, unchanged and the fleet
  (lane_rounds.overlay_round), for each of `--roots` in turn (the order rotating), each
  with OpenSSH masters of its own.

Where the machine has no OpenSSH (the GPU host's image), `--tools DIR` names a folder of
OpenSSH's and zstd's binaries with the libraries they need and their loader
(`bin/`, `lib/`: copied from a Debian workstation); each is run through that loader, and
sshd with -r (no re-exec). `--device-setup` (for a machine that is given back after the
run, never a workstation) adds what sshd and the hosts need outside WORK: the privilege
separation user and /run/sshd when missing, and zstd and python3 in /usr/local/bin where
the hosts' sessions find none (removed at the end).

    python benchmarks/overlay_many_cores.py --site /opt/torch/.venv/lib/python3.12/site-packages \
        [--tools .ovlcarry/tools --device-setup] [--rounds 3] [--extra 2] [--out result.json] \
        [--roots BEFORE AFTER]

For the GPU host (run H in benchmarks/RESULTS.md), prepared here in the git-ignored .ovlcarry/:
`.venv/bin/python benchmarks/overlay_many_cores.py --bundle-tools .ovlcarry/tools`; the tool's
missing dependencies as cp312 wheels (`pip download --no-deps --only-binary=:all:
--python-version 3.12 --platform manylinux_2_28_x86_64 ... -d .ovlcarry/whl` with uv.lock's
versions of pydantic, pydantic-core, annotated-types, typing-inspection, fabric, invoke,
paramiko, bcrypt, cryptography, cffi, pycparser, pynacl, deprecated, zstandard, ruamel-yaml,
typer, rich, shellingham, typing-extensions); a `git archive COMMIT ddtree_deploy` for each
other root. There, with `.ovlcarry` carried: `pip install --no-deps --target /tmp/site
.ovlcarry/whl/*.whl`, PYTHONPATH=/tmp/site:$PWD, then the command above.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lane_rounds import Hosts, overlay_round, report

HERE = Path(__file__).resolve().parent
DISTS = ("nvidia-cublas", "nvidia-cuda-nvrtc", "nvidia-cusparse", "nvidia-nccl-cu13")
TOOLS = ("sshd", "ssh", "scp", "ssh-keygen", "sftp-server", "zstd")


class Machine:
    """The hosts on this machine: sshd's, shapers, keys, hosts.yaml; all under `work`."""

    def __init__(self, work: Path, names: list[str], rate: float, tools: Path | None,
                 device_setup: bool) -> None:
        self.work, self.names, self.rate = work, names, rate
        self.bin = work / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        self.bundled = tools is not None and _installed("sshd") is None
        self.paths = self._tools(tools)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.undo: list[Path] = []
        self.device_setup = device_setup
        self.ports = {n: (22000 + 2 * i, 22001 + 2 * i) for i, n in enumerate(names)}

    def _tools(self, tools: Path | None) -> dict[str, str]:
        """Each tool's command: the system's, or a wrapper running the bundled one."""
        out = {}
        for name in TOOLS:
            found = _installed(name)
            if self.bundled or found is None:
                if tools is None:
                    raise SystemExit(f"no {name} here: pass --tools DIR (bin/, lib/)")
                loader = tools.resolve() / "lib" / "ld-linux-x86-64.so.2"
                wrapper = self.bin / name
                wrapper.write_text(f'#!/bin/sh\nexec "{loader}" --library-path '
                                   f'"{tools.resolve() / "lib"}" "{tools.resolve() / "bin" / name}"'
                                   ' "$@"\n')
                wrapper.chmod(0o755)
                found = str(wrapper)
            out[name] = found
        return out

    def env(self) -> dict[str, str]:
        return {**os.environ, "PATH": f"{self.bin}:{os.environ.get('PATH', '')}"}

    def opts(self) -> list[str]:
        return ["-F", "none", "-i", str(self.work / "id_ed25519"), "-o", "IdentitiesOnly=yes",
                "-o", f"UserKnownHostsFile={self.work / 'known_hosts'}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]

    def up(self) -> Path:
        """Keys, one sshd and one shaper per host; returns the hosts file."""
        if self.device_setup:
            self._device_setup()
        keygen = self.paths["ssh-keygen"]
        for key in ("host_ed25519", "id_ed25519"):
            subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(self.work / key)],
                           check=True)
        (self.work / "authorized_keys").write_text((self.work / "id_ed25519.pub").read_text())
        host_pub = (self.work / "host_ed25519.pub").read_text().split()[:2]
        known = []
        for name in self.names:
            link, sshd_port = self.ports[name]
            home = self.home(name)
            Path(home).mkdir(parents=True, exist_ok=True)
            cfg = self.work / f"sshd-{name}.conf"
            cfg.write_text("\n".join([
                f"Port {sshd_port}", "ListenAddress 127.0.0.1",
                f"HostKey {self.work / 'host_ed25519'}",
                f"AuthorizedKeysFile {self.work / 'authorized_keys'}", "StrictModes no",
                "UsePAM no", "PermitRootLogin prohibit-password", "MaxSessions 64",
                "MaxStartups 64:30:128", f"PidFile {self.work / f'sshd-{name}.pid'}",
                f"Subsystem sftp {self.paths['sftp-server']}", "LogLevel ERROR", ""]))
            argv = [self.paths["sshd"], "-D", "-f", str(cfg), "-E",
                    str(self.work / f"sshd-{name}.log")]
            if self.bundled:
                argv.insert(1, "-r")
            self.procs.append(subprocess.Popen(argv, env=self.env()))
            shaper = subprocess.Popen([sys.executable, str(HERE / "linkshaper.py"), str(link),
                                       str(sshd_port), "--rate", str(self.rate)],
                                      stdout=subprocess.PIPE)
            self.procs.append(shaper)
            assert shaper.stdout is not None
            if shaper.stdout.readline().strip() != b"ready":
                raise SystemExit(f"the link shaper for {name} did not start")
            known.append(f"[127.0.0.1]:{link} {' '.join(host_pub)}")
        (self.work / "known_hosts").write_text("\n".join(known) + "\n")
        for name in self.names:  # every sshd answers through its link
            for _ in range(50):
                if subprocess.run(["ssh", *self.opts(), "-p", str(self.ports[name][0]),
                                   "root@127.0.0.1", "true"], env=self.env(),
                                  capture_output=True).returncode == 0:
                    break
                time.sleep(0.2)
            else:
                raise SystemExit(f"{name}: sshd does not answer (see {self.work}/sshd-{name}.log)")
        hosts = self.work / "hosts.yaml"
        hosts.write_text("version: 1\nhosts:\n" + "".join(
            f"  {n}:\n    address: 127.0.0.1\n    port: {self.ports[n][0]}\n    user: root\n"
            f"    identity_file: {self.work / 'id_ed25519'}\n"
            f"    known_hosts: {self.work / 'known_hosts'}\n" for n in self.names))
        return hosts

    def _device_setup(self) -> None:
        with open("/etc/passwd") as fh:
            users = {line.split(":", 1)[0] for line in fh}
        if "sshd" not in users:
            with open("/etc/passwd", "a") as fh:
                fh.write("sshd:x:74:65534::/run/sshd:/usr/sbin/nologin\n")
            print("device setup: added the user sshd (privilege separation)", flush=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        if shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") is None:
            link = Path("/usr/local/bin/python3")  # the hosts' sessions run `python3`
            link.symlink_to(sys.executable)
            self.undo.append(link)
            print(f"device setup: python3 in /usr/local/bin -> {sys.executable}", flush=True)
        if shutil.which("zstd", path="/usr/local/bin:/usr/bin:/bin") is None:
            target = Path("/usr/local/bin/zstd")
            shutil.copy(self.paths["zstd"], target)
            target.chmod(0o755)
            self.undo.append(target)
            print("device setup: zstd in /usr/local/bin (removed at the end)", flush=True)

    def home(self, name: str) -> str:
        return str(self.work / f"h-{name}")

    def ssh(self, name: str, script: str) -> str:
        r = subprocess.run(["ssh", *self.opts(), "-p", str(self.ports[name][0]),
                            "root@127.0.0.1", script], env=self.env(), capture_output=True,
                           text=True, timeout=900)
        if r.returncode != 0:
            raise SystemExit(f"{name}: {script[:80]}: {r.stderr.strip()[-500:]}")
        return r.stdout

    def scp(self, *args: str) -> None:
        subprocess.run([self.paths["scp"], "-q", "-r", "-S", self.paths["ssh"], *self.opts(),
                        *args], env=self.env(), check=True, timeout=900)

    def down(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        for path in self.undo:
            path.unlink(missing_ok=True)


def bundle_tools(dest: Path) -> None:
    """Copy this machine's OpenSSH, sftp-server and zstd with every library they load (ldd)
    and the loader into dest/bin and dest/lib (what --tools reads on a machine without them)."""
    (dest / "bin").mkdir(parents=True, exist_ok=True)
    (dest / "lib").mkdir(exist_ok=True)
    libs: set[str] = set()
    for name in TOOLS:
        found = _installed(name)
        if found is None:
            raise SystemExit(f"no {name} here to bundle")
        shutil.copy2(found, dest / "bin" / name)
        for line in subprocess.run(["ldd", found], capture_output=True, text=True,
                                   check=True).stdout.splitlines():
            parts = line.split()
            path = parts[2] if "=>" in parts and len(parts) > 2 else parts[0]
            if path.startswith("/"):
                libs.add(path)
    for lib in libs:
        target = dest / "lib" / Path(lib).name
        shutil.copy(lib, target)  # follows the symlink: the file under its soname
    loader = dest / "lib" / "ld-linux-x86-64.so.2"
    if not loader.exists():
        raise SystemExit("no ld-linux-x86-64.so.2 among the libraries: not an x86-64 glibc system")
    print(f"bundled {len(TOOLS)} programs and {len(libs)} libraries into {dest}")


def _installed(name: str) -> str | None:
    """Where this machine has the tool `name` (sftp-server sits in OpenSSH's libexec folder)."""
    if name == "sftp-server":
        return next((p for p in ("/usr/lib/openssh/sftp-server",
                                 "/usr/libexec/openssh/sftp-server") if Path(p).exists()), None)
    return shutil.which(name, path=_sbin_path())


def _sbin_path() -> str:
    return f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin:/usr/local/sbin"


def copy_lane(site: Path, dest_site: Path) -> int:
    """The DISTS' files (their RECORD) from `site` into `dest_site`; returns the bytes."""
    total = 0
    for name in DISTS:
        dist = next((d for d in importlib.metadata.distributions(path=[str(site)])
                     if d.metadata["Name"].lower().replace("_", "-") == name), None)
        if dist is None or not dist.files:
            raise SystemExit(f"{site}: no {name} (with a RECORD) installed there")
        for f in dist.files:
            rel = str(f)
            if rel.startswith("..") or rel.startswith("/"):
                continue  # scripts outside site-packages: not the lane's
            src = site / rel
            if not src.is_file():
                continue
            out = dest_site / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out)
            total += src.stat().st_size
    return total


def lane_file(work: Path, source_venv: str) -> Path:
    path = work / "nvlane.yaml"
    path.write_text("lane: nvlane\ndescription: the lab's four CUDA 13 distributions\n"
                    f"source:\n  host: src\n  venv: {source_venv}\ndistributions:\n"
                    + "".join(f"  - {d}\n" for d in DISTS) + "required:\n  - nvidia-cublas\n")
    return path


def fresh_venv(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", path], check=True)


def busy_cpu_s() -> float:
    """The machine's busy CPU seconds so far (all but idle and iowait), from /proc/stat."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(x) for x in fields]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle-tools", metavar="DIR",
                    help="only copy this machine's OpenSSH and zstd (and their libraries) to DIR")
    ap.add_argument("--site", type=Path,
                    help="a site-packages holding the lane's four distributions")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--extra", type=int, default=2, help="fleet targets besides dst")
    ap.add_argument("--rate", type=float, default=125e6, help="each link, bytes/s each way")
    ap.add_argument("--tools", type=Path, help="bundled OpenSSH and zstd (bin/, lib/)")
    ap.add_argument("--device-setup", action="store_true")
    ap.add_argument("--work", type=Path)
    ap.add_argument("--out", type=Path, help="the result as JSON")
    ap.add_argument("--roots", nargs="+", default=[], metavar="ROOT",
                    help="checkouts of the tool to compare (PYTHONPATH=ROOT), in turn each round")
    ap.add_argument("--cli", default=f"{sys.executable} -P -m ddtree_deploy.cli",
                    help="how to run ddtree-deploy")
    args = ap.parse_args()
    if args.bundle_tools:  # run here, before a device call: nothing else is done
        bundle_tools(Path(args.bundle_tools))
        return
    if args.site is None:
        ap.error("--site is needed (or --bundle-tools DIR)")
    work = args.work or Path(tempfile.mkdtemp(prefix="ovl-many-"))
    names = ["src", "dst"] + [f"dst{i + 2}" for i in range(args.extra)]
    m = Machine(work, names, args.rate, args.tools, args.device_setup)
    try:
        hosts = m.up()
        run(args, m, hosts, names)
    finally:
        m.down()


def run(args: argparse.Namespace, m: Machine, hosts: Path, names: list[str]) -> None:
    work = m.work
    src_venv = f"{m.home('src')}/ml-env"
    fresh_venv(src_venv)
    site = next(Path(src_venv).glob("lib/python3*/site-packages"))
    t0 = time.monotonic()
    size = copy_lane(args.site, site)
    print(f"lane: {size} bytes copied into {site} in {time.monotonic() - t0:.1f}s; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
    blobs = work / "cache" / "ddtree-deploy" / "blobs"
    base = [*args.cli.split(), "--hosts", str(hosts), "overlay", "--abi",
            str(lane_file(work, src_venv)), "--json"]
    envs = {}
    for i, root in enumerate(args.roots or [""]):  # each its own OpenSSH masters (run/)
        (work / f"run{i}").mkdir(mode=0o700, exist_ok=True)
        path = ":".join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p) or None
        envs[root] = {**m.env(), "XDG_CACHE_HOME": str(work / "cache"),
                      "XDG_RUNTIME_DIR": str(work / f"run{i}"),
                      "XDG_STATE_HOME": str(work / "state"),
                      "XDG_CONFIG_HOME": str(work / "config"), **({"PYTHONPATH": path}
                                                                  if path else {})}

    for root, env in envs.items():  # which checkout each root's CLI imports (-P: not cwd's)
        where = subprocess.run([sys.executable, "-P", "-c", "import ddtree_deploy as d; "
                                "print(d.__file__)"], env=env, capture_output=True, text=True)
        print(f"root {root or '(installed)'}: imports {where.stdout.strip()}", flush=True)

    def clone(host: str, venv: str, env: dict[str, str]) -> None:
        fresh_venv(venv)

    def remove(host: str, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    homes = {n: m.home(n) for n in names}
    hs = Hosts(clone, remove, "dst", names[1:], home=homes.__getitem__)
    stages: dict[str, dict[str, list[dict]]] = {
        r: {"cold": [], "warm": [], "unchanged": [], "fleet": []} for r in envs}
    rounds: dict[str, list[dict[str, float]]] = {r: [] for r in envs}
    cpu: list[dict[str, float]] = []
    for n in range(args.rounds):
        scp, scp_cpu = scp_hops(m, site, homes["dst"])
        bare, bare_cpu = bare_pipe(m, site, homes["dst"])
        cpu.append({"scp": round(scp_cpu, 1), "bare": round(bare_cpu, 1)})
        order = list(envs)[n % len(envs):] + list(envs)[:n % len(envs)]
        for root in order:
            c0 = busy_cpu_s()
            row = {"scp": scp, "bare": bare, **overlay_round(base, hs, blobs, envs[root],
                                                              stages[root])}
            cpu[-1][f"overlay {root}"] = round(busy_cpu_s() - c0, 1)
            rounds[root].append(row)
            print(f"round {n + 1}{' ' + root if root else ''}: "
                  + ", ".join(f"{k} {v:.2f}s" for k, v in row.items()), flush=True)
        print(f"round {n + 1}: machine CPU-s {json.dumps(cpu[-1])}", flush=True)
    out: dict[str, object] = {"cpus": os.cpu_count(), "lane_bytes": size, "cpu_s": cpu,
                              "bundled_openssh": m.bundled, "rate_bps": args.rate}
    for root in envs:
        res = report(root, rounds[root], stages[root],
                     f"{size} bytes in src's site-packages (nvidia)",
                     f"{args.rate / 1e6:.0f} MB/s (payload)", args.extra)
        bare_med = statistics.median(r["bare"] for r in rounds[root])
        print(f"the bare pipeline (ssh src tar | zstd -1 -T0 | ssh dst 'zstd -d | tar x'): "
              f"{bare_med:.2f}s, ratio {bare_med / res['medians']['scp']:.2f}")  # type: ignore
        out[root or "tool"] = {**res, "stages": stages[root]}
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


def scp_hops(m: Machine, site: Path, dst_home: str) -> tuple[float, float]:
    """The story's two `scp -r` hops of src's site-packages/nvidia; seconds, machine CPU-s."""
    scratch = m.work / "scp"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    dst = f"{dst_home}/scp-dst"
    shutil.rmtree(dst, ignore_errors=True)
    Path(dst).mkdir()
    c0, t0 = busy_cpu_s(), time.monotonic()
    m.scp("-P", str(m.ports["src"][0]), f"root@127.0.0.1:{site}/nvidia", str(scratch))
    m.scp("-P", str(m.ports["dst"][0]), str(scratch / "nvidia"), f"root@127.0.0.1:{dst}/")
    took, cpu = time.monotonic() - t0, busy_cpu_s() - c0
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(dst, ignore_errors=True)
    return took, cpu


def bare_pipe(m: Machine, site: Path, dst_home: str) -> tuple[float, float]:
    """The issue's bare pipeline (no hashing, cache, backup or swap): `ssh src tar | zstd -1
    -T0 | ssh dst 'zstd -d | tar x'`; seconds, machine CPU-s."""
    dst = f"{dst_home}/bare-dst"
    shutil.rmtree(dst, ignore_errors=True)
    Path(dst).mkdir()
    def ssh(name: str) -> list[str]:
        return ["ssh", *m.opts(), "-p", str(m.ports[name][0]), "root@127.0.0.1"]
    c0, t0 = busy_cpu_s(), time.monotonic()
    src = subprocess.Popen([*ssh("src"), f"tar -C {site} -cf - nvidia"], stdout=subprocess.PIPE,
                           env=m.env())
    zst = subprocess.Popen([m.paths["zstd"], "-q", "-1", "-T0"], stdin=src.stdout,
                           stdout=subprocess.PIPE)
    dst_p = subprocess.Popen([*ssh("dst"), f"zstd -q -d | tar -C {dst} -xf -"], stdin=zst.stdout,
                             env=m.env())
    assert src.stdout is not None and zst.stdout is not None
    src.stdout.close()
    zst.stdout.close()
    codes = [p.wait(timeout=900) for p in (src, zst, dst_p)]
    took, cpu = time.monotonic() - t0, busy_cpu_s() - c0
    if codes != [0, 0, 0]:
        raise SystemExit(f"the bare pipeline failed: exit codes {codes}")
    shutil.rmtree(dst, ignore_errors=True)
    return took, cpu


if __name__ == "__main__":
    main()
