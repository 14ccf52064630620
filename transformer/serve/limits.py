"""Limits a minute, per client and per key, as LibreTranslate's --req-limit and a key's req_limit
are: requests a minute and characters a minute, past which a request is answered 429 with
Retry-After (the seconds until the request would fit) and LibreTranslate's "Slowdown: ..." message.

Each limit is a bucket (a token bucket) that holds a minute's allowance and refills at that rate:
N requests a minute lets N through at once, then one every 60/N seconds. Unlike a fixed window
(flask-limiter's default, which LibreTranslate uses) no client gets 2 x N across a minute's turn,
and the answer does not depend on where the turn falls.

A client is its address (request.remote: a proxy's X-Forwarded-For is a header anyone can write,
so it is not believed). A request with a valid key counts against the key, under the key's own
limits (keys.py) or else the server's. A full bucket is as good as none, so the table keeps only
clients that used some of theirs in the last minute, at most MAX_TRACKED: its memory is bounded.
"""
import math
import time

WINDOW_S = 60.0
# The clients kept at most: past it the full buckets are dropped, and if that is not enough every
# bucket starts over full (an attacker with more addresses than this gets its allowance a little
# sooner; nobody gets memory without bound).
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
        self.used = {}              # who -> [requests used, characters used, when]: drained at the limits' rates

    def charge(self, who, characters, req_limit, char_limit, said):
        """Count one request of `characters` for `who`, or raise Refused when it would pass
        req_limit requests or char_limit characters a minute (0 or None: no limit). said: how the
        message names the limit's owner and flag ("this address: --req-limit")."""
        if not req_limit and not char_limit:
            return
        now = self.clock()
        if who not in self.used and len(self.used) >= MAX_TRACKED:
            self._forget(now, req_limit, char_limit)
        requests, chars, then = self.used.get(who, (0.0, 0.0, now))
        elapsed = now - then        # what has drained since: the limit's share of a minute
        requests = max(0.0, requests - elapsed * (req_limit or 0) / WINDOW_S)
        chars = max(0.0, chars - elapsed * (char_limit or 0) / WINDOW_S)
        if req_limit and requests + 1 > req_limit:
            raise Refused(f"Slowdown: {req_limit} per 1 minute ({said})",
                          _wait(requests + 1 - req_limit, req_limit))
        if char_limit and chars + characters > char_limit:
            wait = _wait(chars + characters - char_limit, char_limit) if characters <= char_limit else WINDOW_S
            raise Refused(f"Slowdown: {char_limit} characters per 1 minute ({said}); this request holds "
                          f"{characters}", wait)
        self.used[who] = [requests + 1, chars + characters, now]

    def _forget(self, now, req_limit, char_limit):
        """Drop the clients whose buckets are full again (a minute since their last request), or
        else every one."""
        self.used = {who: entry for who, entry in self.used.items() if now - entry[2] < WINDOW_S}
        if len(self.used) >= MAX_TRACKED:
            self.used = {}


def _wait(excess, limit):
    """Whole seconds until `excess` of a limit of `limit` a minute has drained (at least 1)."""
    return max(1, math.ceil(excess * WINDOW_S / limit))
