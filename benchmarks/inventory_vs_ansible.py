"""Benchmark: `ddtree-deploy inventory` on 8 lab hosts vs `ansible all -m setup`, same run.

Brings the lab up with 6 extra hosts (8 in all) unless it already runs them,
writes a hosts file and an Ansible inventory for them (same key, same strict
known_hosts), then alternates the two commands, 5 runs each, and prints the
medians and their ratio (goal: inventory <= 0.2x Ansible). Also times `doctor`
on cached facts (goal <= 0.3 s).

    .venv/bin/python benchmarks/inventory_vs_ansible.py [--runs 5] [--ansible PATH]

Ansible: ansible-core from the registry in a venv of its own, e.g.
    python3 -m venv /opt/ddtree-bench-ansible
    /opt/ddtree-bench-ansible/bin/pip install ansible-core
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddtree_lab import manager

CLI = str(Path(sys.executable).with_name("ddtree-deploy"))


def timed(argv: list[str]) -> float:
    t0 = time.monotonic()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - t0


def end_connections(hosts_yaml: Path) -> None:
    """End both tools' kept SSH masters: ours (hosts disconnect) and Ansible's (~/.ansible/cp)."""
    subprocess.run([CLI, "--hosts", str(hosts_yaml), "hosts", "disconnect"], check=True,
                   stdout=subprocess.DEVNULL)
    for sock in (Path.home() / ".ansible" / "cp").glob("*"):
        subprocess.run(["ssh", "-F", "none", "-S", str(sock), "-O", "exit", "x"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ansible", default="/opt/ddtree-bench-ansible/bin/ansible")
    ap.add_argument("--cold", action="store_true", help="also time runs with no connection open")
    args = ap.parse_args()
    rows = manager.status()
    if len(rows) < 8 or not all(r.running and r.ssh for r in rows):
        manager.up(extra=6)
        rows = manager.status()
    lab = manager.lab_state_dir()
    key, known = lab / "id_ed25519", lab / "known_hosts"
    work = Path(tempfile.mkdtemp(prefix="bench-inv-"))
    hosts_yaml = work / "hosts.yaml"
    hosts_yaml.write_text("version: 1\nhosts:\n" + "".join(
        f"  {r.name}:\n    address: {r.address}\n    identity_file: {key}\n"
        f"    known_hosts: {known}\n" for r in rows))
    inventory = work / "inventory.ini"
    inventory.write_text("[lab]\n" + "".join(
        f"{r.name} ansible_host={r.address} ansible_user=root "
        f"ansible_ssh_private_key_file={key} ansible_python_interpreter=/usr/bin/python3 "
        f"ansible_ssh_common_args='-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes'\n"
        for r in rows))
    ours_cmd = [CLI, "--hosts", str(hosts_yaml), "inventory", "--refresh", "--json"]
    theirs_cmd = [args.ansible, "all", "-i", str(inventory), "-m", "setup", "-f", "8"]
    doctor_cmd = [CLI, "--hosts", str(hosts_yaml), "doctor", rows[0].name, "--json"]
    ours, theirs, doctor = [], [], []
    timed(ours_cmd)  # warm the page cache and the facts cache once for each
    timed(theirs_cmd)
    for _ in range(args.runs):
        ours.append(timed(ours_cmd))
        theirs.append(timed(theirs_cmd))
        doctor.append(timed(doctor_cmd))
    cold_ours, cold_theirs = [], []
    for _ in range(args.runs if args.cold else 0):
        end_connections(hosts_yaml)
        cold_ours.append(timed(ours_cmd))
        end_connections(hosts_yaml)
        cold_theirs.append(timed(theirs_cmd))
    end_connections(hosts_yaml)
    mo, mt, md = (statistics.median(x) for x in (ours, theirs, doctor))
    print(f"hosts: {len(rows)}; runs: {args.runs}")
    each = {name: ", ".join(f"{x:.3f}" for x in xs) for name, xs in (("o", ours), ("t", theirs))}
    print(f"ddtree-deploy inventory --refresh: median {mo:.3f}s ({each['o']})")
    print(f"ansible all -m setup:              median {mt:.3f}s ({each['t']})")
    print(f"ratio inventory/ansible: {mo / mt:.3f} (goal <= 0.2)")
    print(f"doctor on cached facts (whole CLI process): median {md:.2f}s (goal <= 0.3)")
    if cold_ours:
        co, ct = statistics.median(cold_ours), statistics.median(cold_theirs)
        print(f"no connection open before each run: inventory median {co:.2f}s "
              f"({', '.join(f'{x:.2f}' for x in cold_ours)}), ansible median {ct:.2f}s "
              f"({', '.join(f'{x:.2f}' for x in cold_theirs)}), ratio {co / ct:.3f}")


if __name__ == "__main__":
    from ddtree_lab import lock

    with lock.session():  # the whole run holds the lab (a test session waits, or we do)
        main()
