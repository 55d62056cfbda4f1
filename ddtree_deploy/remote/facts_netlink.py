"""Listening TCP sockets from the kernel's sock_diag netlink interface (what `ss -ltn` uses).

Reading /proc/net/tcp makes the kernel walk all of its TCP hash tables, even with a handful of
sockets (the cost: benchmarks/RESULTS.md, the inventory section); sock_diag answers with the
listening sockets of this network namespace only. Each answer: {address, port, inode}, as
facts_parse.parse_proc_net_tcp gives; None when netlink is not available (the caller then reads
/proc/net/tcp). Part of the probe bundle: stdlib only, Python >= 3.8 syntax.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY = 4, 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCP_LISTEN = 10
_HEADER = struct.Struct("=IHHII")  # struct nlmsghdr
_REQUEST = struct.Struct("=BBBBI48s")  # struct inet_diag_req_v2 (sockid zeroed: every socket)
_MESSAGE = struct.Struct("=BBBB2s2s16s16sI8sIIIII")  # struct inet_diag_msg


def tcp_listeners_netlink(timeout: float = 2.0) -> list[dict[str, Any]] | None:
    """LISTEN sockets (IPv4 and IPv6) of this network namespace, or None without netlink."""
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
    except (OSError, AttributeError):
        return None
    found: list[dict[str, Any]] = []
    try:
        sock.settimeout(timeout)
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), start=1):
            body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN, b"")
            sock.send(_HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY,
                                   NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body)
            if not _receive(sock, seq, found):
                return None
    except OSError:
        return None
    finally:
        sock.close()
    return found


def _receive(sock: socket.socket, seq: int, found: list[dict[str, Any]]) -> bool:
    """Read one dump to its NLMSG_DONE; False on a netlink error."""
    while True:
        data = sock.recv(1 << 16)
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, kind, _flags, got_seq, _pid = _HEADER.unpack_from(data, offset)
            if length < _HEADER.size:
                return False
            if got_seq == seq:
                if kind == NLMSG_DONE:
                    return True
                if kind == NLMSG_ERROR:
                    return False
                if kind == SOCK_DIAG_BY_FAMILY and length >= _HEADER.size + _MESSAGE.size:
                    found.append(_socket(data, offset + _HEADER.size))
            offset += (length + 3) & ~3


def _socket(data: bytes, at: int) -> dict[str, Any]:
    fields = _MESSAGE.unpack_from(data, at)
    family, sport, src, inode = fields[0], fields[4], fields[6], fields[-1]
    raw = src[:4] if family == socket.AF_INET else src
    return {"address": socket.inet_ntop(family, raw), "port": int.from_bytes(sport, "big"),
            "inode": inode}

