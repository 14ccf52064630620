"""The tatoeba:SRC-TGT shortcut, served from a local HTTP server over ../shared/data/."""
import functools
import http.server
import os
import threading

import pytest

from transformer import datasets
from transformer.data import read_pairs

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


@pytest.fixture
def server(monkeypatch, tmp_path):
    if not os.path.exists(os.path.join(SHARED, "tatoeba-eng-hin.tsv")):
        pytest.skip("../shared/data is not present")
    requests = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            requests.append(self.path)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=SHARED))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv(datasets.URL_ENV, f"http://127.0.0.1:{httpd.server_address[1]}")
    monkeypatch.setenv(datasets.CACHE_ENV, str(tmp_path / "cache"))
    yield requests
    httpd.shutdown()
    httpd.server_close()


def test_download_once_then_reuse_the_verified_cache(server):
    path = datasets.resolve("tatoeba:eng-hin")
    pairs, _ = read_pairs(path, "eng", "hin")
    assert ("How are you?", "आप कैसे हैं?") in pairs
    assert len(server) == 1
    assert datasets.resolve("tatoeba:eng-hin") == path and len(server) == 1   # served from the cache
    with open(path, "ab") as f:                 # a damaged cache is fetched again
        f.write(b"garbage\n")
    datasets.resolve("tatoeba:eng-hin")
    assert len(server) == 2
    assert read_pairs(path, "eng", "hin")[0] == pairs


def test_missing_pair_and_bad_names_are_clear_errors(server):
    with pytest.raises(OSError, match="tatoeba-eng-xyz"):
        datasets.resolve("tatoeba:eng-xyz")
    with pytest.raises(ValueError, match="tatoeba:SRC-TGT"):
        datasets.resolve("wikipedia:eng-hin")
    assert datasets.is_shortcut("tatoeba:eng-hin") and not datasets.is_shortcut("pairs.tsv")
