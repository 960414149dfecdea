"""Ports for tests."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (nobody listens on it after this returns)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
