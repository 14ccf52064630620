"""Who may ask what: which routes need a key (--require-key-for), which browser origins may read
the answers (--cors-origins), and which Host names a server bound to loopback answers to.

DNS rebinding: a page on a stranger's site can make its name resolve to 127.0.0.1 and then read a
server on this machine as if it were its own origin. The browser still sends the stranger's name
as Host, so a server bound to loopback answers only the loopback names (and --allowed-hosts);
any other Host is 421 Misdirected Request.

CORS: without --cors-origins no Access-Control-* header is sent, and browsers keep pages of other
origins from reading the answers. With it, a request whose Origin is listed (or any origin, for
"*") gets Access-Control-Allow-Origin naming it, and a preflight (OPTIONS) is answered 204. No
credentials: keys travel in the body or the Authorization header, never in cookies.

--require-api-key-origin ORIGIN (LibreTranslate's): a request whose Origin header is ORIGIN (the
operator's own web page) needs no key where --require-key-for asks one. A browser sets Origin and
a page cannot change it, so a page of another site cannot borrow the exemption; a program can
send any Origin, so the exemption keeps strangers' pages out, not strangers' programs.
"""
import ipaddress
import re

KEY_ROUTES = ("translate", "metrics", "health")     # what --require-key-for names
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
CORS_MAX_AGE_S = 600


def is_loopback(host):
    """Whether the bind address `host` is this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header):
    """The name of a Host header, without its port (and an IPv6 address without brackets)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Access:
    """require_key_for: a subset of KEY_ROUTES (which need a key, when keys are given);
    cors_origins: a tuple of origins, or ("*",); allowed_hosts: the Host names answered (None: any)."""

    def __init__(self, require_key_for=("translate",), cors_origins=(), allowed_hosts=None, key_origin=None):
        unknown = set(require_key_for) - set(KEY_ROUTES)
        if unknown:
            raise ValueError(f"--require-key-for takes {', '.join(KEY_ROUTES)}, got {', '.join(sorted(unknown))}")
        self.require_key_for = frozenset(require_key_for)
        self.key_origin = None if key_origin is None else _origin(key_origin)
        self.cors_origins = tuple(origin if origin == "*" else _normal(origin) for origin in cors_origins)
        self.allowed_hosts = None if allowed_hosts is None else frozenset(h.lower() for h in allowed_hosts)

    def needs_key(self, route, origin):
        """Whether a request to `route` (a KEY_ROUTES name, or None) from `origin` (its Origin
        header, or None) must give a key, when keys are asked for."""
        if route not in self.require_key_for:
            return False
        return self.key_origin is None or origin is None or _normal(origin) != self.key_origin

    def host_allowed(self, header):
        """Whether a request with this Host header (None: none sent, as HTTP/1.0 may) is answered."""
        return self.allowed_hosts is None or header is None or host_name(header) in self.allowed_hosts

    def cors_headers(self, origin):
        """The Access-Control-* headers for a request from `origin` (None: not a browser's cross-origin
        request, or not an allowed origin: none)."""
        if not origin or not self.cors_origins:
            return {}
        if "*" in self.cors_origins:
            allowed = "*"
        elif _normal(origin) in self.cors_origins:     # as needs_key compares it
            allowed = origin
        else:
            return {}
        return {"Access-Control-Allow-Origin": allowed, "Vary": "Origin",
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                "Access-Control-Allow-Headers": "Content-Type, Authorization",
                "Access-Control-Expose-Headers": "Retry-After",
                "Access-Control-Max-Age": str(CORS_MAX_AGE_S)}


def _normal(origin):
    """An origin as compared: scheme and host are case-blind, and a trailing / says nothing more."""
    return origin.strip().rstrip("/").lower()


def _origin(text):
    """--require-api-key-origin's value as browsers send Origin: scheme://host[:port], lower case."""
    origin = _normal(text)
    if not re.fullmatch(r"[a-z][a-z0-9+.-]*://[^/\s?#*]+", origin):
        raise ValueError(f"--require-api-key-origin {text[:60]!r}: an origin is scheme://host[:port], as a "
                         "browser's Origin header gives it (e.g. https://translate.example.org)")
    return origin
