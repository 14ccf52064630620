"""Issue 58's limits shared and keys by origin, as LibreTranslate operators run them:
--req-limit-storage (memory://, or sqlite:///PATH shared by the servers of one host and kept
across restarts; anything else refused at startup) and --require-api-key-origin (the operator's own
page needs no key). The tiny model of test_serve.py serves the server tests."""
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import textwrap

import pytest

aiohttp = pytest.importorskip("aiohttp", reason='needs the [serve] extra: pip install ".[serve]"')

from test_serve import Running, model_dir  # noqa: E402,F401
from test_serve_hostile import send  # noqa: E402
import transformer as T  # noqa: E402
from transformer.serve import limits as limits_module  # noqa: E402
from transformer.serve.limits import MemoryStore, RateLimits, Refused, SqliteStore, open_store  # noqa: E402

# where the imported package lives: the checkout (an editable install) or site-packages (CI's)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(T.__file__)))
ENG_SPA = {"source": "eng", "target": "spa"}


def _here():
    """The environment with this test's package first on the path (a subprocess imports it; it runs
    in the temporary directory, so that a checkout's own transformer/ folder, without a compiled
    module where the package was installed, does not shadow it)."""
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _outcomes(rates, now, steps):
    """What each (time, who, characters, req_limit, char_limit) charge gave: "ok" or (message, Retry-After)."""
    out = []
    for when, who, characters, req_limit, char_limit in steps:
        now[0] = when
        try:
            rates.charge(who, characters, req_limit, char_limit, "test")
            out.append("ok")
        except Refused as exc:
            out.append((str(exc), exc.retry_after))
    return out


STEPS = [(0, "a", 10, 2, 0), (0, "a", 10, 2, 0), (0, "a", 10, 2, 0), (0, "b", 10, 2, 0), (15, "a", 10, 2, 0),
         (30, "a", 10, 2, 0), (30, "c", 60, 0, 100), (30, "c", 60, 0, 100), (31, "d", 500, 0, 100),
         (95, "a", 10, 2, 0), (95, "a", 10, 2, 0), (95, "a", 10, 2, 0)]


# -- the store: sqlite as memory, shared, kept, bounded ---------------------------------------------

def test_sqlite_buckets_answer_as_memory_buckets_do(tmp_path):
    now = [0.0]
    memory = _outcomes(RateLimits(MemoryStore(), clock=lambda: now[0]), now, STEPS)
    store = SqliteStore(str(tmp_path / "limits.db"))
    try:
        shared = _outcomes(RateLimits(store, clock=lambda: now[0]), now, STEPS)
    finally:
        store.close()
    assert shared == memory
    assert memory[2] == ("Slowdown: 2 per 1 minute (test)", 30) and memory[4][1] == 15     # as in memory today
    assert memory[7][1] == 12 and memory[8][1] == 60 and memory[9:] == ["ok", "ok", ("Slowdown: 2 per 1 minute (test)", 30)]


def test_two_stores_on_one_file_share_one_allowance_and_a_restart_keeps_it(tmp_path):
    path, now = str(tmp_path / "limits.db"), [100.0]
    first, second = SqliteStore(path), SqliteStore(path)        # two servers' stores
    one, two = RateLimits(first, clock=lambda: now[0]), RateLimits(second, clock=lambda: now[0])
    one.charge(("address", "10.0.0.1"), 5, 3, 0, "test")
    two.charge(("address", "10.0.0.1"), 5, 3, 0, "test")
    one.charge(("address", "10.0.0.1"), 5, 3, 0, "test")
    with pytest.raises(Refused, match="Slowdown: 3 per 1 minute") as refused:
        two.charge(("address", "10.0.0.1"), 5, 3, 0, "test")
    assert refused.value.retry_after == 20
    first.close()
    second.close()
    restarted = SqliteStore(path)
    try:
        now[0] = 110.0
        with pytest.raises(Refused) as refused:
            RateLimits(restarted, clock=lambda: now[0]).charge(("address", "10.0.0.1"), 5, 3, 0, "test")
        assert refused.value.retry_after == 10
    finally:
        restarted.close()


