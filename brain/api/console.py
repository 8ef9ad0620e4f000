"""The console: a few static files (``web/``: HTML, CSS and JavaScript modules, no build step and
nothing fetched from elsewhere) that the Brain serves at ``/console``. In the browser it lists the
caller's sessions and turns, follows a turn live, answers its approvals and, for an operator,
shows what waits for one. It reads and acts through the public HTTP API only, with the token the
user types in, so whatever it shows any other client can read too; closing it changes nothing."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, RedirectResponse

from brain.api.guard import CheckedRoute
from protocol import NotFoundError

router = APIRouter(include_in_schema=False, route_class=CheckedRoute)
WEB = Path(__file__).with_name("web")
TYPES = {".html": "text/html", ".css": "text/css", ".js": "text/javascript"}
# The files served, by name: only these (a name is never a path).
FILES = {p.name: p for p in WEB.iterdir() if p.suffix in TYPES}


@router.get("/")
async def root(request: Request) -> RedirectResponse:
    # The query goes along: `/?session=S&turn=T` opens that turn, as `/console?...` does.
    query = request.url.query
    return RedirectResponse("/console" + (f"?{query}" if query else ""))


@router.get("/console")
async def console() -> FileResponse:
    return _file("index.html")


@router.get("/console/{name}")
async def asset(name: str) -> FileResponse:
    return _file(name)


def _file(name: str) -> FileResponse:
    path = FILES.get(name)
    if path is None:
        raise NotFoundError(f"the console has no file {name!r}")
    # Always checked again: a Brain upgraded in place serves its new console at the next load.
    return FileResponse(path, media_type=TYPES[path.suffix], headers={"Cache-Control": "no-cache"})
