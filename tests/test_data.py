"""Reading sentence pairs, splitting, batching by length, and the BPE vocabulary."""
import gzip
import os

import numpy as np
import pytest

from transformer.data import ColumnError, collate, length_batches, make_example, pad_batch, read_pairs, split_pairs
from transformer.tokenizer import BOS_ID, EOS_ID, PAD_ID, SubwordTokenizer

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def test_header_names_select_columns(tmp_path):
    path = write(tmp_path, "p.tsv", "ref\teng\tspa\nG 1:1\tIn the beginning\tEn el principio\n".encode())
    pairs, report = read_pairs(path, "eng", "spa")
    assert pairs == [("In the beginning", "En el principio")]
    assert report.kept == 1 and not report.skipped


def test_a_first_line_of_identifiers_is_the_header_unless_told_otherwise(tmp_path):
    # "abc<TAB>CBA" looks like column names: read as the header by default, and the report says so;
    # header=False keeps it as the pair it is, header=True reads any line 1 as the header
    path = write(tmp_path, "p.tsv", "abc\tCBA\nHow are you?\t¿Cómo estás?\n".encode())
    pairs, report = read_pairs(path)
    assert pairs == [("How are you?", "¿Cómo estás?")]
    assert report.header == ["abc", "CBA"] and "line 1 read as the header: abc, CBA" in report.summary()
    pairs, report = read_pairs(path, header=False)
    assert pairs == [("abc", "CBA"), ("How are you?", "¿Cómo estás?")]
    assert report.header is None and "read as the header" not in report.summary()
    sentences = write(tmp_path, "s.tsv", "a b\tc d\nx y\tz\n".encode())
    assert read_pairs(sentences)[0] == [("a b", "c d"), ("x y", "z")]
    assert read_pairs(sentences, header=True)[0] == [("x y", "z")]


def test_column_names_make_line_1_the_header_whatever_it_holds(tmp_path):
    path = write(tmp_path, "p.tsv", "source text\ttarget text\nA b.\tC d.\n".encode())
    pairs, report = read_pairs(path, "source text", "target text")
    assert pairs == [("A b.", "C d.")] and report.header == ["source text", "target text"]
    assert read_pairs(path, "target text", 0)[0] == [("C d.", "A b.")]
    with pytest.raises(ColumnError, match="no column named 'eng'") as caught:
        read_pairs(path, "eng", 1)
    assert caught.value.argument == "src_col"


def test_header_argument_is_checked(tmp_path):
    path = write(tmp_path, "p.tsv", "eng\tspa\nHi.\tHola.\n".encode())
    with pytest.raises(ColumnError, match="'spa' is a column name, but line 1 is not to be read") as caught:
        read_pairs(path, 0, "spa", header=False)
    assert caught.value.argument == "tgt_col"
    with pytest.raises(TypeError, match="header must be True, False or None"):
        read_pairs(path, header="yes")
    bad = write(tmp_path, "bad.tsv", b"\xff\tspa\nHi.\tHola.\n")
    with pytest.raises(ValueError, match="line 1, the header, is not valid UTF-8"):
        read_pairs(bad, header=True)
    pairs, report = read_pairs(bad)               # undecided: an undecodable line 1 is a skipped line
    assert pairs == [("Hi.", "Hola.")] and report.skipped == {"lines with invalid UTF-8": 1}


def test_gzip_is_detected_by_content(tmp_path):
    path = write(tmp_path, "p.data", gzip.compress("eng\thin\nHi.\tनमस्ते।\n".encode()))
    assert read_pairs(path)[0] == [("Hi.", "नमस्ते।")]


def test_index_columns_without_header(tmp_path):
    path = write(tmp_path, "p.tsv", "a b\tx y\tz\n".encode())
    assert read_pairs(path, 2, 0)[0] == [("z", "a b")]


def test_bad_lines_are_counted_with_their_first_line_number(tmp_path):
    data = b"eng\thin\nok\tfine\nno tab here\n\xff\xfe bad\tutf8\n\t empty source\nlast\tone\n"
    pairs, report = read_pairs(write(tmp_path, "p.tsv", data))
    assert pairs == [("ok", "fine"), ("last", "one")]
    assert report.skipped == {"lines with too few columns": 1, "lines with invalid UTF-8": 1,
                              "pairs with an empty side": 1}
    assert report.first_skipped["lines with too few columns"] == 3
    assert "line 4" in report.summary()


def test_missing_empty_and_unknown_column_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.tsv"):
        read_pairs(str(tmp_path / "nowhere.tsv"))
    empty = write(tmp_path, "empty.tsv", b"")
    with pytest.raises(ValueError, match="empty.tsv"):
        read_pairs(empty)
    path = write(tmp_path, "p.tsv", b"eng\thin\na\tb\n")
    with pytest.raises(ValueError, match="no column named 'spa'"):
        read_pairs(path, "eng", "spa")