def test_the_file_keeps_only_the_last_minute_s_clients_at_most_max_tracked(tmp_path, monkeypatch):
    monkeypatch.setattr(limits_module, "MAX_TRACKED", 5)
    now = [0.0]
    store = SqliteStore(str(tmp_path / "limits.db"))
    rates = RateLimits(store, clock=lambda: now[0])
    try:
        for i in range(3):
            rates.charge(f"old-{i}", 1, 10, 0, "test")
        assert store.rows() == 3
        now[0] = 61.0                                       # their buckets are full again
        rates.charge("new", 1, 10, 0, "test")
        assert store.rows() == 1
        for i in range(4):
            rates.charge(f"more-{i}", 1, 10, 0, "test")
        assert store.rows() == 5
        now[0] = 62.5                                       # past the count's second: 5 >= MAX_TRACKED
        rates.charge("one-too-many", 1, 10, 0, "test")
        assert store.rows() == 1
        for i in range(50):                                 # within a second: a second's new clients more
            rates.charge(f"burst-{i}", 1, 10, 0, "test")
        now[0] = 64.0
        rates.charge("after", 1, 10, 0, "test")
        assert store.rows() == 1
        rates.charge("after", 1, 10, 0, "test")
        now[0] = 90.0
        with pytest.raises(Refused):                        # refused: nothing kept for a request too long
            rates.charge("too-long", 500, 0, 100, "test")
        assert store.rows() == 1
    finally:
        store.close()


CHARGER = textwrap.dedent("""
    import sys
    from transformer.serve.limits import RateLimits, Refused, SqliteStore
    rates = RateLimits(SqliteStore(sys.argv[1]), clock=lambda: 1000.0)   # no time passes: nothing drains
    print("ready", flush=True)
    sys.stdin.readline()                                # go: both at once
    passed = 0
    for _ in range(150):
        try:
            rates.charge(("address", "10.0.0.9"), 1, 100, 0, "test")
            passed += 1
        except Refused:
            pass
    print(passed)
""")


def test_two_processes_charging_one_client_at_once_never_pass_its_limit_together(tmp_path):
    path = str(tmp_path / "limits.db")
    SqliteStore(path).close()
    processes = [subprocess.Popen([sys.executable, "-c", CHARGER, path], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_here(),
                                  cwd=tempfile.gettempdir())
                 for _ in range(2)]
    for process in processes:
        assert process.stdout.readline() == "ready\n", process.stderr.read()
    for process in processes:
        process.stdin.write("go\n")
        process.stdin.flush()
    results = [process.communicate(timeout=120) for process in processes]
    assert all(process.returncode == 0 for process in processes), [err for _, err in results]
    passed = [int(out) for out, _ in results]
    assert sum(passed) == 100, passed                       # 300 tries, 100 a minute, no time passing


# -- the flags at startup --------------------------------------------------------------------------

@pytest.mark.parametrize("uri, says", [
    ("redis://:secret@localhost:6379", "--req-limit-storage: redis:// is not supported here: memory:// or sqlite:///PATH"),
    ("memcached://localhost:11211", "memcached:// is not supported here"),
    ("limits.db", "--req-limit-storage 'limits.db' is not a storage URI"),
    ("sqlite://", "--req-limit-storage sqlite://: give the file as sqlite:///PATH"),
    ("sqlite:////nonexistent-dir/limits.db", "cannot be opened and written"),
])
def test_a_storage_other_than_memory_or_sqlite_is_refused_naming_the_flag(uri, says):
    with pytest.raises(ValueError) as refused:
        open_store(uri)
    assert says in str(refused.value) and "secret" not in str(refused.value)


def test_memory_and_a_relative_sqlite_path_open_as_sqlalchemy_reads_them(tmp_path, monkeypatch):
    assert isinstance(open_store("memory://"), MemoryStore)
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite:///sub.db")
    try:
        assert store.path == str(tmp_path / "sub.db") and os.path.exists(store.path)
    finally:
        store.close()


def _serve(*argv):
    """(exit status, stderr) of a `transformer serve` that must refuse to start."""
    done = subprocess.run([sys.executable, "-m", "transformer", "serve", *argv, "--port", "1"],
                          capture_output=True, text=True, timeout=120, env=_here(), cwd=tempfile.gettempdir())
    return done.returncode, done.stderr


@pytest.mark.parametrize("argv, says", [
    (["--req-limit-storage", "redis://localhost:6379"], "--req-limit-storage: redis:// is not supported here"),
    (["--req-limit-storage", "sqlite:////nonexistent-dir/limits.db"], "cannot be opened and written"),
    (["--require-api-key-origin", "https://mine.example"], "--require-api-key-origin: no key is asked for"),
])
def test_the_server_refuses_to_start_with_a_flag_it_cannot_honour(tmp_path, argv, says):
    status, stderr = _serve("--model", str(tmp_path / "no-model"), *argv)
    assert status == 2 and says in stderr, stderr


