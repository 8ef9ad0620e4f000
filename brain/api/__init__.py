"""The HTTP API: routes over the same verbs the CLI calls (``app``), who may call (``auth``), the
event stream (``stream``), and serving it from a Brain (``server``)."""

from brain.api.app import Api, create_app
from brain.api.auth import Caller, Tokens, hash_token, new_token

__all__ = ["Api", "Caller", "Tokens", "create_app", "hash_token", "new_token"]
