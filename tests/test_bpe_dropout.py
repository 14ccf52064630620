"""BPE-dropout (Provilkov et al., 2020; issue 57): training sentences segmented anew each pass, each
merge skipped with probability p, from a stream of (seed, pass, side, sentence); p = 0 and dev,
test and inference text are the plain segmentation; `train --bpe-dropout P` resumes exactly and
trains alike from a file and from its prepared directory."""
import contextlib
import io
import json
import os

import numpy as np
import pytest

from conftest import SINGLE_THREADED
from transformer import _C, cli, train
from transformer.bpe_dropout import BPEDropout, dropout_rng
from transformer.checkpoint import load_checkpoint
from transformer.corpus import PreparedCorpus, TrainingSet, make_inputs, prepare
from transformer.tokenizer import CharTokenizer, SubwordTokenizer

SMALL = ["--d-model", "32", "--n-heads", "2", "--d-ff", "64", "--n-encoder-layers", "1",
         "--n-decoder-layers", "1", "--quiet", "--threads", "1"]
SYLLABLES = ["ka", "ri", "to", "men", "sa", "lo", "ve", "dun", "pi", "tha", "que", "ñu", "ål"]
REAL = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "tatoeba-eng-hin.tsv")


def sentences(n, seed=0):
    """Words of 1-4 syllables, so that BPE learns merges of every length; '#' and '€' are rare."""
    rng = np.random.default_rng(seed)
    words = ["".join(rng.choice(SYLLABLES, size=rng.integers(1, 5))) for _ in range(60)] + ["#x", "€"]
    return [" ".join(rng.choice(words, size=rng.integers(1, 10))) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer():
    return SubwordTokenizer.train(sentences(400), vocab_size=120)


def write_tsv(path, n=200, seed=0):
    lines = ["eng\tfake"] + [f"{s}\t{s[::-1]}" for s in sentences(n, seed)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


# -- the segmentation ----------------------------------------------------------------------------

def test_p_zero_is_exactly_the_plain_segmentation(tokenizer):
    texts = sentences(500, seed=1) + ["", "  two  spaces ", "unseen ZQ chars ✓ </s>"]
    for i, text in enumerate(texts):
        assert tokenizer.encode_with_dropout(text, 0.0, dropout_rng(0, 0, "src", i)) == tokenizer.encode(text), text


def test_p_zero_is_the_plain_segmentation_of_real_text():
    if not os.path.exists(REAL):
        pytest.skip(f"{REAL}: the shared corpora are not here")
    with open(REAL, encoding="utf-8") as f:
        pairs = [line.rstrip("\n").split("\t")[:2] for line in f][1:801]
    for side in (0, 1):                   # English, and Hindi (Devanagari's combining marks, NFKC)
        texts = [pair[side] for pair in pairs]
        tok = SubwordTokenizer.train(texts[:400], vocab_size=1000)
        plain = tok.encode_batch(texts)
        segmenter = tok.dropout()
        mismatches = [t for t, ids in zip(texts, plain) if segmenter.resegment(ids, 0.0, dropout_rng(0, 0, 0, 0)) != ids]
        assert not mismatches, mismatches[:3]


def test_dropped_segmentations_are_valid_and_vary_with_the_pass(tokenizer):
    texts = sentences(300, seed=2)
    vocab = json.loads(tokenizer.to_json())["model"]["vocab"]
    pieces_of = {token_id: piece for piece, token_id in vocab.items()}
    differ = 0
    for i, text in enumerate(texts):
        plain = tokenizer.encode(text)
        drawn = [tokenizer.encode_with_dropout(text, 0.3, dropout_rng(0, epoch, "src", i)) for epoch in range(3)]
        for ids in drawn:
            assert tokenizer.decode(ids) == tokenizer.decode(plain)        # the text is all there
            assert all(token_id in pieces_of for token_id in ids)          # every piece a vocabulary entry
            assert len(ids) >= len(plain)                                  # fewer merges, never more
        differ += len({tuple(ids) for ids in drawn}) > 1
    assert differ > len(texts) // 2, differ


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_the_share_of_merges_skipped_is_p(tokenizer, p):
    stats = {}
    for i, text in enumerate(sentences(2000, seed=3)):
        tokenizer.dropout().encode(text, p, dropout_rng(5, 0, "tgt", i), stats)
    share = stats["skipped"] / stats["considered"]
    tolerance = 5 * (p * (1 - p) / stats["considered"]) ** 0.5        # five standard deviations
    print(f"skipped {stats['skipped']} of {stats['considered']} merges: {share:.4f} (p {p})")
    assert stats["considered"] > 10000
    assert abs(share - p) < tolerance


def test_draws_depend_on_the_stream_alone_not_on_the_order(tokenizer):
    texts = sentences(200, seed=4)
    forward = [tokenizer.encode_with_dropout(t, 0.2, dropout_rng(3, 1, "src", i)) for i, t in enumerate(texts)]
    backward = {i: tokenizer.encode_with_dropout(texts[i], 0.2, dropout_rng(3, 1, "src", i))
                for i in reversed(range(len(texts)))}
    assert forward == [backward[i] for i in range(len(texts))]
    other_seed = [tokenizer.encode_with_dropout(t, 0.2, dropout_rng(4, 1, "src", i)) for i, t in enumerate(texts)]
    assert other_seed != forward


def test_plain_encoding_never_drops_a_merge(tokenizer):
    """Dev, test and inference text go through encode(), which drawing segmentations leaves as it was."""
    texts = sentences(100, seed=5)
    before = [tokenizer.encode(t) for t in texts]
    for i, text in enumerate(texts):
        tokenizer.encode_with_dropout(text, 0.5, dropout_rng(0, 0, "src", i))
    assert [tokenizer.encode(t) for t in texts] == before
    assert tokenizer.encode_batch(texts) == before
    assert json.loads(tokenizer.to_json())["model"]["dropout"] is None     # what a saved model holds


def test_only_bpe_vocabularies_take_dropout():
    with pytest.raises(ValueError, match="BPE vocabulary"):
        BPEDropout(CharTokenizer("abc"))
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\)"):
        SubwordTokenizer.train(["a b"], vocab_size=10).encode_with_dropout("a", 1.0, dropout_rng(0, 0, 0, 0))


# -- the C segmenter: the Python replay above, id for id, on every core --------------------------

def ragged(lists, dtype):
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum([len(ids) for ids in lists], out=offsets[1:])
    return np.asarray([i for ids in lists for i in ids], dtype=dtype), offsets


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9])
@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.uint32])   # a prepared corpus stores uint16 or uint32
def test_segment_many_is_the_python_replay_id_for_id(tokenizer, p, dtype, restore_threads):
    """Sentences of every length (none too), rows in any order, at 1 and 2 threads: each equals
    resegment with dropout_rng's stream, and the lengths alone are its lengths."""
    segmenter = tokenizer.dropout()
    texts = sentences(400, seed=6) + ["", "€ #x ka"]
    plain = [tokenizer.encode(t) for t in texts]
    rows = np.random.default_rng(1).permutation(5000)[:len(texts)]
    want = [segmenter.resegment(ids, p, dropout_rng(11, 2, "tgt", r)) for ids, r in zip(plain, rows)]
    ids, offsets = ragged(plain, dtype)
    for threads in (1,) if SINGLE_THREADED else (1, 2):     # a build without OpenMP: its one thread
        _C.set_num_threads(threads)
        got, at = segmenter.segment_many(ids, offsets, p, 11, 2, "tgt", rows)
        assert got.dtype == np.int32 and at.tolist()[0] == 0
        assert [got[at[k]:at[k + 1]].tolist() for k in range(len(texts))] == want
        lens = segmenter.segment_many(ids, offsets, p, 11, 2, "tgt", rows, lengths_only=True)
        assert lens.tolist() == [len(w) for w in want]
    if p:
        assert want != plain


