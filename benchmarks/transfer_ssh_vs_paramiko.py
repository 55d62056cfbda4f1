"""Bulk throughput: paramiko exec-stream vs the system OpenSSH client, with and without zstd.

Data: real shared objects (libtorch_cpu.so and friends from the CPU torch wheel in
/opt/wheels, libcudart from the real nvidia runtime wheels in /tmp/wh), about 500 MB,
sent as one `tar -cf -` through a loopback sshd (tests/sshd_fixture.py; needs root).
Each way is timed end to end on the workstation, decompression included, and the
bytes are counted after decompression. Median of 3 runs.

    .venv/bin/python benchmarks/transfer_ssh_vs_paramiko.py [--runs 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from functools import partial
from io import BufferedReader
from pathlib import Path
from typing import cast

import zstandard

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from sshd_fixture import Sshd, sshd_available  # noqa: E402

from ddtree_deploy.transport import SshTransport  # noqa: E402

CHUNK = 1024 * 1024
TORCH = sorted(Path("/opt/wheels").glob("torch-*.whl"))
RUNTIMES = sorted(Path("/tmp/wh").glob("nvidia_cuda_runtime*.whl"))  # noqa: S108


def build_data(folder: Path) -> int:
    """Extract the big .so files; returns the total bytes."""
    want = ("torch/lib/", "torch/bin/", "nvidia/")
    total = 0
    for wheel in [*TORCH[:1], *RUNTIMES]:
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                if info.filename.startswith(want) and info.file_size > 64 * 1024:
                    zf.extract(info, folder)
                    total += info.file_size
    return total


class Sink:
    """Counts decompressed bytes; decompresses a zstd stream as it arrives."""

    def __init__(self, zstd: bool) -> None:
        self.count = 0
        dctx = zstandard.ZstdDecompressor(max_window_size=1 << 28)
        self._d = dctx.decompressobj() if zstd else None
        self.wire = 0

    def write(self, data: bytes) -> int:
        self.wire += len(data)
        out = self._d.decompress(data) if self._d is not None else data
        self.count += len(out)
        return len(data)


def remote_cmd(folder: Path, zflags: str | None) -> str:
    tar = f"tar -C {shlex.quote(str(folder))} -cf - ."
    return tar if zflags is None else f"{tar} | zstd -q -c -T0 {zflags}"


def via_paramiko(ssh: SshTransport, folder: Path, zflags: str | None) -> tuple[int, int]:
    sink = Sink(zflags is not None)
    ssh.run_stream_out(remote_cmd(folder, zflags), sink).check()  # type: ignore[arg-type]
    return sink.count, sink.wire


def openssh_argv(sshd: Sshd, known: Path) -> list[str]:
    return [
        "ssh", "-q", "-p", str(sshd.port), "-i", str(sshd.client_key),
        "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={known}", "-o", "IdentitiesOnly=yes",
        "root@127.0.0.1",
    ]  # fmt: skip


def via_openssh(argv: list[str], folder: Path, zflags: str | None) -> tuple[int, int]:
    sink = Sink(zflags is not None)
    proc = subprocess.Popen([*argv, remote_cmd(folder, zflags)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    out = cast(BufferedReader, proc.stdout)
    while chunk := out.read1(CHUNK):
        sink.write(chunk)
    if proc.wait() != 0:
        raise RuntimeError(f"ssh exited {proc.returncode}")
    return sink.count, sink.wire


def median_rate(fn: Callable[[], tuple[int, int]], runs: int) -> tuple[float, float, int]:
    times: list[float] = []
    count = wire = 0
    for _ in range(runs):
        start = time.monotonic()
        count, wire = fn()
        times.append(time.monotonic() - start)
    med = statistics.median(times)
    return med, count / med / 1e6, wire


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    reason = sshd_available()
    if reason or not TORCH:
        print(f"cannot run: {reason or 'no torch wheel in /opt/wheels'}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="xfer-bench-") as tmp:
        work = Path(tmp)
        data = work / "data"
        total = build_data(data)
        sshd = Sshd(work / "sshd")
        sshd.start()
        try:
            known = work / "known_hosts"
            known.write_text(sshd.known_hosts_line() + "\n")
            ssh = SshTransport(
                "127.0.0.1", known_hosts=known, port=sshd.port, user="root",
                identity_file=sshd.client_key, load_ssh_config=False,
            )  # fmt: skip
            argv = openssh_argv(sshd, known)
            ways: list[tuple[str, str | None]] = [
                ("none", None), ("zstd -1", "-1"), ("zstd -3", "-3"),
                ("zstd -3 --long=27", "-3 --long=27"), ("zstd -1 --long=27", "-1 --long=27"),
            ]  # fmt: skip
            rows: list[str] = [
                f"data: {total / 1e6:.0f} MB of real .so files, "
                f"median of {args.runs}, loopback sshd",
                f"{'client':<9} {'compression':<18} {'seconds':>8} {'MB/s':>8} {'wire MB':>8}",
            ]
            for label, zflags in ways:
                for client in ("paramiko", "openssh"):
                    if client == "paramiko":
                        res = median_rate(partial(via_paramiko, ssh, data, zflags), args.runs)
                    else:
                        res = median_rate(partial(via_openssh, argv, data, zflags), args.runs)
                    secs, rate, wire = res
                    line = f"{client:<9} {label:<18} {secs:>8.2f} {rate:>8.1f} {wire / 1e6:>8.1f}"
                    rows.append(line)
                    print(line, flush=True)
            ssh.close()
        finally:
            sshd.stop()
    text = "\n".join(rows) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
