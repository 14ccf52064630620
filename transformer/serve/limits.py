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

Where the buckets live is --req-limit-storage, as LibreTranslate's flag (a storage URI):
memory:// (this process's memory: the default) or sqlite:///PATH (an SQLite file, so that the
servers of one host share one allowance per client and key, and a restart keeps the counts).
RateLimits does the arithmetic; a store only loads and saves (requests, chars, when) per client,
one client at a time (store.update).
"""
import asyncio
import concurrent.futures
import hashlib
import json
import math
import os
import sqlite3
import threading
import time

WINDOW_S = 60.0
# The clients kept at most: past it the full buckets are dropped, and if that is not enough every
# bucket starts over full (an attacker with more addresses than this gets its allowance a little
# sooner; nobody gets memory without bound).
MAX_TRACKED = 100_000
BUSY_TIMEOUT_S = 5.0        # how long a charge waits for another process's transaction on the file
COUNT_EVERY_S = 1.0         # the file's rows are counted against MAX_TRACKED at most this often
STORAGE_HELP = "memory:// or sqlite:///PATH"


class Refused(Exception):
    """Past a limit: 429 with Retry-After."""

    def __init__(self, message, retry_after):
        super().__init__(message)
        self.retry_after = retry_after


class RateLimits:
    """Requests and characters a minute for each client or key, their buckets in `store` (default:
    a MemoryStore). clock(): seconds (default the store's: monotonic in memory, the wall clock in a
    file that other processes and later runs read)."""

    def __init__(self, store=None, clock=None):
        self.store = store if store is not None else MemoryStore()
        self.clock = clock or self.store.clock

    def charge(self, who, characters, req_limit, char_limit, said):
        """Count one request of `characters` for `who`, or raise Refused when it would pass
        req_limit requests or char_limit characters a minute (0 or None: no limit). said: how the
        message names the limit's owner and flag ("this address: --req-limit")."""
        if not req_limit and not char_limit:
            return
        now = self.clock()
        refused = []

        def settle(entry):
            """The bucket to save for `who` (None: full again, nothing to keep) from the one loaded
            (None: none), with the request counted unless it is refused."""
            requests, chars, then = entry if entry is not None else (0.0, 0.0, now)
            elapsed = max(0.0, now - then)      # what has drained since (a clock set back drains nothing)
            requests = max(0.0, requests - elapsed * (req_limit or 0) / WINDOW_S)
            chars = max(0.0, chars - elapsed * (char_limit or 0) / WINDOW_S)
            if req_limit and requests + 1 > req_limit:
                refused.append(Refused(f"Slowdown: {req_limit} per 1 minute ({said})",
                                       _wait(requests + 1 - req_limit, req_limit)))
            elif char_limit and chars + characters > char_limit:
                wait = _wait(chars + characters - char_limit, char_limit) if characters <= char_limit else WINDOW_S
                refused.append(Refused(f"Slowdown: {char_limit} characters per 1 minute ({said}); this request "
                                       f"holds {characters}", wait))
            else:
                return [requests + 1, chars + characters, now]
            # refused: the bucket as drained to now (the same bucket, dated now), or none if full
            return [requests, chars, now] if requests or chars else None
        self.store.update(who, now, settle)
        if refused:
            raise refused[0]

    async def charge_on_loop(self, *args):
        """charge(*args) from the event loop: at once for memory, in the store's own thread for a
        file (a charge there may wait BUSY_TIMEOUT_S on another process's lock, or on the disk)."""
        if self.store.executor is None:
            return self.charge(*args)
        return await asyncio.wrap_future(self.store.executor.submit(self.charge, *args))

    def close(self):
        self.store.close()


class MemoryStore:
    """memory://: the buckets in a dict of this process, {who: [requests, chars, when]}."""
    clock = staticmethod(time.monotonic)
    executor = None

    def __init__(self):
        self.used = {}

    def update(self, who, now, settle):
        """Save settle(who's bucket or None) as who's bucket (None: drop it)."""
        entry = self.used.get(who)
        if entry is None and len(self.used) >= MAX_TRACKED:
            self._forget(now)
        entry = settle(entry)
        if entry is not None:
            self.used[who] = entry
        else:
            self.used.pop(who, None)

    def _forget(self, now):
        """Drop the clients whose buckets are full again (a minute since their last request), or
        else every one."""
        self.used = {who: entry for who, entry in self.used.items() if now - entry[2] < WINDOW_S}
        if len(self.used) >= MAX_TRACKED:
            self.used = {}

    def close(self):
        pass