# -- servers: two on one file, and a restart; keys by origin ------------------------------------------



def test_three_servers_on_one_file_share_an_address_s_req_limit_and_it_outlives_the_one_that_counted(
        model_dir, tmp_path):
    """One request a minute (a minute to drain: the machine may be slow) for 127.0.0.1, counted by
    the first server, holds at the second, and at the third once the first has stopped."""
    uri = f"sqlite:///{tmp_path}/limits.db"              # an absolute path: four slashes
    argv = ("--model", model_dir, "--req-limit", "1", "--req-limit-storage", uri)
    servers = [Running(*argv) for _ in range(3)]
    try:
        assert f"counted in {tmp_path}/limits.db" in "".join(servers[0].banner)
        assert send(servers[0].url, "/translate", json={"q": "a", **ENG_SPA})[0] == 200
        status, text, headers = send(servers[1].url, "/translate", json={"q": "a", **ENG_SPA})
        assert status == 429 and "Slowdown: 1 per 1 minute" in json.loads(text)["error"], text
        assert 1 <= int(headers["Retry-After"]) <= 60
        assert servers[0].stop()[0] == 0
        assert send(servers[2].url, "/translate", json={"q": "a", **ENG_SPA})[0] == 429
    finally:
        for server in servers:
            if server.process.poll() is None:
                server.stop()


@pytest.fixture(scope="module")
def origin_keyed(model_dir):
    """Keys from a file, needed for translate and metrics, except from Origin https://mine.example."""
    keys = os.path.join(os.path.dirname(model_dir), "origin-keys.txt")
    with open(keys, "w") as f:
        f.write("the-key\n")
    running = Running("--model", model_dir, "--api-keys", keys, "--require-key-for", "translate,metrics",
                          "--require-api-key-origin", "https://Mine.example/")
    yield running
    running.stop()


@pytest.mark.parametrize("headers, body, want", [
    ({"Origin": "https://mine.example"}, {}, 200),
    ({"Origin": "https://other.example"}, {}, 403),
    ({"Origin": "https://mine.example.evil.example"}, {}, 403),     # LibreTranslate's re.match lets this in
    ({}, {}, 403),
    ({}, {"api_key": "the-key"}, 200),
    ({"Origin": "https://other.example"}, {"api_key": "the-key"}, 200),
    ({"Origin": "https://mine.example"}, {"api_key": "wrong"}, 403),
])
def test_a_keyless_request_is_served_only_from_the_key_origin(origin_keyed, headers, body, want):
    status, text, _ = send(origin_keyed.url, "/translate", json={"q": "the cat", **ENG_SPA, **body}, headers=headers)
    assert status == want, text
    if want == 403:
        assert json.loads(text)["error"] in ("an API key is needed (api_key)", "Invalid API key")


def test_the_key_origin_reaches_metrics_too(origin_keyed):
    async def go():
        async with aiohttp.ClientSession() as session:
            out = []
            for headers in ({"Origin": "https://mine.example"}, {}):
                async with session.get(origin_keyed.url + "/metrics", headers=headers) as response:
                    out.append(response.status)
            return out
    assert asyncio.run(go()) == [200, 403]


def test_frontend_settings_tell_the_key_origin_s_page_that_no_key_is_required(origin_keyed):
    async def go():
        async with aiohttp.ClientSession() as session:
            out = []
            for headers in ({"Origin": "https://mine.example"}, {}):
                async with session.get(origin_keyed.url + "/frontend/settings", headers=headers) as response:
                    out.append((await response.json())["keyRequired"])
            return out
    assert asyncio.run(go()) == [False, True]


def test_the_key_origin_needs_a_route_that_needs_a_key_and_an_origin(tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("k\n")
    status, stderr = _serve("--model", str(tmp_path / "no-model"), "--api-keys", str(keys),
                            "--require-key-for", "none", "--require-api-key-origin", "https://mine.example")
    assert status == 2 and "--require-api-key-origin: --require-key-for none" in stderr, stderr
    from transformer.serve.access import Access
    with pytest.raises(ValueError, match="--require-api-key-origin 'https://mine.example/page'"):
        Access(key_origin="https://mine.example/page")
