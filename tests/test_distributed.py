"""Data parallel over MPI ranks (issue 13), on localhost with `mpiexec -n 2`: N ranks on the parts of
a batch equal one process on the whole batch; the replicas stay bitwise identical; runs resume across
rank counts; a dead rank or a signal ends every rank within a bounded time, the checkpoint intact.

Needs the [mpi] extra (mpi4py and the MPICH wheel, which CI installs); skipped without it."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

import transformer as T
from conftest import needs_threads
from transformer.checkpoint import load_checkpoint
from transformer.cores import usable_cores

HERE = os.path.dirname(os.path.abspath(__file__))
OUTSIDE = tempfile.gettempdir()      # the checkout's transformer/ folder has no compiled module
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
try:
    import mpi4py  # noqa: F401
except ImportError:
    mpi4py = None
pytestmark = pytest.mark.skipif(mpi4py is None or MPIEXEC is None,
                                reason='needs the [mpi] extra: pip install ".[mpi]"')
SMALL = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-encoder-layers", "1",
         "--n-decoder-layers", "1", "--quiet", "--threads", "1"]


def mpirun(n, *argv, timeout=240, env=None, **kw):
    return subprocess.run([MPIEXEC, "-n", str(n), *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=OUTSIDE, env=env or ENV, **kw)


def train(n, *argv, **kw):
    cmd = [sys.executable, "-m", "transformer", "train", *argv]
    if n == 1:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=OUTSIDE, env=ENV)
    return mpirun(n, *cmd, **kw)


def losses(out):
    with open(os.path.join(out, "log.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


# -- the DataParallel API ---------------------------------------------------------------------------

def test_import_needs_no_mpi():
    code = "import sys, transformer; print('mpi4py' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=OUTSIDE, env=ENV)
    assert done.stdout.strip() == "False", done.stderr


def _key_bias_mask(cfg, params):
    """True at the key part of every in_proj_bias: its gradient is zero in exact arithmetic (the
    softmax does not see a constant added to every score of a row), so in floating point it is rounding
    noise, which Adam scales up to full steps of either sign; those entries are left out."""
    keys = np.zeros(params.size, dtype=bool)
    d = cfg.d_model
    for name, start in params.offsets.items():
        if name.endswith("in_proj_bias"):
            keys[start + d:start + 2 * d] = True
    return keys


@pytest.mark.parametrize("shards", [None, "2"])
def test_two_ranks_on_half_batches_equal_one_process(tmp_path, shards):
    """(a) 20 Adam steps (dropout 0, clipping on the global norm) on two ranks, each on half of every
    batch, against one process on the whole batches; (b) both ranks end bitwise identical.
    shards "2": every pass, on the ranks and in the one process, cut into two sentence shards
    (transformer/shards.py), data parallel on top of them."""
    two, one = tmp_path / "two", tmp_path / "one"
    two.mkdir(), one.mkdir()
    worker = os.path.join(HERE, "dp_worker.py")
    env = ENV if shards is None else {**ENV, "TRANSFORMER_SHARDS": shards}
    done = mpirun(2, sys.executable, worker, str(two), env=env)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([sys.executable, worker, str(one), "plain"], capture_output=True, text=True,
                          cwd=OUTSIDE, env=env)
    assert done.returncode == 0, done.stderr
    w0, w1 = np.load(two / "weights-0.npy"), np.load(two / "weights-1.npy")
    ref = np.load(one / "weights-0.npy")
    assert np.array_equal(w0, w1)                                         # (b)
    np.testing.assert_allclose(np.load(two / "losses-0.npy"), np.load(one / "losses-0.npy"), rtol=1e-5)
    cfg = T.ModelConfig(src_vocab_size=23, tgt_vocab_size=23, d_model=32, n_heads=4, d_ff=64,
                        n_encoder_layers=2, n_decoder_layers=2, dropout=0.0, max_len=16)
    model = T.Seq2SeqTransformer(cfg, seed=11)
    keys = _key_bias_mask(cfg, model.params)
    moved = 0
    for name, view in model.params.data.items():
        lo = model.params.offsets[name]
        part = slice(lo, lo + view.size)
        a, b, k = w0[part], ref[part], ~keys[part]
        err = np.linalg.norm(a[k] - b[k]) / np.linalg.norm(b[k])
        assert err < 1e-5, (name, err)
        moved += np.linalg.norm(b[k] - view.reshape(-1)[k]) > 1e-3 * np.linalg.norm(b[k])
    assert moved > 20                        # the steps changed the weights: the comparison means something


def test_a_silent_rank_times_out(tmp_path):
    """A rank that stops answering makes the others raise DistributedError naming what they waited for,
    after the DataParallel's timeout, instead of waiting forever."""
    done = mpirun(2, sys.executable, os.path.join(HERE, "dp_worker.py"), str(tmp_path), "stall", timeout=120)
    written = tmp_path / "stall-0.txt"
    assert written.exists(), done.stdout + done.stderr
    assert "rank 0: no answer from the other ranks for 2 s while waiting for the target count" in \
        written.read_text(), done.stdout + done.stderr


