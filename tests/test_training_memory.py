"""Training refuses, at its start, a --batch-tokens whose step cannot fit the memory the process may
fill (transformer/training/memory.py): the floor against the batches the trainer collates and the
memory a real step holds; the refusal from the command line, from --preset auto's sizing, and in a
real memory cgroup where the kernel would kill the run."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

import transformer as T
from transformer import cgroups, cli
from transformer.corpus import PreparedCorpus, TrainingSet, make_inputs, prepare
from transformer.training import memory, sizing

from test_cores import v1_group, writable_v1

OUTSIDE = tempfile.gettempdir()
MIB = 1 << 20
WORDS = ["red", "blue", "cat", "dog", "runs", "sleeps", "the", "a", "big", "small", "house", "tree"]
SMALL = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-encoder-layers", "1", "--n-decoder-layers", "1"]


def write_tsv(path, n, longest=9, seed=0):
    """Pairs whose target is the source twice over, reversed: the two sides' widths differ."""
    rng = np.random.default_rng(seed)
    with open(path, "w", encoding="utf-8") as f:
        f.write("eng\tfake\n")
        for _ in range(n):
            s = " ".join(rng.choice(WORDS, size=rng.integers(1, longest)))
            f.write(f"{s}\t{(s + ' ' + s)[::-1]}\n")
    return str(path)


def training_set(tmp_path, n=300, batch_tokens=200, bpe_dropout=0.0):
    data = write_tsv(tmp_path / "pairs.tsv", n)
    corpus = PreparedCorpus(prepare(make_inputs([data], "eng", "fake"), str(tmp_path / "prep"),
                                    dev_fraction=0.05, dev_max=10, vocab_size=60))
    return TrainingSet(corpus, 64, batch_tokens, 3, bos_id=1, eos_id=2, pad_id=0, bpe_dropout=bpe_dropout)


def tiny_config(**sizes):
    return T.ModelConfig(**{"src_vocab_size": 60, "tgt_vocab_size": 70, "d_model": 32, "n_heads": 2, "d_ff": 64,
                            "n_encoder_layers": 2, "n_decoder_layers": 1, "max_len": 65, **sizes})


@pytest.mark.parametrize("sizes", [{}, {"tie_embeddings": "target"}, {"tie_embeddings": "all", "tgt_vocab_size": 60},
                                   {"norm": "scale", "fix_norm": True}, {"norm_first": True, "final_norm": False}])
def test_the_parameter_count_is_the_models_own(sizes):
    cfg = tiny_config(**sizes)
    assert memory.parameter_count(cfg) == T.Seq2SeqTransformer(cfg, seed=0).num_parameters()


@pytest.mark.parametrize("world_size", [1, 3])
def test_the_largest_step_is_the_largest_over_the_batches_the_trainer_collates(tmp_path, world_size):
    """The oracle: epoch 0's batches as TrainingSet.collate pads them, a rank's part as the trainer
    takes it (every size-th row), the floor of each from the arrays' own shapes."""
    data = training_set(tmp_path)
    cfg = tiny_config()
    params = memory.parameter_count(cfg)
    floors = []
    for positions in data.batches(0):
        src, tgt_in, _ = data.collate(positions[0::world_size])
        floors.append((memory.step_floor(cfg, params, src.shape[0], src.shape[1], tgt_in.shape[1]),
                       src.shape[0], src.shape[1], tgt_in.shape[1]))
    need, rows, src_width, tgt_width, counted = memory.largest_step(cfg, data, world_size)
    assert need == max(f[0] for f in floors)
    assert (need, rows, src_width, tgt_width) in floors
    assert src_width < tgt_width          # the sides are counted each at its own width
    # what --batch-tokens counts of that batch: its sentences x the longest of either side
    assert counted <= data.batch_tokens and counted >= rows * tgt_width


def test_with_bpe_dropout_the_floor_stays_below_every_drawn_batch(tmp_path):
    """BPE-dropout's segmentations are longer than the plain ones the floor counts."""
    data = training_set(tmp_path, bpe_dropout=0.3)
    cfg = tiny_config()
    params = memory.parameter_count(cfg)
    need = memory.largest_step(cfg, data)[0]
    drawn = max(memory.step_floor(cfg, params, s.shape[0], s.shape[1], t.shape[1])
                for s, t, _ in (data.collate(p, epoch=0) for p in data.batches(0)))
    assert need <= drawn


