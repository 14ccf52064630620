"""Prepared corpora (issue 37): the arrays, batches and losses of the text path (data.py: read_pairs,
split_pairs, BPE on the training split, length_batches), from streams, with the faults refused."""
import gzip
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from transformer import train
from transformer.corpus import (PreparedCorpus, TrainingSet, cache, find_or_prepare, make_inputs, prepare,
                                preparation, store)
from transformer.data import collate, length_batches, make_example, read_pairs, split_pairs
from transformer.serialization import _temporary_prefix
from transformer.tokenizer import SubwordTokenizer

OUTSIDE = tempfile.gettempdir()     # subprocesses run outside the checkout (no compiled module there)
SMALL = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-encoder-layers", "1",
         "--n-decoder-layers", "1", "--quiet", "--threads", "1"]
WORDS = ["red", "blue", "cat", "dog", "runs", "sleeps", "the", "a", "big", "small", "house", "tree"]


def sentences(n, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(1, 9))) for _ in range(n)]


def write_tsv(path, n=200, seed=0, opener=open):
    src = sentences(n, seed)
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("eng\tfake\n")
        for s in src:
            f.write(f"{s}\t{s[::-1].upper()}\n")
    return str(path)


def run_cli(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "transformer", *argv], capture_output=True, text=True,
                          timeout=600, cwd=OUTSIDE, env=env)


def text_path(path, src_col, tgt_col, dev_fraction, dev_max, vocab_size=None):
    """What train --data built before prepared corpora: the oracle."""
    pairs, _ = read_pairs(path, src_col, tgt_col)
    train_pairs, dev = split_pairs(pairs, dev_fraction=dev_fraction, max_dev=dev_max)
    vocab_size = vocab_size or train.choose_vocab_size(train_pairs)
    src_tok = SubwordTokenizer.train([s for s, _ in train_pairs], vocab_size=vocab_size)
    tgt_tok = SubwordTokenizer.train([t for _, t in train_pairs], vocab_size=vocab_size)
    return (train_pairs, dev, src_tok, tgt_tok, src_tok.encode_batch([s for s, _ in train_pairs]),
            tgt_tok.encode_batch([t for _, t in train_pairs]))


# -- the text path's content, from two streamed passes --------------------------------------------

def test_prepared_arrays_hold_the_text_paths_split_vocabularies_and_ids(tmp_path):
    data = write_tsv(tmp_path / "pairs.tsv", n=300)
    # dev_max below the candidates: the pairs past it are trained on after the others, as split_pairs does
    out = prepare(make_inputs([data], "eng", "fake"), str(tmp_path / "prep"), dev_fraction=0.2, dev_max=20)
    corpus = PreparedCorpus(out)
    train_pairs, dev, src_tok, tgt_tok, src_ids, tgt_ids = text_path(data, "eng", "fake", 0.2, 20)
    assert corpus.dev == dev and len(dev) == 20
    assert len(corpus) == len(train_pairs)
    assert corpus.src_tokenizer.to_json() == src_tok.to_json()
    assert corpus.tgt_tokenizer.to_json() == tgt_tok.to_json()
    for i in range(len(train_pairs)):
        assert corpus.sentence("src", i).tolist() == src_ids[i]
        assert corpus.sentence("tgt", i).tolist() == tgt_ids[i]
    assert corpus.ids["src"].dtype == np.uint16       # the narrowest dtype for the vocabulary
    manifest = corpus.manifest
    assert manifest["counts"] == {"pairs": 300, "train": 280, "dev": 20}
    expected = hashlib.sha256()
    for s, t in read_pairs(data, "eng", "fake")[0]:
        expected.update(f"{s}\t{t}\n".encode())
    assert manifest["pairs_fingerprint"] == expected.hexdigest()   # what checkpoints have always recorded


def test_ids_take_the_narrowest_unsigned_dtype():
    assert store.ids_dtype(4000) == np.uint16
    assert store.ids_dtype(65536) == np.uint16
    assert store.ids_dtype(65537) == np.uint32


