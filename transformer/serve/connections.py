"""Guards on connections, below HTTP: how many may be open at once, and how long a request's
headers may take to arrive.

aiohttp has neither. Every open connection holds a descriptor and a protocol object, and a client
that sends one header byte a second holds its connection for as long as it likes (aiohttp's
keep-alive timer, armed when the connection opens, cuts it only after keepalive_timeout). So each
connection's protocol is wrapped here:

- At most `max_connections` are open (and never more than the process's descriptors allow, less
  a reserve for files and the model): a new connection past the cap closes the connection that has
  been idle longest (no request being handled: a keep-alive connection waiting, or one still
  sending headers), so idle connections cannot keep a client with a request out. When every
  connection is busy with a request, the new one is answered 503 and closed.
- A request's headers must all arrive within `header_timeout` seconds of its first byte: past it
  the connection is answered 408 and closed. The body has its own bound (fields.py, --body-timeout).
"""
import asyncio
import json
import resource

from aiohttp import web, web_protocol

DESCRIPTOR_RESERVE = 64         # descriptors kept for what is not a connection: files, sockets, threads
# asyncio accepts up to the listen backlog (128) at once before any of them reaches the factory,
# and the idle connections the factory closes free their descriptors only on the loop's next turn,
# by when another burst may have been accepted: twice that many descriptors are kept free, else
# accept fails with EMFILE and asyncio stops accepting for a second each time.
ACCEPT_BURST = 2 * 128


def _raw_answer(status, reason, message, headers=""):
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json; charset=utf-8\r\n{headers}"
            f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def raise_descriptor_limit(target=65536):
    """The soft limit on descriptors raised towards the hard one (at most `target`), as Go's runtime
    does for every server: a soft limit of 1024, the usual default, would cap --max-connections
    at 704. Returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = target if hard == resource.RLIM_INFINITY else min(hard, target)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass                    # not allowed here: the cap follows the soft limit
    return soft


def descriptor_cap(max_connections):
    """max_connections, or fewer when the process may open fewer descriptors (RLIMIT_NOFILE)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return max_connections
    return max(1, min(max_connections, soft - DESCRIPTOR_RESERVE - ACCEPT_BURST))


class Guard:
    """The protocol factory of the listening sockets: make() -> aiohttp's RequestHandler (the
    runner's server), each wrapped. busy(handler): whether a request is being handled on it."""

    def __init__(self, max_connections=1000, header_timeout=10.0):
        self.max_connections = descriptor_cap(max_connections)
        self.header_timeout = header_timeout
        self.open = {}                  # inner handler -> _Guarded
        self.evicted = self.refused = self.timed_out = 0
        self.busy = lambda handler: False

    def factory(self, make):
        def protocol():
            if len(self.open) >= self.max_connections and not self._evict_idle():
                self.refused += 1
                return _Refused(_raw_answer(503, "Service Unavailable",
                                            f"the server holds {len(self.open)} connections, each busy with a "
                                            "request, and takes no more (--max-connections); retry later",
                                            "Retry-After: 1\r\n"))
            guarded = _Guarded(self, _json_errors(make()))
            self.open[guarded.inner] = guarded
            return guarded
        return protocol

    def _evict_idle(self):
        """Close the connection idle longest; False when every one is busy with a request."""
        idle = [g for g in self.open.values() if not self.busy(g.inner)]
        if not idle:
            return False
        oldest = min(idle, key=lambda g: g.active)
        self.open.pop(oldest.inner, None)
        self.evicted += 1
        oldest.close()
        return True

    def begun(self, handler):
        """A request's headers arrived on `handler` (the middleware saw it): its header clock stops."""
        guarded = self.open.get(handler)
        if guarded is not None:
            guarded.headers_arrived()

    def answered(self, handler, body_left):
        """A request on `handler` was answered with `body_left` bytes of its body not yet come:
        when they come they are that body's, not a new request's headers (no clock for them)."""
        guarded = self.open.get(handler)
        if guarded is not None:
            guarded.body_left = max(int(body_left), 0)

    def lost(self, guarded):
        if self.open.get(guarded.inner) is guarded:
            del self.open[guarded.inner]


def _json_errors(handler):
    """aiohttp's RequestHandler `handler`, its own answers to what its parser refuses (a bad method,
    Content-Length or chunk, a header past 8,190 bytes, a duplicate Host: before any middleware
    runs) given in LibreTranslate's error form, {"error": ...}, as every other 4xx, not text/plain.
    (Its class has __slots__: the instance takes a subclass's method by its class, not an attribute.)"""
    if type(handler) is web_protocol.RequestHandler:
        handler.__class__ = _JsonErrors
    return handler


class _JsonErrors(web_protocol.RequestHandler):
    __slots__ = ()

    def handle_error(self, request, status=500, exc=None, message=None):
        response = super().handle_error(request, status, exc, message)   # logs it; the connection closes after
        if not 400 <= response.status < 500:
            return response
        reason = " ".join(str(message or getattr(exc, "message", "") or response.reason).split())
        answer = web.json_response({"error": f"the request is not HTTP this server reads ({reason[:120]})"},
                                   status=response.status)
        answer.force_close()
        return answer


class _Guarded(asyncio.Protocol):
    """aiohttp's RequestHandler behind a header clock; everything else is passed through."""

    def __init__(self, guard, inner):
        self.guard, self.inner = guard, inner
        self.loop = asyncio.get_running_loop()
        self.transport = None
        self.active = self.loop.time()      # the last time bytes came
        self.since = None                   # when the headers now arriving began (None: none are)
        self.timer = None
        self.body_left = 0                  # bytes of an answered request's body still to come

    def connection_made(self, transport):
        self.transport = transport
        self.inner.connection_made(transport)

    def data_received(self, data):
        self.active = self.loop.time()
        if self.body_left and not self.guard.busy(self.inner):
            # the rest of a body its handler did not read (a GET with a Content-Length, or one
            # answered before its body came): aiohttp reads it away; only what follows it is a
            # new request (a clock for these bytes answered 408 to no request, 10 s later)
            body = min(len(data), self.body_left)
            self.body_left -= body
            if body == len(data):
                self.inner.data_received(data)
                return
        if self.since is None and not self.guard.busy(self.inner) and self.guard.header_timeout:
            self.since = self.active            # a new request's first bytes: its headers' clock starts
            self.timer = self.loop.call_later(self.guard.header_timeout, self._too_slow)
        self.inner.data_received(data)

    def headers_arrived(self):
        self.since = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _too_slow(self):
        self.timer = None
        if self.since is None or self.guard.busy(self.inner) or self.transport is None:
            return
        self.guard.timed_out += 1
        self.transport.write(_raw_answer(408, "Request Timeout",
                                         f"the request's headers took longer than {self.guard.header_timeout:g} s "
                                         "to arrive (--header-timeout)"))
        self.close()

    def close(self):
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def eof_received(self):
        return self.inner.eof_received()

    def connection_lost(self, exc):
        self.headers_arrived()
        self.guard.lost(self)
        self.inner.connection_lost(exc)

    def pause_writing(self):
        self.inner.pause_writing()

    def resume_writing(self):
        self.inner.resume_writing()


class _Refused(asyncio.Protocol):
    """A connection past the cap: one answer, then closed."""

    def __init__(self, answer):
        self.answer = answer

    def connection_made(self, transport):
        transport.write(self.answer)
        transport.close()