# -- transformer train under mpirun -----------------------------------------------------------------

def test_resume_across_rank_counts(tmp_path):
    """(c) 2 ranks then 1, and 1 rank then 2, repeat the losses of one uninterrupted process (dropout
    0: the built-in task's default), data position included."""
    ref, a, b = str(tmp_path / "ref"), str(tmp_path / "a"), str(tmp_path / "b")
    flags = SMALL + ["--max-steps"]
    assert train(1, *flags, "16", "--out", ref).returncode == 0
    done = train(2, *flags, "8", "--out", a)
    assert done.returncode == 0, done.stderr
    assert "data parallel over 2 ranks" in done.stderr
    done = train(1, "--resume", a, "--max-steps", "16", "--quiet")
    assert done.returncode == 0, done.stderr
    assert train(1, *flags, "8", "--out", b).returncode == 0
    done = train(2, "--resume", b, "--max-steps", "16", "--quiet", "--threads", "1")
    assert done.returncode == 0, done.stderr
    expected = losses(ref)
    assert sorted(expected) == list(range(1, 17))
    for out in (a, b):
        got = losses(out)
        assert sorted(got) == list(range(1, 17))
        np.testing.assert_allclose([got[s] for s in range(1, 17)], [expected[s] for s in range(1, 17)], rtol=1e-4)
    assert load_checkpoint(a).train_state["step"] == 16


def _rank_pid(rank, marker, timeout=60):
    """The pid of the rank `rank` of the run whose command line contains `marker`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().decode(errors="replace")
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if marker in cmd and "mpiexec" not in cmd and f"PMI_RANK={rank}".encode() in env:
                return int(pid)
        time.sleep(0.2)
    raise AssertionError(f"no rank {rank} running with {marker}")


def _start_long_run(out):
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-m", "transformer", "train", *SMALL, "--minutes", "10",
           "--save-minutes", "0", "--out", out]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=OUTSIDE, env=ENV)
    log = os.path.join(out, "log.jsonl")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(losses(out) if os.path.exists(log) else {}) < 20:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    return proc


def test_a_killed_rank_ends_the_run(tmp_path):
    """(d) SIGKILL to rank 1: the run ends, not zero, with a message, within 60 s."""
    out = str(tmp_path / "run")
    proc = _start_long_run(out)
    os.kill(_rank_pid(1, out), signal.SIGKILL)
    started = time.monotonic()
    try:
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert time.monotonic() - started < 60
    assert proc.returncode != 0
    # MPICH's launcher reports the dead rank and stops the others at once; a launcher that does not
    # leaves them to DataParallel's own deadline (test_a_silent_rank_times_out)
    told = stdout + stderr
    assert "BAD TERMINATION" in told or "no answer from the other ranks" in told, told


def test_sigterm_to_one_rank_stops_all_with_a_checkpoint(tmp_path):
    """(e) SIGTERM to rank 1: every rank stops at the same step, rank 0 writes the checkpoint, and it
    loads and resumes."""
    out = str(tmp_path / "run")
    proc = _start_long_run(out)
    os.kill(_rank_pid(1, out), signal.SIGTERM)
    try:
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "SIGTERM received by another rank: saving a checkpoint" in stderr
    ckpt = load_checkpoint(out)
    assert ckpt.train_state["step"] == max(losses(out))
    done = train(1, "--resume", out, "--max-steps", str(ckpt.train_state["step"] + 2), "--quiet")
    assert done.returncode == 0, done.stderr


# Rank 1 takes SIGTERM right after the ranks' 5th vote on the stop flags returned: the window of
# a race CI once hit by chance (12931d4), made certain.
_LATE_SIGNAL = """
import os, signal, sys
from transformer import distributed
original, votes = distributed.DataParallel.max_flags, []
def max_flags(self, flags, *args, **kwargs):
    agreed = original(self, flags, *args, **kwargs)
    votes.append(agreed)
    if self.rank == 1 and len(votes) == 5:
        os.kill(os.getpid(), signal.SIGTERM)
    return agreed
