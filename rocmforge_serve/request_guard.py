"""The requests a local server must refuse before any route sees them: web pages' and rebound names'.

A page the user visits can make the browser send a "simple" cross-site POST (text/plain, a form) to
127.0.0.1:8080 with no preflight, and a DNS-rebinding page reaches it under its own name (Host:
evil.example). So, as Ollama does since its 2024 fix of the same hole, and as the Fetch standard's CORS
model assumes of a server:
- a request with a body must say `Content-Type: application/json` (415 otherwise): a browser sends that type
  cross-site only after a preflight, which this server answers only for --cors-origins;
- Host must name this server: on a loopback address, localhost / 127.0.0.1 / ::1 (or the listen address) at the
  listening port, plus --allowed-hosts; on any other address, --allowed-hosts when given (else any name:
  the server cannot know the names it is reached by);
- Origin, when sent (browsers send it on cross-site and on every POST), must be this server's own (a loopback
  name at the listening port, or an allowed host there) or one of --cors-origins.
Refusals are OpenAI-shaped JSON (403, 415). A pure ASGI middleware: one pass over the headers per request,
nothing per streamed token.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from rocmforge_serve.api_errors import ApiError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_host(value: str) -> tuple[str, int | None]:
    """'name:port', '[v6]:port', 'name' -> (lowercase name without brackets, port or None); ValueError if malformed."""
    value = value.strip().lower()
    if value.startswith("["):
        name, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
        if rest and port is None:
            raise ValueError(value)
    else:
        name, sep, port = value.rpartition(":") if ":" in value else (value, "", None)
        if sep and ":" in name:  # an unbracketed IPv6 address: not a valid Host
            raise ValueError(value)
    if not name or (port is not None and not (port.isdigit() and len(port) <= 5)):
        raise ValueError(value)
    return name, int(port) if port is not None else None


def _name_matches(name: str, pattern: str) -> bool:
    if pattern == "*":
        return True
    if pattern.startswith("*."):
        return name.endswith(pattern[1:])
    return name == pattern


@dataclass(frozen=True)
class HostPolicy:
    """Which Host and Origin values a server listening on listen_host takes (its port: the one the request came
    in on, from the ASGI scope)."""

    listen_host: str
    allowed_hosts: tuple[str, ...] = ()  # names (or "*.example.com", "*"), from --allowed-hosts
    cors_origins: tuple[str, ...] = ()  # "scheme://name[:port]" (or "*"), from --cors-origins
    loopback: bool = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "loopback", is_loopback(self.listen_host))
        object.__setattr__(self, "allowed_hosts", tuple(h.strip().lower() for h in self.allowed_hosts if h.strip()))
        object.__setattr__(self, "cors_origins", tuple(o.strip().rstrip("/").lower() for o in self.cors_origins if o.strip()))

    def _own_names(self) -> set[str]:
        names = set(LOOPBACK_NAMES) if self.loopback else set()
        if self.loopback:
            names.add(self.listen_host.strip("[]").lower())
        return names

    def host_allowed(self, value: str, port_here: int | None) -> bool:
        try:
            name, port = split_host(value)
        except ValueError:
            return False
        if any(_name_matches(name, pattern) for pattern in self.allowed_hosts):
            return True
        if self.loopback:
            return name in self._own_names() and port in (None, port_here)
        return not self.allowed_hosts  # another address and no list: any name

    def origin_allowed(self, origin: str, port_here: int | None) -> bool:
        origin = origin.strip().rstrip("/").lower()
        if "*" in self.cors_origins or origin in self.cors_origins:
            return True
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return False  # "null" (a sandboxed page, a file), or not an origin at all
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return False
        if port != port_here:
            return False
        name = parts.hostname
        return name in self._own_names() or any(_name_matches(name, p) for p in self.allowed_hosts if p != "*")


def _refusal(status: int, message: str, code: str) -> ApiError:
    return ApiError(status, message, type="invalid_request_error", code=code)


class RequestGuard:
    """ASGI middleware: Host, Origin and the body's media type, before any route."""

    def __init__(self, app, policy: HostPolicy):
        self.app = app
        self.policy = policy

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            error = self.check(scope)
            if error is not None:
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def check(self, scope) -> ApiError | None:
        host = origin = content_type = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
            elif name == b"content-type":
                content_type = value.decode("latin-1")
        policy = self.policy
        server = scope.get("server")
        port = server[1] if server else None
        if host is not None and not policy.host_allowed(host, port):
            return _refusal(403, f"the Host header {host[:100]!r} does not name this server; allowed: "
                            + (f"localhost, 127.0.0.1 or [::1] at port {port}" if policy.loopback else "")
                            + (" and " if policy.loopback and policy.allowed_hosts else "")
                            + (", ".join(policy.allowed_hosts) if policy.allowed_hosts else "")
                            + " (serve --allowed-hosts adds names)", "host_not_allowed")
        if origin is not None and not policy.origin_allowed(origin, port):
            return _refusal(403, f"requests from the web origin {origin[:100]!r} are not allowed "
                                 "(serve --cors-origins allows an origin)", "origin_not_allowed")
        if scope["method"] in BODY_METHODS:
            media = (content_type or "").partition(";")[0].strip().lower()
            if media != "application/json":
                return _refusal(415, f"the request body must be JSON with Content-Type: application/json, got "
                                     f"{(content_type or 'no Content-Type')[:100]!r}", "unsupported_media_type")
        return None
