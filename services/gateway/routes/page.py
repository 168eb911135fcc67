"""GET /rollout/ui: the rollout page (one static file; it asks for an admin key and calls the API)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

__all__ = ["router"]

router = APIRouter(tags=["rollout"])
_PAGE = Path(__file__).resolve().parent.parent / "static" / "rollout.html"


@router.get("/rollout/ui", response_class=HTMLResponse, include_in_schema=False)
async def page() -> HTMLResponse:
    """Versions, traffic split, reward per version over time, and the control buttons."""
    return HTMLResponse(_PAGE.read_text(), headers={
        "Cache-Control": "no-store", "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
        # One self-contained file: its inline script and style, calls to this origin only, no framing.
        "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; "
                                   "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; "
                                   "frame-ancestors 'none'"})
