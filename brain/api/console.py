"""The live console: one page, served by the Brain, that lists a session's turns and follows one
live (its messages, its tool calls with their status and output, its controls). It reads and acts
through the public API only, with the token the user types in; closing it changes nothing."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, RedirectResponse

router = APIRouter(include_in_schema=False)
PAGE = Path(__file__).with_name("console.html")


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse("/console")


@router.get("/console")
async def console() -> HTMLResponse:
    return HTMLResponse(PAGE.read_text(encoding="utf-8"))