def test_truncated_gzip_is_a_clear_error(tmp_path):
    blob = gzip.compress(("eng\tspa\n" + "hello there\thola\n" * 2000).encode())
    path = write(tmp_path, "cut.tsv.gz", blob[: len(blob) // 2])
    with pytest.raises(ValueError, match="cut.tsv.gz"):
        read_pairs(path)


def test_split_is_deterministic_and_keeps_a_source_on_one_side():
    pairs = [(f"sentence {i % 50}", f"t{i}") for i in range(500)]
    train, dev = split_pairs(pairs, dev_fraction=0.2)
    assert (train, dev) == split_pairs(pairs, dev_fraction=0.2)
    assert len(train) + len(dev) == 500 and dev
    assert not {s for s, _ in train} & {s for s, _ in dev}


def test_length_batches_respect_the_budget_and_cover_everything_once():
    rng = np.random.default_rng(0)
    examples = [make_example([5] * n, [6] * m, BOS_ID, EOS_ID)
                for n, m in rng.integers(1, 40, size=(300, 2))]
    batches = length_batches(examples, max_tokens=400, seed=3, epoch=1)
    assert sorted(i for b in batches for i in b) == list(range(300))
    for b in batches:
        longest = max(max(len(examples[i][0]), len(examples[i][1])) for i in b)
        assert longest * len(b) <= 400 or len(b) == 1
    assert batches == length_batches(examples, max_tokens=400, seed=3, epoch=1)
    assert batches != length_batches(examples, max_tokens=400, seed=3, epoch=2)


def test_teacher_forcing_shift_and_padding():
    src, tgt_in, tgt_out = make_example([7, 8], [9, 10, 11], BOS_ID, EOS_ID)
    assert tgt_in == [BOS_ID, 9, 10, 11] and tgt_out == [9, 10, 11, EOS_ID]
    s, ti, to = collate([(src, tgt_in, tgt_out), ([7], [BOS_ID], [EOS_ID])], [0, 1], PAD_ID)
    assert s.tolist() == [[7, 8], [7, PAD_ID]]
    assert ti.dtype == np.int64 and ti.shape == (2, 4) and to[1].tolist() == [EOS_ID, 0, 0, 0]
    assert pad_batch([], PAD_ID).shape == (0, 0)


def test_bpe_round_trip_and_reserved_ids(tmp_path):
    texts = ["how are you?", "who are you?", "are you here?", "you are here."] * 20
    tok = SubwordTokenizer.train(texts, vocab_size=60, min_frequency=1)
    ids = tok.encode("how are you?")
    assert min(ids) >= 4 and tok.decode(ids) == "how are you?"
    assert tok.decode([BOS_ID] + ids + [EOS_ID, PAD_ID]) == "how are you?"
    path = str(tmp_path / "tok.json")
    tok.save(path)
    assert SubwordTokenizer.load(path).encode("how are you?") == ids
    with open(path, "w") as f:
        f.write("{not json")
    with pytest.raises(ValueError, match="tok.json"):
        SubwordTokenizer.load(path)


@pytest.mark.skipif(not os.path.isdir(SHARED), reason="../shared/data is not present")
def test_real_corpora_read_cleanly():
    pairs, report = read_pairs(os.path.join(SHARED, "tatoeba-eng-hin.tsv"), "eng", "hin")
    assert ("How are you?", "आप कैसे हैं?") in pairs
    assert report.kept == len(pairs) > 2000
    pairs, _ = read_pairs(os.path.join(SHARED, "bible-eng-spa.tsv.gz"), "eng", "spa")
    assert len(pairs) > 29000


def test_a_column_beyond_every_line_is_the_columns_error(tmp_path):
    """Not "no usable sentence pairs" of the file: ColumnError names the argument."""
    plain = write(tmp_path, "plain.tsv", b"Hello there.\tHola.\nGood bye.\tAdios.\n")
    with pytest.raises(ColumnError, match="no column 3 \\(0-based\\): its lines have at most 2") as caught:
        read_pairs(plain, 0, 3)
    assert caught.value.argument == "tgt_col"
    with pytest.raises(ColumnError) as caught:
        read_pairs(plain, 2, 1)
    assert caught.value.argument == "src_col"
    headed = write(tmp_path, "headed.tsv", b"eng\tspa\nHello.\tHola.\n")
    with pytest.raises(ColumnError, match="its lines have at most 2") as caught:
        read_pairs(headed, 0, 2)
    assert caught.value.argument == "tgt_col"
    ragged = write(tmp_path, "ragged.tsv", b"Hello.\tHola.\nA.\tB.\tC.\n")   # some line has it: read that one
    assert read_pairs(ragged, 0, 2)[0] == [("A.", "C.")]
    narrow_header = write(tmp_path, "narrow.tsv", b"eng\tspa\nA.\tB.\tC.\n")  # the header does not limit the lines
    assert read_pairs(narrow_header, 0, 2)[0] == [("A.", "C.")]