def test_the_floor_is_below_what_a_real_step_holds():
    """A fresh process: the growth of its peak resident memory (VmHWM, this process's own: ru_maxrss
    keeps the forking parent's peak across exec, pytest's hundreds of MB) over two steps (forward, backward,
    Adam) against the floor for the same model and batch. The floor must stay below, or a run that
    fits would be refused; and above a third of it, as the warning counts on."""
    code = ("import json, numpy as np, transformer as T\n"
            "from transformer.training.memory import parameter_count, step_floor\n"
            "peak = lambda: int(next(line for line in open('/proc/self/status')\n"
            "                        if line.startswith('VmHWM')).split()[1]) * 1024\n"
            "T.set_num_threads(1)\n"
            "cfg = T.ModelConfig(src_vocab_size=2000, tgt_vocab_size=2000, d_model=64, n_heads=2, d_ff=256, "
            "n_encoder_layers=2, n_decoder_layers=2, max_len=50)\n"
            "rng = np.random.default_rng(0)\n"
            "src, tgt_in, tgt_out = (rng.integers(4, 2000, (128, 48)) for _ in range(3))\n"
            "before = peak()\n"
            "m = T.Seq2SeqTransformer(cfg, seed=0); adam = T.Adam(m)\n"
            "for _ in range(2):\n"
            "    m.zero_grad(); m.forward_backward(src, tgt_in, tgt_out); adam.step()\n"
            "grew = peak() - before\n"
            "print(json.dumps([grew, step_floor(cfg, parameter_count(cfg), 128, 48, 48)]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=OUTSIDE)
    assert proc.returncode == 0, proc.stderr
    grew, floor = json.loads(proc.stdout)
    assert memory.WARN_SHARE * grew < floor < grew, (floor / MIB, grew / MIB)


def train_argv(tmp_path, batch_tokens, *more, sizes=SMALL):
    data = tmp_path / "pairs.tsv"
    if not data.exists():
        write_tsv(data, 200)
    return ["train", "--data", str(data), "--src-col", "eng", "--tgt-col", "fake", "--vocab-size", "60", *sizes,
            "--threads", "1", "--batch-tokens", str(batch_tokens), "--max-steps", "2", "--out",
            str(tmp_path / "run"), *more]


@pytest.fixture
def needs(monkeypatch):
    """The (need, rows, widths, counted) of every check the runs make, in order."""
    seen, real = [], memory.largest_step
    monkeypatch.setattr(memory, "largest_step", lambda *a: seen.append(real(*a)) or seen[-1])
    return seen


def error_of(capsys):
    return capsys.readouterr().err.strip().splitlines()[-1]


def test_a_batch_past_the_memory_is_refused_naming_batch_tokens_before_anything_is_written(tmp_path, monkeypatch,
                                                                                            capsys, needs):
    monkeypatch.setattr(cgroups, "usable_memory", lambda: (1 << 40, "machine"))
    assert cli.main(train_argv(tmp_path, 100000, "--out", str(tmp_path / "fits"))) == 0
    need, rows, src_width, tgt_width, _ = needs[-1]
    capsys.readouterr()
    monkeypatch.setattr(cgroups, "usable_memory", lambda: (need // 2, "cgroup"))
    assert cli.main(train_argv(tmp_path, 100000)) == 1
    line = error_of(capsys)
    assert line.startswith(f"transformer train: error: out of memory: --batch-tokens 100000: the first pass's "
                           f"largest batch, {rows:,} sentences padded to {src_width} source and {tgt_width} target "
                           f"positions, needs at least {need / 2**20:,.0f} MiB for a training step of this model, "
                           f"more than the {need // 2 / 2**20:,.0f} MiB its cgroup's memory limit allows; "), line
    assert not (tmp_path / "run").exists()
    # the cap it names: a quarter past it is still refused, a fifth below it trains
    most = int(line.rsplit("past about ", 1)[1].split()[0].replace(",", ""))
    assert cli.main(train_argv(tmp_path, int(most * 1.25))) == 1
    assert "out of memory: --batch-tokens" in error_of(capsys)
    assert cli.main(train_argv(tmp_path, int(most * 0.8))) == 0
    assert needs[-1][0] <= need // 2


def test_a_model_past_the_memory_on_its_own_is_named(tmp_path, monkeypatch, capsys, needs):
    """tiny's weights, gradients and Adam's moments: about 14 MiB at this vocabulary."""
    monkeypatch.setattr(cgroups, "usable_memory", lambda: (8 << 20, "machine"))
    assert cli.main(train_argv(tmp_path, 300, sizes=[])) == 1
    line = error_of(capsys)
    assert "more than this machine's 8 MiB; the model alone needs more: a smaller --preset or size flags" in line


def test_a_batch_past_a_third_of_the_memory_trains_with_a_warning(tmp_path, monkeypatch, capsys, needs):
    monkeypatch.setattr(cgroups, "usable_memory", lambda: (1 << 40, "machine"))
    assert cli.main(train_argv(tmp_path, 100000)) == 0
    assert "warning: a training step" not in capsys.readouterr().err
    monkeypatch.setattr(cgroups, "usable_memory", lambda: (2 * needs[0][0], "machine"))
    assert cli.main(train_argv(tmp_path, 100000, "--overwrite")) == 0
    err = capsys.readouterr().err
    assert "warning: a training step on the first pass's largest batch needs at least" in err, err
    assert "if the run is killed, a smaller --batch-tokens (100000 now) may fit" in err


def test_sizing_stops_before_a_candidate_past_the_memory_and_refuses_when_the_first_is(tmp_path, monkeypatch,
                                                                                        capsys, needs):
    data = write_tsv(tmp_path / "pairs.tsv", 200)
    argv = ["train", "--data", data, "--src-col", "eng", "--tgt-col", "fake", "--vocab-size", "60", "--threads",
            "1", "--batch-tokens", "300", "--minutes", "0.1", "--max-steps", "1", "--out", str(tmp_path / "run")]
    monkeypatch.setattr(sizing, "MIN_STEPS", 1)
    measured = []
    real_timer = sizing.step_timer

    def timer(*args):
        step_seconds_of = real_timer(*args)
        return lambda name, sizes: measured.append(name) or step_seconds_of(name, sizes)

    monkeypatch.setattr(sizing, "step_timer", timer)
    names = list(sizing.CANDIDATES)
    monkeypatch.setattr(cgroups, "usable_memory", lambda: (1 << 40, "machine"))
    assert cli.main(argv) == 0
    assert measured == names
    tiny, medium = needs[0][0], needs[1][0]       # each candidate checked before it is measured
    assert tiny < medium
    measured.clear()
    monkeypatch.setattr(cgroups, "usable_memory", lambda: ((tiny + medium) // 2, "machine"))
    assert cli.main([*argv, "--overwrite"]) == 0
    assert measured == names[:1]
    assert f"sizing: {names[1]} and larger not tried, their step is past the memory" in capsys.readouterr().err
    measured.clear()
    monkeypatch.setattr(cgroups, "usable_memory", lambda: (tiny // 2, "machine"))
    assert cli.main([*argv, "--overwrite"]) == 1
    assert "error: out of memory: --batch-tokens 300: " in error_of(capsys)
    assert measured == []


@pytest.mark.skipif(writable_v1("memory") is None, reason="no writable cgroup v1 memory hierarchy (needs root)")
def test_a_real_cgroup_memory_limit_refuses_the_run_the_kernel_would_kill(tmp_path):
    """The kernel's own files: in a 512 MiB memory cgroup, a run whose first pass holds a batch of the
    whole corpus (a floor of about 2 GiB) is refused at its start, naming the limit."""
    data = write_tsv(tmp_path / "pairs.tsv", 1000, longest=40)
    with v1_group("memory", {"memory.limit_in_bytes": str(512 * MIB)}) as enter:
        code = (enter + "; import sys; from transformer import cli; sys.exit(cli.main(sys.argv[1:]))")
        proc = subprocess.run([sys.executable, "-c", code, "train", "--data", data, "--src-col", "eng", "--tgt-col",
                               "fake", "--vocab-size", "60", "--preset", "tiny", "--threads", "1", "--batch-tokens",
                               "1000000", "--max-steps", "1", "--out", str(tmp_path / "run")],
                              capture_output=True, text=True, timeout=300, cwd=OUTSIDE,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-2000:])
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("transformer train: error: out of memory: --batch-tokens 1000000: "), line
    assert line.endswith("cannot fit") and "than the 512 MiB its cgroup's memory limit allows" in line, line


def test_ranks_on_one_machine_share_its_memory(tmp_path, monkeypatch):
    """Under mpirun each rank runs every size-th sentence of a batch, and the ranks on one machine
    each hold a model and their part: a part that fits the machine alone is refused when two
    ranks share it."""
    data = training_set(tmp_path)
    cfg = tiny_config()
    part = memory.largest_step(cfg, data, 2)[0]
    assert part < memory.largest_step(cfg, data, 1)[0]
    monkeypatch.setattr(cgroups, "usable_memory", lambda: (int(1.5 * part), "machine"))
    memory.check_step_memory(cfg, data, 200, world_size=2, sharing=1)      # ranks on two machines
    with pytest.raises(MemoryError, match=r"^--batch-tokens 200: the first pass's largest batch \(this rank's part: "
                                          r"one sentence in 2\), .* more than this rank's share of this machine's "
                                          r"\d+ MiB, which 2 ranks share; "):
        memory.check_step_memory(cfg, data, 200, world_size=2, sharing=2)
