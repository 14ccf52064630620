"""Translated files waiting to be downloaded (POST /translate_file, GET /download_file/NAME): a
temporary folder of the server's own, removed when it stops.

A file's name is a random 32-hex token, then its uploaded name made safe (letters, digits, _ and -)
and the target language: unguessable, and the only names served. A download is a look-up of the
name in the table of files made here; a name that is not one (a path, "..", an expired file's) is
404, and no client string ever becomes a path. A file expires `expiry` seconds after it was made,
and at most MAX_FILES wait at once (past it the oldest goes): the folder is bounded.
"""
import os
import re
import secrets
import shutil
import tempfile
import time

MAX_FILES = 1000
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


class Files:
    """The folder and its table: name -> (path, expires at). clock(): seconds (monotonic)."""

    def __init__(self, expiry=1800.0, clock=time.monotonic):
        self.expiry, self.clock = expiry, clock
        self.folder = tempfile.mkdtemp(prefix="transformer-serve-files-")
        self.table = {}

    def put(self, data, uploaded, target, ext):
        """Store a translated file's bytes; returns its name."""
        self.sweep()
        while len(self.table) >= MAX_FILES:
            self._drop(next(iter(self.table)))
        stem = _UNSAFE.sub("_", os.path.splitext(os.path.basename(uploaded or ""))[0]).strip("_")[:60] or "file"
        name = f"{secrets.token_hex(16)}.{stem}.{_UNSAFE.sub('_', target)[:16]}{ext}"
        path = os.path.join(self.folder, name)
        with open(path, "wb") as f:
            f.write(data)
        self.table[name] = (path, self.clock() + self.expiry)
        return name

    def get(self, name):
        """The path of file `name`, or None: not one of ours, or expired."""
        self.sweep()
        entry = self.table.get(name) if isinstance(name, str) else None
        return entry[0] if entry else None

    def sweep(self):
        now = self.clock()
        for name in [name for name, (_, expires) in self.table.items() if expires <= now]:
            self._drop(name)

    def _drop(self, name):
        path, _ = self.table.pop(name)
        try:
            os.remove(path)
        except OSError:
            pass

    def close(self):
        self.table.clear()
        shutil.rmtree(self.folder, ignore_errors=True)
