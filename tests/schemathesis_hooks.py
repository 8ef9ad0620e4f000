"""Schemathesis' own checks of the Brain's API, loaded by tests/test_api_fuzz.py
(``SCHEMATHESIS_HOOKS``): every error answer has the one error shape."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.check
def error_shape(ctx: Any, response: Any, case: Any) -> None:
    """An error answer is ``{"error": {"code": str, "message": str}}``, nothing more or else."""
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        raise AssertionError(f"error {response.status_code} is not JSON: {response.text[:200]!r}") from None
    error = body.get("error") if isinstance(body, dict) else None
    if set(body) != {"error"} or not isinstance(error, dict) or set(error) != {"code", "message"}:
        raise AssertionError(f"error {response.status_code} is not in the error shape: {body!r:.300}")
    if not (isinstance(error["code"], str) and isinstance(error["message"], str)):
        raise AssertionError(
            f"error {response.status_code} has a code or message that is no text: {body!r:.300}"
        )
