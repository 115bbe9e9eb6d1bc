"""Loopback ports: whether one is taken, and one free to bind (servers, brokers and databases
the server or its tests start)."""

from __future__ import annotations

import random
import socket


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port`` now."""
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0


def free_port(host: str = "127.0.0.1") -> int:
    """A port free now, below the kernel's ephemeral range (32768+ on Linux), so that an outgoing
    connection's local port cannot take it between now and the server binding it."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(20000, 32768)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a crowded range: whatever the kernel gives
        s.bind((host, 0))
        return int(s.getsockname()[1])