distributed.DataParallel.max_flags = max_flags
from transformer.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_signal_after_the_stop_vote_counts_in_the_next_one(tmp_path):
    """The vote before step 5 saw no signal, so every rank takes step 5, and the vote after it stops
    them all, with rank 0's checkpoint at step 5. (A rank that stopped on its own flag, read after the
    vote, left the others waiting in step 5's all-reduce while it sat in MPI_Finalize.)"""
    out = str(tmp_path / "run")
    done = mpirun(2, sys.executable, "-c", _LATE_SIGNAL, "train", *SMALL, "--minutes", "10",
                  "--save-minutes", "0", "--out", out, timeout=120)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr
    assert "SIGTERM received by another rank: saving a checkpoint" in done.stderr
    assert load_checkpoint(out).train_state["step"] == max(losses(out)) == 5


def test_ranks_that_disagree_refuse_to_start(tmp_path):
    out = str(tmp_path / "run")
    cmd = [sys.executable, "-m", "transformer", "train", *SMALL, "--max-steps", "2", "--out", out]
    done = subprocess.run([MPIEXEC, "-n", "1", *cmd, "--seed", "0", ":", "-n", "1", *cmd, "--seed", "5"],
                          capture_output=True, text=True, timeout=120, cwd=OUTSIDE, env=ENV)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("transformer train: error:")]
    assert len(lines) == 1, done.stderr
    assert "different settings or data: --seed: rank 1 has 5, rank 0 has 0" in lines[0]


def test_threads_that_would_oversubscribe_are_refused(tmp_path):
    cores = os.cpu_count()
    done = train(2, *SMALL[:-2], "--threads", str(cores), "--max-steps", "1", "--out", str(tmp_path / "r"))
    assert done.returncode != 0
    assert f"--threads {cores}: 2 ranks share this machine's {cores} cores" in done.stderr or \
        "this rank is bound to" in done.stderr, done.stderr


def test_data_parallel_on_a_corpus(tmp_path):
    """--data under mpirun: rank 0 learns the vocabularies and hands them over; one log, one model."""
    data = tmp_path / "pairs.tsv"
    rng = np.random.default_rng(0)
    words = ["red", "green", "blue", "cat", "dog", "house", "tree", "sun", "moon", "star"]
    with open(data, "w") as f:
        for _ in range(200):
            s = " ".join(rng.choice(words, size=rng.integers(2, 6)))
            f.write(f"{s}\t{s.upper()}\n")
    out = str(tmp_path / "run")
    done = train(2, "--data", str(data), "--vocab-size", "60", "--batch-tokens", "256", "--max-steps", "6",
                 *SMALL, "--out", out)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count('"step": 6') == 1, done.stdout       # rank 0 alone reports
    assert sorted(losses(out)) == list(range(1, 7))
    assert T.Seq2SeqTransformer.load(out).cfg.d_model == 32


def test_two_ranks_prepare_a_corpus_once_and_train_as_one_process(tmp_path):
    """Rank 0 prepares (the other waits, then maps the same files): one prepared directory in the cache,
    and two ranks repeat the losses of one process on the same prepared corpus."""
    data = tmp_path / "pairs.tsv"
    rng = np.random.default_rng(1)
    words = ["red", "green", "blue", "cat", "dog", "house", "tree", "sun", "moon", "star"]
    data.write_text("".join(f"{s}\t{s.upper()}\n" for s in (" ".join(rng.choice(words, size=rng.integers(2, 6)))
                                                             for _ in range(200))))
    cache = tmp_path / "cache"
    env = {**ENV, "TRANSFORMER_CACHE": str(cache)}
    flags = ["--data", str(data), "--vocab-size", "60", "--batch-tokens", "256", "--max-steps", "6", *SMALL]
    done = mpirun(2, sys.executable, "-m", "transformer", "train", *flags, "--out", str(tmp_path / "two"), env=env)
    assert done.returncode == 0, done.stderr
    assert "rank 0 prepares the corpus (or finds it prepared); the other rank waits for it" in done.stderr
    assert len(os.listdir(cache / "prepared")) == 1
    one = subprocess.run([sys.executable, "-m", "transformer", "train", *flags, "--out", str(tmp_path / "one")],
                         capture_output=True, text=True, timeout=240, cwd=OUTSIDE, env=env)
    assert one.returncode == 0, one.stderr
    assert "prepared before" in one.stderr
    expected, got = losses(str(tmp_path / "one")), losses(str(tmp_path / "two"))
    np.testing.assert_allclose([got[s] for s in range(1, 7)], [expected[s] for s in range(1, 7)], rtol=1e-4)