@pytest.mark.parametrize("seed, batch_tokens, max_tokens", [(0, 120, 12), (7, 64, 6), (3, 1000, 128)])
def test_batches_and_padded_arrays_equal_the_text_paths(tmp_path, seed, batch_tokens, max_tokens):
    data = write_tsv(tmp_path / "pairs.tsv", n=400, seed=seed)
    corpus = PreparedCorpus(prepare(make_inputs([data], "eng", "fake"), str(tmp_path / "prep"),
                                    dev_fraction=0.1, dev_max=15, vocab_size=60))
    _, _, _, _, src_ids, tgt_ids = text_path(data, "eng", "fake", 0.1, 15, vocab_size=60)
    examples = [make_example(s, t, 1, 2) for s, t in zip(src_ids, tgt_ids)
                if s and t and len(s) <= max_tokens and len(t) + 1 <= max_tokens]
    data_set = TrainingSet(corpus, max_tokens, batch_tokens, seed, bos_id=1, eos_id=2, pad_id=0)
    assert len(data_set) == len(examples) and data_set.dropped == len(src_ids) - len(examples)
    for epoch in range(3):
        old, new = length_batches(examples, batch_tokens, seed=seed, epoch=epoch), data_set.batches(epoch)
        assert len(old) == len(new)
        for i, indices in enumerate(old):
            assert new[i].tolist() == indices, (epoch, i)
            for want, got in zip(collate(examples, indices, 0), data_set.collate(new[i])):
                np.testing.assert_array_equal(got, want)


def test_a_file_and_its_prepared_directory_train_alike_and_resume_exactly(tmp_path):
    """train --data FILE (prepared into the cache) and --data DIR (transformer prepare) give the same
    losses, and a run on DIR resumed half-way repeats them."""
    data = write_tsv(tmp_path / "pairs.tsv", n=200)
    common = [*SMALL, "--vocab-size", "60", "--batch-tokens", "200", "--schedule", "noam", "--warmup", "10"]
    prepared = str(tmp_path / "prepared")
    done = run_cli("prepare", "--data", data, "--src-col", "eng", "--tgt-col", "fake", "--vocab-size", "60",
                   "--out", prepared, "--quiet")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["train"] + record["dev"] == 200 and record["ids_dtype"] == "uint16"
    a, b, c = (str(tmp_path / name) for name in "abc")
    for argv, out in ((["--data", data, "--src-col", "eng", "--tgt-col", "fake"], a), (["--data", prepared], b)):
        done = run_cli("train", *argv, *common, "--max-steps", "12", "--out", out)
        assert done.returncode == 0, done.stderr
    done = run_cli("train", "--data", prepared, *common, "--max-steps", "6", "--out", c)
    assert done.returncode == 0, done.stderr
    done = run_cli("train", "--resume", c, "--max-steps", "12", "--quiet")
    assert done.returncode == 0, done.stderr

    def losses(out):
        with open(os.path.join(out, "log.jsonl")) as f:
            return [json.loads(line)["loss"] for line in f if '"loss"' in line]
    assert len(losses(a)) == 12
    assert losses(b) == losses(a)
    assert losses(c) == losses(a)
    # the run on FILE resumes on its prepared directory in the file's place
    done = run_cli("train", "--resume", a, "--data", prepared, "--max-steps", "14", "--quiet")
    assert done.returncode == 0, done.stderr
    assert len(losses(a)) == 14


# -- inputs: several files, OPUS's aligned files, gzip ---------------------------------------------

def write_aligned(tmp_path, pairs, name="corpus"):
    src, tgt = tmp_path / f"{name}.en", tmp_path / f"{name}.xx"
    src.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    tgt.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return str(src), str(tgt)


def test_aligned_files_and_gzip_give_the_pairs_of_the_tab_separated_file(tmp_path):
    data = write_tsv(tmp_path / "pairs.tsv", n=150)
    zipped = write_tsv(tmp_path / "pairs.tsv.gz", n=150, opener=gzip.open)
    pairs, _ = read_pairs(data, "eng", "fake")
    src, tgt = write_aligned(tmp_path, pairs)
    made = {}
    for name, inputs in (("tsv", make_inputs([data], "eng", "fake")), ("gz", make_inputs([zipped], "eng", "fake")),
                         ("comma", make_inputs([f"{src},{tgt}"])), ("flags", make_inputs([], src_file=src, tgt_file=tgt))):
        made[name] = PreparedCorpus(prepare(inputs, str(tmp_path / name), vocab_size=60))
    reference = made["tsv"]
    for name, corpus in made.items():
        assert corpus.pairs_fingerprint == reference.pairs_fingerprint, name
        for side in ("src", "tgt"):
            np.testing.assert_array_equal(corpus.ids[side], reference.ids[side])
            np.testing.assert_array_equal(corpus.offsets[side], reference.offsets[side])
    assert made["gz"].manifest["fingerprint"] != reference.manifest["fingerprint"]   # other bytes


