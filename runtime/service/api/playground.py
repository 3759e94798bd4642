"""The playground: a static web page (HTML, CSS, one script) served at ``GET /`` and
``GET /playground``, that talks to the public HTTP API with an app key kept in the browser.

The page and its two files need no key: they hold no data. Every data call the page makes
goes to a ``/v1`` route with ``Authorization: Bearer KEY`` like any client's. The page puts
every server string on screen as text (``textContent``), and its Content-Security-Policy
allows scripts and styles from this origin only, so a message holding markup stays text.
The files ship as package data in ``runtime/service/api/static/``; there is no build step.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

STATIC = resources.files("runtime.service.api") / "static"

FILES = {
    "index.html": "text/html; charset=utf-8",
    "playground.js": "text/javascript; charset=utf-8",
    "playground.css": "text/css; charset=utf-8",
}
"""The page's files and their media types; nothing else is served from the folder."""

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data: blob:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


def _file(name: str) -> Response:
    return Response((STATIC / name).read_bytes(), media_type=FILES[name], headers=HEADERS)


@router.get("/")
@router.get("/playground")
def page() -> Response:
    """The playground page (no key needed; it asks for one)."""
    return _file("index.html")


@router.get("/playground/{name}")
def asset(name: str) -> Response:
    """The page's script or stylesheet.

    Raises:
        HTTPException: 404 for any other name.
    """
    if name not in FILES or name == "index.html":
        raise HTTPException(status_code=404, detail=f"No playground file {name!r}.")
    return _file(name)
