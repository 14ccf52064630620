"""API keys as LibreTranslate operators manage them: a SQLite file (--api-keys-db) with one row a
key and its own request limit, kept with `transformer serve keys add|remove|list` as `ltmanage
keys` keeps LibreTranslate's; and, as before, a plain file of keys (--api-keys FILE, one a line).

The table is LibreTranslate's own (api_keys: api_key, req_limit, char_limit), so its database
file serves here as it is, with one column of ours added when missing:

    req_limit         requests a minute (LibreTranslate's meaning)
    char_limit        characters a request, in place of --char-limit (LibreTranslate's meaning;
                      NULL: --char-limit)
    chars_per_minute  characters a minute (ours; NULL: --chars-per-minute)

The server reads the file again when it changes (looked at once a second at most), so a key added
or removed while it runs counts from the next request. A key is found by its SHA-256 and then
compared with hmac.compare_digest: how long a lookup takes does not tell how much of a guessed key
was right.
"""
import collections
import contextlib
import hashlib
import hmac
import os
import sqlite3
import time
import uuid

RELOAD_S = 1.0
KeyLimits = collections.namedtuple("KeyLimits", "req_limit char_limit chars_per_minute")
NO_LIMITS = KeyLimits(None, None, None)
_COLUMNS = {"req_limit": "INTEGER NOT NULL DEFAULT 0", "char_limit": "INTEGER DEFAULT NULL",
            "chars_per_minute": "INTEGER DEFAULT NULL"}


@contextlib.contextmanager
def connect(path, create=False):
    """A connection to the key database at `path`, its table made or completed (create: the file
    may be new; else it must exist); committed and closed at the end of the with block."""
    if not create:
        _must_exist(path)
    db = sqlite3.connect(path)
    try:
        _complete(db)
        yield db
        db.commit()
    finally:
        db.close()


def _must_exist(path):
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such key database (make one with `transformer serve keys add`)")


def _complete(db):
    """The api_keys table made, or given the columns an older schema lacks."""
    db.execute('CREATE TABLE IF NOT EXISTS api_keys ("api_key" TEXT NOT NULL, "req_limit" INTEGER NOT NULL, '
               '"char_limit" INTEGER DEFAULT NULL, "chars_per_minute" INTEGER DEFAULT NULL, PRIMARY KEY("api_key"))')
    have = {row[1] for row in db.execute("PRAGMA table_info(api_keys)")}
    for column, kind in _COLUMNS.items():
        if column not in have:      # a LibreTranslate database of an older schema
            db.execute(f'ALTER TABLE api_keys ADD COLUMN "{column}" {kind}')


def add(path, req_limit, key=None, char_limit=None, chars_per_minute=None):
    """Add `key` (None: a new random one) with its limits, replacing a key of that name; the key."""
    key = key or str(uuid.uuid4())
    with connect(path, create=True) as db:
        db.execute("INSERT OR REPLACE INTO api_keys (api_key, req_limit, char_limit, chars_per_minute) "
                   "VALUES (?, ?, ?, ?)", (key, req_limit, char_limit or None, chars_per_minute or None))
    return key


def remove(path, key):
    """Remove `key`; whether it was there."""
    with connect(path) as db:
        return db.execute("DELETE FROM api_keys WHERE api_key = ?", (key,)).rowcount > 0


def listing(path):
    """[(key, req_limit, char_limit, chars_per_minute)], in the order they were added."""
    with connect(path) as db:
        return db.execute("SELECT api_key, req_limit, char_limit, chars_per_minute FROM api_keys "
                          "ORDER BY rowid").fetchall()


def read_key_file(path):
    """The keys of --api-keys FILE: one a line; blank lines and # comments skipped."""
    with open(path, encoding="utf-8") as f:
        keys = {line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")}
    if not keys:
        raise ValueError(f"{path}: no API key in it (one a line)")
    return keys


def _digest(key):
    # surrogateescape: a header's bytes that are not UTF-8 (aiohttp keeps them as lone surrogates)
    # make a digest of no valid key, not a UnicodeEncodeError
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).digest()


class Keys:
    """The valid keys: `plain` (a set: no limits of their own) and those of the database at
    `db_path` (each with KeyLimits). lookup(candidate) -> KeyLimits, or None for no such key."""

    def __init__(self, plain=(), db_path=None, clock=time.monotonic):
        self.db_path, self.clock = db_path, clock
        self._plain = {_digest(key): (key, NO_LIMITS) for key in plain}
        self._table, self._seen, self._looked = {}, None, None
        if db_path is not None:
            self._reload()                  # a missing file is an error when the server starts

    def _reload(self):
        _must_exist(self.db_path)
        stat = os.stat(self.db_path)
        seen = (stat.st_mtime_ns, stat.st_size)
        if seen == self._seen:
            return
        with connect(self.db_path) as db:
            rows = db.execute("SELECT api_key, req_limit, char_limit, chars_per_minute FROM api_keys").fetchall()
        self._table = {_digest(key): (key, KeyLimits(*limits)) for key, *limits in rows}
        self._seen = seen

    def __len__(self):
        return len(self._plain) + len(self._table)

    def lookup(self, candidate):
        if not isinstance(candidate, str) or not candidate:
            return None
        if self.db_path is not None and (self._looked is None or self.clock() - self._looked >= RELOAD_S):
            self._looked = self.clock()
            try:
                self._reload()
            except (OSError, sqlite3.Error):
                pass                        # being written, or gone for a moment: the last keys read hold
        digest = _digest(candidate)
        for table in (self._table, self._plain):
            found = table.get(digest)
            if found is not None and hmac.compare_digest(found[0].encode("utf-8"),
                                                         candidate.encode("utf-8", "surrogateescape")):
                return found[1]
        return None
