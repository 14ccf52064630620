"""Limits a minute, per client and per key, as LibreTranslate's --req-limit and a key's req_limit
are: requests a minute and characters a minute, past which a request is answered 429 with
Retry-After (the seconds until the minute turns) and LibreTranslate's "Slowdown: ..." message.

A client is its address (request.remote: a proxy's X-Forwarded-For is a header anyone can write,
so it is not believed). A request with a valid key counts against the key, under the key's own
limits (keys.py) or else the server's. Counts are kept for the current minute only (a fixed
window, as flask-limiter's default that LibreTranslate uses), so their memory is bounded by the
clients seen in one minute, and at most MAX_TRACKED of those.
"""
import math
import time

WINDOW_S = 60.0
# The clients one minute's counts keep at most: past it the counts start over early (an attacker
# with more addresses than this gets fresh counts a little sooner; nobody gets memory without bound).
MAX_TRACKED = 100_000


class Refused(Exception):
    """Past a limit: 429 with Retry-After."""

    def __init__(self, message, retry_after):
        super().__init__(message)
        self.retry_after = retry_after


class RateLimits:
    """Requests and characters a minute for each client or key. clock(): seconds (monotonic)."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.window = None              # the current minute's number
        self.counts = {}                # who -> [requests, characters] this minute

    def charge(self, who, characters, req_limit, char_limit, said):
        """Count one request of `characters` for `who`, or raise Refused when it would pass
        req_limit requests or char_limit characters this minute (0 or None: no limit). said: how
        the message names the limit's owner and flag ("this address (--req-limit)")."""
        if not req_limit and not char_limit:
            return
        now = self.clock()
        window = math.floor(now / WINDOW_S)
        if window != self.window or len(self.counts) >= MAX_TRACKED:
            self.window, self.counts = window, {}
        count = self.counts.setdefault(who, [0, 0])
        retry_after = max(1, math.ceil((window + 1) * WINDOW_S - now))
        if req_limit and count[0] + 1 > req_limit:
            raise Refused(f"Slowdown: {req_limit} per 1 minute ({said})", retry_after)
        if char_limit and count[1] + characters > char_limit:
            raise Refused(f"Slowdown: {char_limit} characters per 1 minute ({said}); this request holds "
                          f"{characters}", retry_after)
        count[0] += 1
        count[1] += characters
