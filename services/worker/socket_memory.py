"""Kernel memory held in sockets' buffers, by socket inode: what the rlimits memory watch adds for the sockets a
run's processes hold open (`enforcement.memory_usage`).

Data written to a socket and not yet read sits in kernel buffers, in no page of any process: a task holding a few
thousand full Unix socket pairs holds hundreds of megabytes that its resident memory does not show (about 230 KB a
pair here). Under cgroups v2 the kernel charges them to the run's cgroup; under rlimits the watch asks the kernel
(sock_diag over netlink, as `ss -m` does) for each socket's memory: Unix sockets, and TCP and UDP over IPv4 and
IPv6, of the agent's network namespace (the runs share it). A socket's bytes are what it has received and not read
(`rmem_alloc`) plus what it has sent that is not yet freed (the larger of `wmem_alloc` and `wmem_queued`): a Unix
socket's unread data is charged to the socket that sent it, a TCP socket's to both its send and the peer's receive
queue, so a pair both ends of which a run holds is counted once or, over loopback TCP, up to twice (an
over-estimate, as the watch prefers).
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterator

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_NLMSG = struct.Struct("=IHHII")  # struct nlmsghdr: length, type, flags, sequence, port
_NLATTR = struct.Struct("=HH")  # struct nlattr: length, type
_MEMINFO = struct.Struct("=9I")  # SK_MEMINFO_*: rmem_alloc, rcvbuf, wmem_alloc, sndbuf, fwd_alloc, wmem_queued, ...

# Unix sockets: struct unix_diag_req (family, protocol, pad, states, inode, show, cookie) and unix_diag_msg's head.
_UNIX_REQUEST = struct.Struct("=BBHIII8s")
_UNIX_MESSAGE = struct.Struct("=BBBBI8s")  # family, type, state, pad, inode, cookie
_UDIAG_SHOW_MEMINFO, _UNIX_DIAG_MEMINFO = 0x20, 5
# TCP and UDP: struct inet_diag_req_v2 (family, protocol, extensions, pad, states, a zero socket id of 48 bytes) and
# inet_diag_msg (family, state, timer, retransmits, socket id, expires, rqueue, wqueue, uid, inode).
_INET_REQUEST = struct.Struct("=BBBBI48s")
_INET_MESSAGE = struct.Struct("=BBBB48sIIIII")
_INET_DIAG_SKMEMINFO = 7
_ALL_STATES = 0xFFFFFFFF
_FAMILIES = (
    (socket.AF_INET, socket.IPPROTO_TCP),
    (socket.AF_INET6, socket.IPPROTO_TCP),
    (socket.AF_INET, socket.IPPROTO_UDP),
    (socket.AF_INET6, socket.IPPROTO_UDP),
)


def socket_bytes() -> dict[int, int]:
    """Each socket's buffered bytes, by inode, for every Unix, TCP and UDP socket of this network namespace that holds
    any. A kind the kernel cannot report (no sock_diag module for it) is left out; {} where netlink is refused."""
    found: dict[int, int] = {}
    try:
        diag = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, _NETLINK_SOCK_DIAG)
    except OSError:
        return found
    with diag:
        request = _UNIX_REQUEST.pack(socket.AF_UNIX, 0, 0, _ALL_STATES, 0, _UDIAG_SHOW_MEMINFO, b"\xff" * 8)
        for body, attributes in _dump(diag, request, 1, _UNIX_MESSAGE.size):
            _, _, _, _, inode, _ = _UNIX_MESSAGE.unpack_from(body)
            _add(found, inode, attributes.get(_UNIX_DIAG_MEMINFO))
        for seq, (family, protocol) in enumerate(_FAMILIES, start=2):
            extensions = 1 << (_INET_DIAG_SKMEMINFO - 1)
            request = _INET_REQUEST.pack(family, protocol, extensions, 0, _ALL_STATES, bytes(48))
            for body, attributes in _dump(diag, request, seq, _INET_MESSAGE.size):
                inode = _INET_MESSAGE.unpack_from(body)[-1]
                _add(found, inode, attributes.get(_INET_DIAG_SKMEMINFO))
    return found


def _add(found: dict[int, int], inode: int, meminfo: bytes | None) -> None:
    if meminfo is None or len(meminfo) < _MEMINFO.size or not inode:
        return
    rmem_alloc, _, wmem_alloc, _, _, wmem_queued, *_ = _MEMINFO.unpack_from(meminfo)
    held = rmem_alloc + max(wmem_alloc, wmem_queued)
    if held:
        found[inode] = found.get(inode, 0) + held


def _dump(diag: socket.socket, request: bytes, seq: int, head: int) -> Iterator[tuple[bytes, dict[int, bytes]]]:
    """The messages of one sock_diag dump: each one's body (its fixed part is `head` bytes) and its attributes by
    type. Stops at the dump's end, at an error (a family the kernel has no module for), or when netlink fails."""
    header = _NLMSG.pack(_NLMSG.size + len(request), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST | _NLM_F_DUMP, seq, 0)
    with contextlib.suppress(OSError):
        diag.sendto(header + request, (0, 0))
        while True:
            data = diag.recv(1 << 16)
            if not data:
                return
            at = 0
            while at + _NLMSG.size <= len(data):
                length, kind, _, got_seq, _ = _NLMSG.unpack_from(data, at)
                if length < _NLMSG.size:
                    return
                if got_seq == seq:
                    if kind in (_NLMSG_DONE, _NLMSG_ERROR):
                        return
                    body = data[at + _NLMSG.size : at + length]
                    if len(body) >= head:
                        yield body, _attributes(body, head)
                at += (length + 3) & ~3


def _attributes(body: bytes, start: int) -> dict[int, bytes]:
    found: dict[int, bytes] = {}
    at = start
    while at + _NLATTR.size <= len(body):
        length, kind = _NLATTR.unpack_from(body, at)
        if length < _NLATTR.size:
            break
        found[kind & 0x3FFF] = body[at + _NLATTR.size : at + length]
        at += (length + 3) & ~3
    return found


def socket_inode(link: str) -> int | None:
    """The inode of a descriptor's /proc link naming a socket (``socket:[12345]``), else None."""
    if link.startswith("socket:[") and link.endswith("]"):
        with contextlib.suppress(ValueError):
            return int(link[8:-1])
    return None
