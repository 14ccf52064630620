"""Dataset shortcuts: `--data tatoeba:eng-hin` downloads a Tatoeba pair file once.

The file is cached in $TRANSFORMER_CACHE (default ~/.cache/transformer-cpu) with a SHA-256 of its
contents beside it; a cached copy whose checksum no longer matches is downloaded again, and a
download is written to a temporary name and renamed, so an interrupted one never leaves a broken
cache.

Where from: by default the Tatoeba sentence pairs that manythings.org exports for Anki
(`{base}/{tgt}-{src}.zip` holding `{tgt}.txt`: English, translation, attribution). Setting
TRANSFORMER_DATA_URL to another base fetches `{base}/tatoeba-{src}-{tgt}.tsv` instead (a
tab-separated file with a header line), which is how the tests serve ../shared/data/ locally.
"""
import hashlib
import io
import os
import re
import urllib.error
import urllib.request
import zipfile

from .serialization import atomic_write_bytes

DEFAULT_BASE = "https://www.manythings.org/anki"
URL_ENV = "TRANSFORMER_DATA_URL"
CACHE_ENV = "TRANSFORMER_CACHE"
_SHORTCUT = re.compile(r"^(tatoeba):([a-z]{3})-([a-z]{3})$")


def is_shortcut(spec):
    return bool(_SHORTCUT.match(str(spec))) and not os.path.exists(str(spec))


def cache_dir():
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "transformer-cpu")


def _sha256(data):
    return hashlib.sha256(data).hexdigest()


def _fetch(url, timeout=60):
    request = urllib.request.Request(url, headers={"User-Agent": "transformer-cpu (dataset download)"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read()
    except (urllib.error.URLError, OSError) as exc:
        raise OSError(f"could not download {url}: {exc}") from None


def _anki_zip_to_tsv(blob, src, tgt, url):
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as archive:
            text = archive.read(f"{tgt}.txt").decode("utf-8")
    except (zipfile.BadZipFile, KeyError, UnicodeDecodeError) as exc:
        raise ValueError(f"{url}: not the expected Tatoeba/Anki archive ({exc})") from None
    return (f"{src}\t{tgt}\tattribution\n" + text).encode("utf-8")


def resolve(spec):
    """A local path for a dataset shortcut such as 'tatoeba:eng-hin' (downloaded when needed)."""
    match = _SHORTCUT.match(str(spec))
    if not match:
        raise ValueError(f"unknown dataset {spec!r}: use a file path or tatoeba:SRC-TGT (e.g. tatoeba:eng-hin)")
    _, src, tgt = match.groups()
    directory = cache_dir()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"tatoeba-{src}-{tgt}.tsv")
    checksum_path = path + ".sha256"
    if os.path.exists(path) and os.path.exists(checksum_path):
        with open(path, "rb") as f:
            data = f.read()
        with open(checksum_path) as f:
            if f.read().strip() == _sha256(data):
                return path
    base = os.environ.get(URL_ENV)
    if base:
        url = f"{base.rstrip('/')}/tatoeba-{src}-{tgt}.tsv"
        data = _fetch(url)
    else:
        url = f"{DEFAULT_BASE}/{tgt}-{src}.zip"
        data = _anki_zip_to_tsv(_fetch(url), src, tgt, url)
    if not data.strip():
        raise ValueError(f"{url}: the download is empty")
    atomic_write_bytes(path, data)
    atomic_write_bytes(checksum_path, (_sha256(data) + "\n").encode())
    return path
