"""The guard every request of the console goes through (:func:`guard`, the application's middleware), and the
audit log of what it lets through and refuses (:func:`audit`).

**Safe by default.** :func:`guard` checks every request before it reaches a page:

- With a token (needed to bind anything but a loopback address), every request carries it: ``Authorization: Bearer``
  or the cookie set when a page is opened once with ``?token=`` (HttpOnly, SameSite=Strict). The cookie holds an
  HMAC of the token (:func:`cookie_value`), checked here, never the token itself. Without one (a
  loopback address), the ``Host`` header must name the console itself: a page elsewhere cannot reach it through a
  rebound DNS name.
- An action is a ``POST`` of JSON with the page's CSRF header (a value made per console process, which another site
  can neither read nor send without a CORS preflight the console never grants), and an ``Origin``, when the browser
  sends one, of the console itself. ``--read-only`` refuses every action.
- The pages load nothing from elsewhere (Content-Security-Policy ``default-src 'self'``): the script and the style
  sheet are the package's own (``static/``).

**Accountable.** Every action (asked and done) and every refused request is logged as one JSON line on the
``rebaser.console.audit`` logger (:func:`audit`): who (the token's identity, a fingerprint of it, or ``local`` on
a loopback console without one), from where (the peer address, and ``X-Forwarded-For`` as a proxy gave it), what,
which targets, when and the outcome. A pause made from the console stores who made it (``Pause.by``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

__all__ = [
    "AUDIT_LOGGER",
    "CONFIG",
    "COOKIE",
    "CSRF_HEADER",
    "audit",
    "cookie_value",
    "guard",
    "identity_of",
    "what_of",
]

AUDIT_LOGGER = "rebaser.console.audit"
audit_log = logging.getLogger(AUDIT_LOGGER)

COOKIE = "rebaser_console"
CSRF_HEADER = "X-Rebaser-CSRF"
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# The console's settings (make_app fills them in, set_port the hosts): the guard checks a request against them, and
# the pages and actions read them too.
CONFIG: web.AppKey[dict[str, Any]] = web.AppKey("config", dict)


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


def cookie_value(token: str) -> str:
    """What the cookie holds: an HMAC-SHA256 of a fixed label keyed by the token. The guard computes it again and
    compares; the browser never stores the token, and the cookie does not reveal it."""
    return hmac.new(token.encode(), b"rebaser-console-cookie-v1", hashlib.sha256).hexdigest()


def identity_of(token: str | None) -> str:
    """Who a request that passed the guard is, for the audit log and a pause's ``by``: ``token:<fingerprint>`` (the
    first 12 hex digits of the token's SHA-256, enough to tell tokens apart, useless to guess one), or ``local``
    (a loopback console without a token: anyone on the machine)."""
    if token is None:
        return "local"
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:12]


def audit(
    request: web.Request,
    what: str,
    outcome: str,
    *,
    status: int,
    targets: Sequence[str] = (),
    lines: Sequence[str] = (),
    who: str | None = None,
) -> None:
    """One JSON line on the ``rebaser.console.audit`` logger: who, from where, what, which targets, when, outcome."""
    entry = {
        "at": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "who": who or "unknown",
        "peer": request.remote,
        "forwarded_for": request.headers.get("X-Forwarded-For"),
        "method": request.method,
        "path": request.path,
        "what": what,
        "targets": list(targets)[:50] + ([f"... and {len(targets) - 50} more"] if len(targets) > 50 else []),
        "outcome": outcome,
        "status": status,
        "lines": [line[:300] for line in lines[:20]],
    }
    audit_log.info(json.dumps(entry, separators=(",", ":")))


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    config = request.app[CONFIG]
    token: str | None = config["token"]
    if token is None and request.host not in config["hosts"]:
        why = f"this console answers as {sorted(config['hosts'])[0]} only"
        audit(request, what_of(request), "refused", status=421, lines=[why], who="unauthenticated")
        return web.Response(status=421, text=why + "\n", headers=_HEADERS)
    if token is not None:
        given = request.query.get("token")
        if given is not None and _same(given, token) and request.method == "GET":
            rest = {k: v for k, v in request.query.items() if k != "token"}
            again = web.HTTPSeeOther(request.path + (f"?{urlencode(rest)}" if rest else ""))
            again.set_cookie(
                COOKIE,
                config["cookie"],
                httponly=True,
                samesite="Strict",
                path="/",
                secure=_scheme(request) == "https",  # served over TLS, or behind a TLS-terminating proxy
            )
            raise again  # (aiohttp: an HTTPException returned, not raised, is deprecated, and warns each time)
        bearer = request.headers.get("Authorization", "")
        bearer_token = bearer[7:] if bearer.startswith("Bearer ") else None
        if not (_same(request.cookies.get(COOKIE), config["cookie"]) or _same(bearer_token, token)):
            return _refused(
                request, 401, "this console needs its token: open it once with ?token=… (see --token)"
            )
    if request.method == "POST":
        origin = request.headers.get("Origin")
        if origin is not None and origin not in {
            f"{scheme}://{request.host}" for scheme in _schemes(request)
        }:
            why = f"refused: a request from {origin}, not from this console"
            return _refused(request, 403, why, config["identity"])
        if not _same(request.headers.get(CSRF_HEADER), config["csrf"]):
            why = f"refused: no {CSRF_HEADER} header of this console's pages"
            return _refused(request, 403, why, config["identity"])
    response = await handler(request)
    if not response.prepared:
        response.headers.update(_HEADERS)
    return response


def _refused(request: web.Request, status: int, why: str, who: str = "unauthenticated") -> web.Response:
    audit(request, what_of(request), "refused", status=status, lines=[why], who=who)
    if request.method == "POST" or request.path.startswith("/api/"):
        return web.json_response({"ok": False, "lines": [why]}, status=status, headers=_HEADERS)
    return web.Response(status=status, text=why + "\n", headers=_HEADERS)


def _scheme(request: web.Request) -> str:
    """The scheme the browser used: a TLS-terminating proxy in front says it in ``X-Forwarded-Proto``."""
    forwarded = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return forwarded if forwarded in ("http", "https") else request.scheme


def _schemes(request: web.Request) -> set[str]:
    """The schemes an action's ``Origin`` may have: the console's own, and the one a proxy says the browser used
    (the host must be the console's all the same, as the proxy forwards it)."""
    return {request.scheme, _scheme(request)}


def what_of(request: web.Request) -> str:
    """What a request asks, for the audit log: an action's name, else its method and path."""
    if request.path.startswith("/api/actions/"):
        return request.path.removeprefix("/api/actions/")
    return f"{request.method} {request.path}"