class SqliteStore:
    """sqlite:///PATH: the buckets in an SQLite file, one row a client (its SHA-256: keys are not
    written in clear), shared by every process that opens it. Each update is one transaction
    (BEGIN IMMEDIATE: read the row, settle, write), so two processes charging one client never
    count the same allowance twice. A new row first drops the rows a minute old (full again), and
    the rows are counted against MAX_TRACKED once a second at most (then, as in memory, the full
    ones go, or else all): the file holds MAX_TRACKED rows plus at most a second's new clients.

    Each thread has its own connection; the server charges from one thread of its own (executor),
    so the event loop never waits on the file. WAL with synchronous=NORMAL: a commit is a write to
    the log, not an fsync (a crash of the machine may lose the last counts, never the file)."""
    clock = staticmethod(time.time)

    def __init__(self, path):
        self.path = path
        self._local = threading.local()
        self._counted = -math.inf
        db = self._connection()         # a path that cannot be written fails now, not in a request
        db.execute("BEGIN IMMEDIATE")
        db.execute("DELETE FROM rate_buckets WHERE who = x''")
        db.execute("COMMIT")
        self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rate-limits")

    def _connection(self):
        db = getattr(self._local, "db", None)
        if db is None:
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute("CREATE TABLE IF NOT EXISTS rate_buckets (who BLOB PRIMARY KEY, requests REAL NOT NULL, "
                           "chars REAL NOT NULL, seen REAL NOT NULL)")
                db.execute("CREATE INDEX IF NOT EXISTS rate_buckets_seen ON rate_buckets (seen)")
            except BaseException:
                db.close()
                raise
            self._local.db = db
        return db

    def update(self, who, now, settle):
        """Save settle(who's bucket or None) as who's bucket (None: drop it), in one transaction."""
        db = self._connection()
        digest = hashlib.sha256(json.dumps(who).encode("utf-8")).digest()
        db.execute("BEGIN IMMEDIATE")
        try:
            row = db.execute("SELECT requests, chars, seen FROM rate_buckets WHERE who = ?", (digest,)).fetchone()
            if row is None:
                self._make_room(db, now)
            entry = settle(row)
            if entry is not None:
                db.execute("INSERT OR REPLACE INTO rate_buckets VALUES (?, ?, ?, ?)", (digest, *entry))
            elif row is not None:
                db.execute("DELETE FROM rate_buckets WHERE who = ?", (digest,))
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    def _make_room(self, db, now):
        db.execute("DELETE FROM rate_buckets WHERE seen < ?", (now - WINDOW_S,))
        if now - self._counted >= COUNT_EVERY_S:
            self._counted = now
            if db.execute("SELECT COUNT(*) FROM rate_buckets").fetchone()[0] >= MAX_TRACKED:
                db.execute("DELETE FROM rate_buckets")

    def rows(self):
        return self._connection().execute("SELECT COUNT(*) FROM rate_buckets").fetchone()[0]

    def close(self):
        """Close the connections: the store's thread's, then this thread's."""
        if getattr(self, "executor", None) is not None:
            self.executor.submit(self._close_connection).result()
            self.executor.shutdown(wait=True)
        self._close_connection()

    def _close_connection(self):
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None


def open_store(uri):
    """The store of a --req-limit-storage URI: memory://, or sqlite:///PATH (as SQLAlchemy reads it:
    sqlite:///runs/limits.db is relative to the working directory, sqlite:////var/lib/limits.db
    absolute). ValueError naming the flag for anything else, and for a file that cannot be opened
    and written (never a silent fall back to memory)."""
    scheme, sep, rest = uri.partition("://")
    if not sep or not scheme:
        raise ValueError(f"--req-limit-storage {uri[:40]!r} is not a storage URI: {STORAGE_HELP}")
    scheme = scheme.lower()
    if scheme == "memory":
        if rest:
            raise ValueError(f"--req-limit-storage: memory:// takes nothing after it: {STORAGE_HELP}")
        return MemoryStore()
    if scheme != "sqlite":      # redis://, memcached://, mongodb://: not a password in the message
        raise ValueError(f"--req-limit-storage: {scheme}:// is not supported here: {STORAGE_HELP}")
    if not rest.startswith("/") or rest == "/" or "?" in rest or "#" in rest:
        raise ValueError(f"--req-limit-storage {uri[:60]}: give the file as sqlite:///PATH (relative) or "
                         "sqlite:////ABSOLUTE/PATH, no query")
    path = os.path.abspath(rest[1:])
    try:
        return SqliteStore(path)
    except (OSError, sqlite3.Error) as exc:
        raise ValueError(f"--req-limit-storage {uri}: {path} cannot be opened and written ({exc})") from None


def _wait(excess, limit):
    """Whole seconds until `excess` of a limit of `limit` a minute has drained (at least 1)."""
    return max(1, math.ceil(excess * WINDOW_S / limit))
