"""Which local user holds the other end of a loopback TCP connection (Linux: /proc/net/tcp).

A wrong token is slowed per client (guard.py). On loopback every local user connects from
127.0.0.1, so an address alone would let another user's guesses slow (or lock out) your own
training and browser: loopback clients are told apart by the uid owning their socket. Read
only on the failure path (a client that sent a wrong token); None where it cannot be known
(not loopback, not Linux, the socket gone).
"""
from __future__ import annotations

import ipaddress
import socket


def _hex_v4(host: str, port: int) -> str:
    packed = socket.inet_aton(host)
    return f"{int.from_bytes(packed, 'little'):08X}:{port:04X}"


def _hex_v6(host: str, port: int) -> str:
    packed = socket.inet_pton(socket.AF_INET6, host)
    words = [int.from_bytes(packed[i:i + 4], "little") for i in range(0, 16, 4)]
    return "".join(f"{w:08X}" for w in words) + f":{port:04X}"


UNKNOWABLE = -1  # no socket table to read (not Linux, /proc hidden): users cannot be told apart


def peer_uid(client: tuple | None, server: tuple | None) -> int | None:
    """The uid owning the client's socket of a loopback connection; None when not found (not
    loopback, or the socket gone); UNKNOWABLE when there is no table to look in."""
    if not client or not server or len(client) < 2 or len(server) < 2:
        return None
    try:
        address = ipaddress.ip_address(client[0])
    except ValueError:
        return None
    if not address.is_loopback and not (address.version == 6 and address.ipv4_mapped
                                        and address.ipv4_mapped.is_loopback):
        return None
    try:
        if address.version == 4:
            table, local, remote = "/proc/net/tcp", _hex_v4(client[0], client[1]), _hex_v4(server[0], server[1])
        else:
            table, local, remote = "/proc/net/tcp6", _hex_v6(client[0], client[1]), _hex_v6(server[0], server[1])
        f = open(table, "rb")
    except OSError:
        return UNKNOWABLE
    try:
        with f:
            for line in f:
                fields = line.split()
                if len(fields) > 7 and fields[1].decode() == local and fields[2].decode() == remote:
                    return int(fields[7])
    except (OSError, ValueError):
        return None
    return None