def test_segment_many_reads_ids_where_its_offsets_say(tokenizer):
    """Offsets into the middle of a corpus's ids (a chunk of a memory-mapped array) and ids beyond
    the vocabulary, which stay whole and begin no word, as the replay keeps them."""
    segmenter = tokenizer.dropout()
    plain = [tokenizer.encode(t) for t in sentences(50, seed=7)]
    plain[3] = plain[3][:2] + [tokenizer.vocab_size + 5] + plain[3][2:]
    ids, offsets = ragged(plain, np.int32)
    rows = np.arange(10, 50)
    got, at = segmenter.segment_many(ids, offsets[10:], 0.3, 2, 0, "src", rows)
    want = [segmenter.resegment(plain[r], 0.3, dropout_rng(2, 0, "src", r)) for r in rows]
    assert [got[at[k]:at[k + 1]].tolist() for k in range(len(rows))] == want


def test_a_seed_of_fewer_words_is_the_int_random_random_reads(tokenizer):
    """random.Random(n) reads only n's significant 32-bit words: keys with keylen 1-4 give its stream."""
    import random
    segmenter = tokenizer.dropout()
    plain = [tokenizer.encode(t) for t in sentences(40, seed=8)]
    ids, offsets = ragged(plain, np.int32)
    seeds = [5 + k + (k % 4 > 0) * 2**32 * (k + 1) + (k % 4 > 1) * 2**64 * 3 + (k % 4 > 2) * 2**96 for k in range(40)]
    keys = np.array([[(n >> (32 * w)) & 0xFFFFFFFF for w in range(4)] for n in seeds], dtype=np.uint32)
    keylen = np.array([k % 4 + 1 for k in range(40)], dtype=np.int32)
    got, at = segmenter.tables().segment(ids, offsets, keys, keylen, 0.4)
    want = [segmenter.resegment(ids_, 0.4, random.Random(n)) for ids_, n in zip(plain, seeds)]
    assert [got[at[k]:at[k + 1]].tolist() for k in range(40)] == want


