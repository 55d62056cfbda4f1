"""Listening sockets from sock_diag netlink must be those /proc/net/tcp{,6} lists."""

from __future__ import annotations

import os
import socket

import pytest

from ddtree_deploy.remote import facts_sys
from ddtree_deploy.remote.facts_netlink import tcp_listeners_netlink
from ddtree_deploy.remote.facts_parse import parse_proc_net_tcp


def _proc() -> set[tuple[str, int, int]]:
    out = set()
    for name in ("tcp", "tcp6"):
        with open(f"/proc/net/{name}", encoding="ascii") as fh:
            out |= {(s["address"], s["port"], s["inode"]) for s in parse_proc_net_tcp(fh.read())}
    return out


def test_netlink_lists_what_proc_lists() -> None:
    v4 = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    v4.bind(("127.0.0.1", 0))
    v4.listen()
    has_v6 = socket.has_ipv6 and os.path.exists("/proc/net/tcp6")
    v6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM) if has_v6 else None
    idle = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    idle.bind(("127.0.0.1", 0))  # bound, not listening: in neither list
    try:
        if v6 is not None:
            try:
                v6.bind(("::1", 0))
                v6.listen()
            except OSError:
                v6.close()
                v6 = None
        found = tcp_listeners_netlink()
        if found is None:
            pytest.skip("no sock_diag netlink here")
        got = {(s["address"], s["port"], s["inode"]) for s in found}
        ours = {("127.0.0.1", v4.getsockname()[1], os.fstat(v4.fileno()).st_ino)}
        if v6 is not None:
            ours.add(("::1", v6.getsockname()[1], os.fstat(v6.fileno()).st_ino))
        # Both lists hold our sockets, read the same way (the machine's other sockets may come
        # and go between the two reads while other tests run).
        assert ours <= got and ours <= _proc()
        assert {(a, p) for a, p, _ in got} & {(a, p) for a, p, _ in _proc()}
        assert all(s["port"] != idle.getsockname()[1] for s in found)
        mine = [s for s in facts_sys.listeners()[0] if s["port"] == v4.getsockname()[1]]
        assert [(s["pid"], s["address"]) for s in mine] == [(os.getpid(), "127.0.0.1")]
    finally:
        for s in (v4, v6, idle):
            if s is not None:
                s.close()
