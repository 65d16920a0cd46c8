"""Loopback-only addresses and ports for embedded servers."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

__all__ = ["ADDR_IN_USE", "can_connect", "check_loopback", "format_host", "free_ports", "port_of"]

# How nats-server reports a port that is taken (in its log).
ADDR_IN_USE = "address already in use"


def check_loopback(host: str) -> str:
    if host == "localhost":
        return host
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"embedded nats-server only binds loopback addresses, not {host!r}")
    return host


def format_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Distinct ports that were free a moment ago (all held at once, then released)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            socks.append(sock)
            sock.bind((host, 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for sock in socks:
            sock.close()


def can_connect(host: str, port: int, timeout: float = 0.25) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def port_of(url: str) -> int | None:
    try:
        return urlsplit(url).port
    except ValueError:
        return None