def test_segment_many_refuses_what_it_cannot_read(tokenizer):
    tables = tokenizer.dropout().tables()
    ids, offsets = ragged([[5, 6], [7]], np.int32)
    keys, keylen = np.zeros((2, 4), np.uint32), np.ones(2, np.int32)
    with pytest.raises(TypeError, match="ids"):
        tables.segment(ids.astype(np.int64), offsets, keys, keylen, 0.1)
    with pytest.raises(ValueError, match="offsets"):
        tables.segment(ids, np.array([0, 2, 9]), keys, keylen, 0.1)
    with pytest.raises(ValueError, match="keylen"):
        tables.segment(ids, offsets, keys, np.array([1, 5], np.int32), 0.1)
    with pytest.raises(ValueError, match="p must be"):
        tables.segment(ids, offsets, keys, keylen, 1.0)


# -- the training set: redrawn per pass, off unless asked for -----------------------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("bpe")
    data = write_tsv(path / "pairs.tsv", n=300)
    return PreparedCorpus(prepare(make_inputs([data], "eng", "fake"), str(path / "prep"), dev_fraction=0.1,
                                  dev_max=20, vocab_size=120))


def sets(corpus, p, max_tokens=64):
    return TrainingSet(corpus, max_tokens, 300, 7, bos_id=1, eos_id=2, pad_id=0, bpe_dropout=p)


def test_off_the_batches_are_todays_whatever_the_pass(corpus):
    plain, off = sets(corpus, 0.0), TrainingSet(corpus, 64, 300, 7, bos_id=1, eos_id=2, pad_id=0)
    assert off.bpe_dropout == 0.0 and off.segmenters is None
    for epoch in range(2):
        batches = off.batches(epoch)
        for i in range(len(batches)):
            want = off.collate(batches[i])
            for got in (off.collate(batches[i], epoch=epoch), plain.collate(batches[i], epoch=epoch + 5)):
                for a, b in zip(got, want):
                    np.testing.assert_array_equal(a, b)
        rows = off.rows[batches[0]]                                      # the stored ids, as they are
        src, _, tgt_out = off.collate(batches[0])
        for b, row in enumerate(rows):
            ids = corpus.sentence("src", row).tolist()
            assert src[b, :len(ids)].tolist() == ids and (src[b, len(ids):] == 0).all()
            assert tgt_out[b, :len(corpus.sentence("tgt", row)) + 1].tolist() == corpus.sentence("tgt", row).tolist() + [2]


def test_each_pass_draws_its_own_segmentations_whatever_the_batching(corpus):
    data = sets(corpus, 0.2)
    tok = corpus.src_tokenizer

    def sources(epoch, positions):
        src = data.collate(positions, epoch=epoch)[0]
        return {int(data.rows[p]): [int(i) for i in row if i] for p, row in zip(positions, src)}

    everything = np.arange(len(data))
    first = sources(0, everything)
    assert first == {**sources(0, everything[::2]), **sources(0, everything[1::2][::-1])}   # any order, any batch
    second = sources(1, everything)
    assert first != second
    for row, ids in first.items():
        assert tok.decode(ids) == tok.decode(corpus.sentence("src", row))
    # each pass's batches are packed by its own segmentations: every pair once, and a batch holds at
    # most batch_tokens (300) drawn ids counted as rows x its longest pair, as a plain run's hold plain ones
    off = sets(corpus, 0.0)
    for epoch in range(2):
        batches = data.batches(epoch)
        assert sorted(np.concatenate([batches[i] for i in range(len(batches))]).tolist()) == everything.tolist()
        drawn = data.drawn_lengths(epoch)
        for i in range(len(batches)):
            src, tgt_in, _ = data.collate(batches[i], epoch=epoch)
            np.testing.assert_array_equal(drawn[batches[i]], np.maximum((src != 0).sum(1), (tgt_in != 0).sum(1)))
            assert len(batches[i]) == 1 or len(batches[i]) * max(src.shape[1], tgt_in.shape[1]) <= 300
        assert (drawn > off.lengths).any() and [b.tolist() for b in batches] != [b.tolist() for b in off.batches(epoch)]


