"""Tendon Brain: runs agent turns durably. Its public face for Python is the HTTP API's client::

    from brain import AsyncClient, Client

(``brain.face.client``, loaded when first asked for: a Brain process never needs it.)"""

from __future__ import annotations

from typing import Any

__all__ = ["AsyncClient", "Client"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from brain.face import client

        return getattr(client, name)
    raise AttributeError(f"module 'brain' has no attribute {name!r}")