def test_several_inputs_are_one_corpus_in_order(tmp_path):
    first = write_tsv(tmp_path / "a.tsv", n=80, seed=1)
    second = write_tsv(tmp_path / "b.tsv", n=70, seed=2)
    both = tmp_path / "both.tsv"
    both.write_text(open(first).read() + "".join(open(second).readlines()[1:]))
    joined = PreparedCorpus(prepare(make_inputs([first, second], "eng", "fake"), str(tmp_path / "j"), vocab_size=60))
    single = PreparedCorpus(prepare(make_inputs([str(both)], "eng", "fake"), str(tmp_path / "s"), vocab_size=60))
    assert joined.pairs_fingerprint == single.pairs_fingerprint
    np.testing.assert_array_equal(joined.ids["tgt"], single.ids["tgt"])
    assert [entry["kept"] for entry in joined.manifest["inputs"]] == [80, 70]


def test_aligned_files_of_different_lengths_are_an_error_naming_both(tmp_path):
    src, tgt = write_aligned(tmp_path, [("a b", "B A")] * 5)
    with open(tgt, "a") as f:
        f.write("extra\nmore\n")
    with pytest.raises(ValueError, match=rf"{src} has 5 lines, {tgt} has 7"):
        prepare(make_inputs([], src_file=src, tgt_file=tgt), str(tmp_path / "p"))
    assert not os.path.exists(tmp_path / "p")
    done = run_cli("prepare", "--src-file", src, "--tgt-file", tgt, "--out", str(tmp_path / "p"), "--quiet")
    assert done.returncode == 1
    assert done.stderr.strip().endswith("(line i of one must be the translation of line i of the other)")
    assert f"{src} has 5 lines, {tgt} has 7" in done.stderr
    done = run_cli("prepare", "--src-file", src, "--out", str(tmp_path / "p"))
    assert "error: --src-file: needs --tgt-file too" in done.stderr and done.returncode == 1


# -- bad input and faults --------------------------------------------------------------------------

def test_bad_lines_are_skipped_and_counted_as_before(tmp_path):
    path = tmp_path / "bad.tsv"
    good = [f"{s}\t{s.upper()}\n".encode() for s in sentences(60)]
    path.write_bytes(b"eng\tfake\n" + b"".join(good[:20]) + b"caf\xe9\tCAFE\n" + b"\tEMPTY\n"
                     + b"".join(good[20:]))
    corpus = PreparedCorpus(prepare(make_inputs([str(path)], "eng", "fake"), str(tmp_path / "p"), vocab_size=60))
    entry = corpus.manifest["inputs"][0]
    assert entry["kept"] == 60
    assert entry["skipped"] == {"lines with invalid UTF-8": 1, "pairs with an empty side": 1}
    assert entry["first_skipped"] == {"lines with invalid UTF-8": 22, "pairs with an empty side": 23}