def test_a_drawn_segmentation_too_long_for_the_model_gives_way_to_the_plain_one(corpus):
    plain = sets(corpus, 0.0, max_tokens=8)
    data = sets(corpus, 0.9, max_tokens=8)
    positions = np.arange(len(data))
    src, tgt_in, _ = data.collate(positions, epoch=3)
    assert src.shape[1] <= 8 and tgt_in.shape[1] <= 8
    assert (plain.collate(positions)[0] != 0).sum() < (src != 0).sum()   # some were longer, and drawn


def test_a_corpus_encoded_with_another_kind_of_vocabulary_refuses_dropout(corpus, monkeypatch):
    """A MarianMT model's SentencePiece (prepare --tokenizers-from) has no merges to drop."""
    monkeypatch.setitem(corpus.tokenizers, "tgt", CharTokenizer("abc"))
    with pytest.raises(ValueError, match="BPE-dropout needs a BPE vocabulary"):
        sets(corpus, 0.1)
    assert sets(corpus, 0.0).segmenters is None          # off: any vocabulary trains as before


# -- the command line -----------------------------------------------------------------------------

def losses(out):
    with open(os.path.join(out, train.LOG_FILE)) as f:
        return [json.loads(line)["loss"] for line in f if "loss" in json.loads(line)]


def test_train_with_bpe_dropout_resumes_exactly_and_trains_alike_from_a_prepared_directory(tmp_path, monkeypatch):
    """12 steps cross a pass (about 8 batches a pass): a file and its prepared directory give the same
    losses, a run resumed at step 6 repeats them, and dropout changes them."""
    monkeypatch.setenv("TRANSFORMER_CACHE", str(tmp_path / "cache"))
    data = write_tsv(tmp_path / "pairs.tsv", n=100)
    common = [*SMALL, "--vocab-size", "60", "--batch-tokens", "200", "--schedule", "noam", "--warmup", "10",
              "--dropout", "0"]
    prepared = str(tmp_path / "prepared")
    assert cli.main(["prepare", "--data", data, "--src-col", "eng", "--tgt-col", "fake", "--vocab-size", "60",
                     "--out", prepared, "--quiet"]) == 0
    a, b, c, off = (str(tmp_path / name) for name in ("a", "b", "c", "off"))
    file_flags = ["--data", data, "--src-col", "eng", "--tgt-col", "fake"]
    assert cli.main(["train", *file_flags, *common, "--bpe-dropout", "0.3", "--max-steps", "12", "--out", a]) == 0
    assert cli.main(["train", "--data", prepared, *common, "--bpe-dropout", "0.3", "--max-steps", "12",
                     "--out", b]) == 0
    assert cli.main(["train", "--data", prepared, *common, "--bpe-dropout", "0.3", "--max-steps", "6",
                     "--out", c]) == 0
    assert cli.main(["train", "--resume", c, "--max-steps", "12", "--quiet"]) == 0
    assert cli.main(["train", *file_flags, *common, "--max-steps", "12", "--out", off]) == 0
    assert len(losses(a)) == 12 and load_checkpoint(a).train_state["epoch"] >= 1   # a second pass began
    assert losses(b) == losses(a)
    assert losses(c) == losses(a)
    assert losses(off) != losses(a)
    assert load_checkpoint(a).args["bpe_dropout"] == 0.3 and load_checkpoint(off).args["bpe_dropout"] == 0.0
    # a resumed run keeps its rate: another is refused, naming the flag
    message = failure(["train", "--resume", c, "--bpe-dropout", "0.1", "--max-steps", "14", "--quiet"])
    assert "--bpe-dropout 0.1" in message and "keeps its settings" in message


def failure(argv):
    """What `transformer ARGV` prints on stderr when it fails (it must)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            status = cli.main(argv)
        except SystemExit as exc:       # argparse's errors
            status = exc.code
    assert status not in (0, None), err.getvalue()
    return err.getvalue()


@pytest.mark.parametrize("value", ["1", "-0.1", "nan", "x"])
def test_bpe_dropout_outside_zero_to_one_is_refused_naming_the_flag(tmp_path, value):
    data = write_tsv(tmp_path / "pairs.tsv", n=20)
    assert "--bpe-dropout" in failure(["train", "--data", data, "--bpe-dropout", value, "--out", str(tmp_path / "run")])


def test_bpe_dropout_is_refused_for_the_built_in_task(tmp_path):
    message = failure(["train", "--bpe-dropout", "0.1", "--max-steps", "1", "--out", str(tmp_path / "run"), *SMALL])
    assert "--bpe-dropout applies only with --data" in message