def test_info_under_mpirun_shows_ranks_threads_and_cores():
    done = mpirun(2, sys.executable, "-m", "transformer", "info")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert [r["rank"] for r in info["mpi"]] == [0, 1]
    assert all(r["ranks"] == 2 and r["cores_this_rank_may_use"] for r in info["mpi"])


def test_the_ranks_on_this_machine_are_counted_as_sharing_its_memory():
    """training/world.ranks_sharing_memory, for the training step's memory check: two ranks started
    here, each asked twice (the second answer kept, no collective)."""
    code = ("import argparse; from mpi4py import MPI; from transformer.training.world import ranks_sharing_memory\n"
            "args = argparse.Namespace(world=(MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()))\n"
            "print(ranks_sharing_memory(args), ranks_sharing_memory(args))")
    done = mpirun(2, sys.executable, "-c", code)
    assert done.returncode == 0, done.stderr
    # (the two ranks' lines may interleave)
    assert re.findall(r"\(\d+, \d+\)", done.stdout) == ["(2, 2)"] * 4, done.stdout


# The grid's ranks and threads both come from the --threads values, so its one two-rank point (the
# DDP comparison) comes with --threads 1,2, which a build without OpenMP refuses.
@needs_threads
def test_bench_distributed_grid_against_ddp(tmp_path):
    """`bench --what distributed`: the ranks x threads grid that fits the cores, ours and PyTorch DDP
    (gloo) on the same global batch, efficiencies against 1x1, the all-reduce wait, a projection."""
    pytest.importorskip("torch")
    out = tmp_path / "dist.jsonl"
    done = subprocess.run([sys.executable, "-m", "transformer", "bench", "--what", "distributed", "--threads", "1,2",
                           "--config", "d_model=32,n_heads=2,d_ff=64,layers=1,vocab=50,batch=4,length=8",
                           "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=OUTSIDE, env=ENV)
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    points = [(r["ranks"], r["threads_per_rank"]) for r in records if r["bench"] == "distributed"]
    cores = usable_cores()
    assert points == [(r, t) for r in (1, 2) for t in (1, 2) if r * t <= cores]
    two = next(r for r in records if r.get("ranks") == 2)
    assert two["ours_tokens_per_s"] > 0 and two["torch_tokens_per_s"] > 0
    assert 0 < two["ours_comm_wait_share"] < 1 and two["ours_buckets_per_step"] >= 1
    assert two["ours_vs_ddp"] == round(two["ours_tokens_per_s"] / two["torch_tokens_per_s"], 3)
    projection = records[-1]
    assert projection["bench"] == "distributed_projection" and projection["rows"]
    assert "ours/DDP" in done.stderr


def test_bench_distributed_refuses_a_plot():
    done = subprocess.run([sys.executable, "-m", "transformer", "bench", "--what", "distributed", "--plot", "x.png"],
                          capture_output=True, text=True, timeout=60, cwd=OUTSIDE, env=ENV)
    assert done.returncode == 2
    assert "--plot does not apply to --what distributed" in done.stderr


def test_ranks_refuse_an_out_that_holds_another_run_once_and_a_new_run_is_not_refused_by_its_own_files(tmp_path):
    """Rank 0 alone checks --out, before anything is written: the others may start after it has
    written its first files, and must not take them for another run's."""
    out = str(tmp_path / "run")
    done = train(2, *SMALL, "--max-steps", "3", "--save-every", "1", "--out", out)
    assert done.returncode == 0, done.stderr
    done = train(2, *SMALL, "--max-steps", "1", "--out", out)
    assert done.returncode != 0
    assert "already holds a model" in done.stderr and "--overwrite" in done.stderr
    assert load_checkpoint(out).train_state["step"] == 3                 # untouched