def test_a_truncated_gzip_is_an_error_naming_the_file_and_line(tmp_path):
    whole = write_tsv(tmp_path / "whole.tsv.gz", n=3000, opener=gzip.open)
    cut = tmp_path / "cut.tsv.gz"
    blob = open(whole, "rb").read()
    cut.write_bytes(blob[:len(blob) * 2 // 3])
    done = run_cli("prepare", "--data", str(cut), "--out", str(tmp_path / "p"), "--quiet")
    assert done.returncode == 1
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"transformer prepare: error: --data {cut}: cannot be read after line "), line
    assert not os.path.exists(tmp_path / "p")


def test_a_file_that_changes_while_it_is_prepared_is_refused_and_nothing_is_kept(tmp_path, monkeypatch):
    data = write_tsv(tmp_path / "pairs.tsv", n=100)

    class Growing(SubwordTokenizer):    # between the two passes, the file grows by a line
        @classmethod
        def train(cls, texts, **kw):
            with open(data, "a") as f:
                f.write("late\tETAL\n")
            return SubwordTokenizer.train(texts, **kw)

    monkeypatch.setattr(preparation, "SubwordTokenizer", Growing)
    with pytest.raises(ValueError, match=f"{data}: changed while it was being prepared"):
        prepare(make_inputs([data], "eng", "fake"), str(tmp_path / "p"))
    assert not os.path.exists(tmp_path / "p")
    assert os.listdir(tmp_path) == ["pairs.tsv"]           # no temporary directory left either


def test_an_interrupted_preparation_leaves_nothing_that_reads_as_prepared(tmp_path, monkeypatch):
    data = write_tsv(tmp_path / "pairs.tsv", n=300)
    monkeypatch.setattr(preparation, "CHUNK_PAIRS", 16)
    calls = []

    def interrupted(self, flat, lengths):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return original(self, flat, lengths)

    original = store.ArrayWriter.append
    monkeypatch.setattr(store.ArrayWriter, "append", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare(make_inputs([data], "eng", "fake"), str(tmp_path / "p"))
    assert sorted(os.listdir(tmp_path)) == ["pairs.tsv"]
    # a process killed outright (SIGKILL) leaves its temporary directory: never taken for a corpus,
    # and removed by the next preparation beside it once its process is gone
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = tmp_path / (_temporary_prefix(int(dead.stdout)) + "p-0")
    leftover.mkdir()
    (leftover / "train.src.ids").write_bytes(b"\0" * 10)
    monkeypatch.setattr(store.ArrayWriter, "append", original)
    PreparedCorpus(prepare(make_inputs([data], "eng", "fake"), str(tmp_path / "p")))
    assert sorted(os.listdir(tmp_path)) == ["p", "pairs.tsv"]


@pytest.mark.parametrize("damage", ["truncate", "edit", "drop"])
def test_a_damaged_prepared_directory_is_refused_naming_the_file(tmp_path, damage):
    data = write_tsv(tmp_path / "pairs.tsv", n=100)
    out = prepare(make_inputs([data], "eng", "fake"), str(tmp_path / "p"), vocab_size=60)
    target = os.path.join(out, "train.tgt.ids")
    blob = bytearray(open(target, "rb").read())
    if damage == "truncate":
        open(target, "wb").write(blob[:-2])
        why = "truncated or grown"
    elif damage == "edit":
        blob[10] ^= 1
        open(target, "wb").write(blob)
        why = "its contents changed since it was prepared"
    else:
        os.unlink(target)
        why = "missing from the prepared corpus"
    with pytest.raises(ValueError, match=why):
        PreparedCorpus(out)
    done = run_cli("train", "--data", out, *SMALL, "--max-steps", "1", "--out", str(tmp_path / "run"))
    assert done.returncode == 1
    assert f"--data {out}: " in done.stderr and why in done.stderr, done.stderr
    assert not os.path.exists(tmp_path / "run")


def test_a_prepared_directory_refuses_the_flags_that_decide_preparation(tmp_path):
    data = write_tsv(tmp_path / "pairs.tsv", n=100)
    out = prepare(make_inputs([data], "eng", "fake"), str(tmp_path / "p"), vocab_size=60, dev_fraction=0.1)
    for flags, says in ((["--src-col", "eng"], "--src-col: --data "), (["--vocab-size", "80"], "--vocab-size 80: "),
                        (["--dev-fraction", "0.2"], "--dev-fraction 0.2: ")):
        done = run_cli("train", "--data", out, *SMALL, *flags, "--max-steps", "1", "--out", str(tmp_path / "r"))
        assert done.returncode == 2 and says in done.stderr, done.stderr
    done = run_cli("prepare", "--data", data, "--out", out, "--quiet")
    assert done.returncode == 2 and "--overwrite replaces it" in done.stderr
    done = run_cli("train", "--data", str(tmp_path), *SMALL, "--max-steps", "1", "--out", str(tmp_path / "r"))
    assert done.returncode == 1 and "not a prepared corpus" in done.stderr


# -- the cache of train --data FILE ----------------------------------------------------------------

def test_the_cache_reuses_a_match_and_prepares_anything_else_again(tmp_path, monkeypatch):
    monkeypatch.setenv("TRANSFORMER_CACHE", str(tmp_path / "cache"))
    data = write_tsv(tmp_path / "pairs.tsv", n=120)
    heard = []

    def get(**kw):
        heard.clear()
        settings = dict(dev_fraction=0.05, dev_max=500, vocab_size=60)
        settings.update(kw)
        return find_or_prepare(make_inputs([data], "eng", "fake"), log=heard.append, **settings)

    first = get()
    assert any(line.startswith("prepared into") for line in heard)
    again = get()
    assert again.path == first.path and any("prepared before" in line for line in heard)
    other_split = get(dev_fraction=0.1)
    assert other_split.path != first.path
    # the resumed run's tokenizers (those the first preparation learned) find it too
    given = get(tokenizers={"src": first.src_tokenizer, "tgt": first.tgt_tokenizer}, vocab_size=None)
    assert given.path == first.path
    with open(data, "a") as f:                      # other bytes: prepared again, never reused
        f.write("new line\tENIL WEN\n")
    changed = get()
    assert changed.path != first.path and len(changed) + len(changed.dev) == 121
    # a damaged cached copy is prepared again, with a line saying so
    with open(os.path.join(changed.path, "train.src.ids"), "r+b") as f:
        f.write(b"\xff\xff")
    repaired = get()
    assert any("is damaged" in line for line in heard) and repaired.path == changed.path
    assert len(os.listdir(cache.cache_root())) == 3


def test_bpe_is_learned_from_the_smallest_hash_sample_of_a_large_corpus(tmp_path):
    data = write_tsv(tmp_path / "pairs.tsv", n=400)
    heard = []
    corpus = PreparedCorpus(prepare(make_inputs([data], "eng", "fake"), str(tmp_path / "p"), vocab_size=40,
                                    bpe_sample=50, log=heard.append))
    assert any("BPE learned from a sample of 50 of the 382 training pairs" in line for line in heard)
    train_pairs, dev = split_pairs(read_pairs(data, "eng", "fake")[0], 0.05, 500)

    def h(src):
        return int.from_bytes(hashlib.blake2b(src.encode(), digest_size=4).digest(), "little")
    chosen = sorted(range(len(train_pairs)), key=lambda i: (h(train_pairs[i][0]), i))[:50]
    sample = [train_pairs[i] for i in sorted(chosen)]
    want = SubwordTokenizer.train([t for _, t in sample], vocab_size=40)
    assert corpus.tgt_tokenizer.to_json() == want.to_json()
    assert corpus.manifest["bpe"] == {"learned": True, "vocab_size": 40, "sample_pairs": 50}
    assert len(corpus) == 382                        # every training pair is encoded, sampled or not


def test_prepare_encodes_with_a_models_tokenizers_for_fine_tuning(tmp_path):
    data = write_tsv(tmp_path / "pairs.tsv", n=100)
    model = str(tmp_path / "model")
    done = run_cli("train", "--data", data, *SMALL, "--vocab-size", "50", "--max-steps", "1", "--out", model)
    assert done.returncode == 0, done.stderr
    other = write_tsv(tmp_path / "other.tsv", n=80, seed=5)
    prepared = str(tmp_path / "prepared")
    done = run_cli("prepare", "--data", other, "--tokenizers-from", model, "--out", prepared, "--quiet")
    assert done.returncode == 0, done.stderr
    done = run_cli("train", "--data", prepared, "--init-from", model, "--max-steps", "2", "--quiet", "--threads", "1",
                   "--out", str(tmp_path / "tuned"))
    assert done.returncode == 0, done.stderr
    learned = str(tmp_path / "learned")
    assert run_cli("prepare", "--data", other, "--out", learned, "--quiet").returncode == 0
    done = run_cli("train", "--data", learned, "--init-from", model, "--max-steps", "2", "--quiet", "--threads", "1",
                   "--out", str(tmp_path / "tuned2"))
    assert done.returncode == 2 and "encoded with other vocabularies than the model in" in done.stderr
