"""The Host-header names the servers of ``make up`` answer (DNS rebinding: a web page whose own
name now resolves to 127.0.0.1 still sends that name as ``Host``, and is refused)."""

from __future__ import annotations

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def allowed_hosts(host: str) -> list[str]:
    """Loopback names and the bound address (``VFM_HOST``, the one its clients' URLs name); an
    IPv6 address in brackets, as a ``Host`` header writes it."""
    name = host.lower()
    name = f"[{name}]" if ":" in name and not name.startswith("[") else name
    return list(dict.fromkeys([*LOOPBACK, *([name] if name else [])]))
