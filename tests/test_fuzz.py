"""Property-based fuzzing of every public entry point (tests/fuzz_targets.py), one target per
fresh interpreter: a crash (segfault, abort) fails that test with the interpreter's stderr instead
of killing the test run.

The hypothesis seed is fixed (derandomize=True), so a run is reproducible. The default budget
keeps this file well under 90 s on two cores; TRANSFORMER_FUZZ_EXAMPLES=3000 (examples per
target, before each target's cost weight) makes a long run.
"""
import json
import os
import subprocess
import sys
import tempfile

import pytest

import transformer

sys.path.insert(0, os.path.dirname(__file__))
from fuzz_targets import TARGETS  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "fuzz_targets.py")
# The built package (with its compiled _C) this test process imported, for the subprocesses.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(transformer.__file__)))
EXAMPLES = int(os.environ.get("TRANSFORMER_FUZZ_EXAMPLES", "500"))
TIMEOUT = 600 if EXAMPLES <= 500 else 6 * 3600


def run_target(name, examples=EXAMPLES):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONFAULTHANDLER"] = "1"           # a crash prints the Python stack of every thread
    env.setdefault("OMP_NUM_THREADS", "2")
    # From outside the checkout: its transformer/ folder may have no compiled module.
    return subprocess.run([sys.executable, SCRIPT, name, "--examples", str(examples)], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT, cwd=tempfile.gettempdir())


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_target(target):
    proc = run_target(target)
    if proc.returncode < 0:
        pytest.fail(f"{target}: the interpreter died of signal {-proc.returncode}\n{proc.stderr[-6000:]}")
    assert proc.returncode == 0, f"{target} found a failing case:\n{proc.stderr[-8000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(result)
    assert result["target"] == target
    assert result["cases"] > 0 and result["valid"] > 0 and result["invalid"] > 0, result



# --------------------------------------------------------------------------------------------
# What the fuzzing found, one regression test per fix (the minimal failing case it reduced to).

import gzip  # noqa: E402

import numpy as np  # noqa: E402

import transformer as T  # noqa: E402
from transformer import data, ops  # noqa: E402
from transformer.tokenizer import CharTokenizer, SubwordTokenizer, tokenizer_from_json  # noqa: E402


def unaligned(x):
    """x copied into a buffer one byte past an aligned address (C-contiguous, but not aligned)."""
    buf = np.zeros(x.nbytes + 1, np.uint8)
    y = buf[1:].view(x.dtype).reshape(x.shape)
    y[...] = x
    assert not y.flags.aligned
    return y


def test_ops_accept_unaligned_float32_inputs_like_any_other_layout():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 7), dtype=np.float32)
    b = rng.standard_normal((7, 3), dtype=np.float32)
    assert np.array_equal(ops.matmul(unaligned(a), unaligned(b)), ops.matmul(a, b))
    s = rng.standard_normal((2, 3, 4), dtype=np.float32)
    assert np.array_equal(ops.softmax(unaligned(s)), ops.softmax(s))
    w, bias = np.ones(7, np.float32), np.zeros(7, np.float32)
    assert np.array_equal(ops.layer_norm(unaligned(a), unaligned(w), bias), ops.layer_norm(a, w, bias))


@pytest.mark.parametrize("call, name", [
    (lambda x: ops.matmul(x, x, trans_a="no"), "trans_a"),
    (lambda x: ops.matmul(x, x, trans_b=None), "trans_b"),
    (lambda x: ops.matmul(x, x, out=np.empty_like(x), accumulate="yes"), "accumulate"),
    (lambda x: ops.softmax(x[None], causal="no"), "causal"),
])
def test_ops_yes_no_arguments_must_be_bools(call, name):
    x = np.ones((3, 3), np.float32)
    with pytest.raises(TypeError, match=name):
        call(x)
    # numpy bools and 0/1 are bools
    assert ops.matmul(x, x, trans_a=np.bool_(True), trans_b=0).shape == (3, 3)


def test_text_that_spells_a_reserved_token_is_not_a_control_id():
    tok = SubwordTokenizer.train(["hello world <s> </s>", "hello there"] * 5, vocab_size=40, min_frequency=1)
    for text in ("<s>", "</s>", "<pad>", "a </s> b"):
        ids = tok.encode(text)
        assert not set(ids) & {0, 1, 2}, (text, ids)
    again = tokenizer_from_json(tok.to_json())           # also after a save and load
    assert not set(again.encode("</s>")) & {0, 1, 2}


@pytest.mark.parametrize("kwargs, error, name", [
    (dict(vocab_size=2**40), ValueError, "vocab_size"),      # was: a Rust allocation abort
    (dict(vocab_size="60"), TypeError, "vocab_size"),
    (dict(vocab_size=60.0), TypeError, "vocab_size"),
    (dict(min_frequency=-1), ValueError, "min_frequency"),   # was: OverflowError
])
def test_subword_training_arguments_are_checked_before_the_trainer_runs(kwargs, error, name):
    with pytest.raises(error, match=name):
        SubwordTokenizer.train(["a b", "b c"], **kwargs)
    with pytest.raises(TypeError, match="texts"):
        SubwordTokenizer.train("one string is not a list of texts", vocab_size=20)
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        SubwordTokenizer.train(["a", None], vocab_size=20)


def test_tokenizers_decode_skip_ids_outside_the_vocabulary_and_refuse_non_ints():
    sub = SubwordTokenizer.train(["hello world"] * 4, vocab_size=30, min_frequency=1)
    chars = CharTokenizer("abc")
    for tok in (sub, chars):
        ids = tok.encode("abc" if tok is chars else "hello")
        assert tok.decode([-1, 2**70, tok.vocab_size] + ids) == tok.decode(ids)   # was: OverflowError
        with pytest.raises(TypeError, match="ids"):
            tok.decode([1.5])                                          # was: silently int(1.5)
        with pytest.raises(TypeError, match="text"):
            tok.encode(b"abc")                                         # was: ids of the bytes' ints
    assert chars.tokens([-1, 4, 99]) == ["?", "a", "?"]                # was: '<unk>' for -1


def test_char_tokenizer_alphabet_must_be_a_str():
    for bad in (["a", "b"], b"ab", None):
        with pytest.raises(TypeError, match="alphabet"):
            CharTokenizer(bad)
    with pytest.raises(ValueError, match="tok.json"):
        tokenizer_from_json('{"type": "chars", "alphabet": "aa"}', source="tok.json")
    with pytest.raises(TypeError, match="text"):
        tokenizer_from_json(None)


def test_a_corrupted_gzip_stream_is_a_clear_error(tmp_path):
    blob = gzip.compress(b"a\tb\n" * 500)
    path = tmp_path / "bad.tsv.gz"
    path.write_bytes(blob[:12] + bytes(x ^ 0x5A for x in blob[12:]))   # was: zlib.error escaped
    with pytest.raises(ValueError, match="bad.tsv.gz"):
        data.read_pairs(str(path))


def test_read_pairs_checks_its_column_and_limit_arguments(tmp_path):
    path = tmp_path / "p.tsv"
    path.write_bytes(b"x y\tz w\tlast\nx2\tz2\tlast2\n")
    with pytest.raises(ValueError, match="src_col"):
        data.read_pairs(str(path), -1, 0)            # was: read the last column
    with pytest.raises(TypeError, match="tgt_col"):
        data.read_pairs(str(path), 0, None)          # was: "no column named 'None'"
    with pytest.raises(ValueError, match="max_pairs"):
        data.read_pairs(str(path), max_pairs=0)      # was: one pair
    with pytest.raises(TypeError, match="path"):
        data.read_pairs(None)
    assert data.read_pairs(str(path), "2", 0, max_pairs=1)[0] == [("last", "x y")]


def test_batching_arguments_are_checked():
    examples = [data.make_example([5, 6], [7], 1, 2)]
    with pytest.raises(TypeError, match="max_tokens"):
        data.length_batches(examples, None)
    with pytest.raises(ValueError, match="max_tokens"):
        data.length_batches(examples, float("nan"))    # was: accepted
    with pytest.raises(ValueError, match="indices"):
        data.collate(examples, [1], 0)                  # was: IndexError
    with pytest.raises(ValueError, match="indices"):
        data.collate(examples, [-1], 0)                 # was: the last example
    with pytest.raises(TypeError, match="sequences"):
        data.pad_batch([["a"]], 0)


def tiny():
    cfg = T.ModelConfig(src_vocab_size=9, tgt_vocab_size=7, d_model=8, n_heads=2, d_ff=16,
                        n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, max_len=7)
    return T.Seq2SeqTransformer(cfg, seed=0)


def test_model_argument_checks_name_the_argument(tmp_path):
    model = tiny()
    src = np.array([[3, 4, 5]])
    with pytest.raises(ValueError, match="vocab"):
        model.check_ids(src, "src", 0)                 # was: "src ids must be in [0, 0)"
    with pytest.raises(TypeError, match="vocab"):
        model.check_ids(src, "src", "9")
    with pytest.raises(TypeError, match="path"):
        model.save(None)
    with pytest.raises(TypeError, match="path"):
        T.Seq2SeqTransformer.load(None)
    with pytest.raises(TypeError, match="n"):
        model.positional_table(2.5)
    with pytest.raises(TypeError, match="return_attention"):
        model.greedy_decode(src, max_len=3, return_attention="no")   # was: truthy, so attention
    # a numpy float is a number
    assert len(model.beam_search(src, beam_size=2, max_len=3, length_penalty=np.float32(0.6))) == 1


def test_load_state_dict_refuses_values_beyond_float32_range():
    model = tiny()
    sd = model.state_dict()
    before = sd["generator.bias"].copy()
    sd["generator.bias"] = np.full(sd["generator.bias"].shape, 1e300)   # was: silently inf
    with pytest.raises(ValueError, match="generator.bias"):
        model.load_state_dict(sd)
    assert np.array_equal(model.state_dict()["generator.bias"], before)
    sd["generator.bias"] = np.full(before.shape, np.inf)               # inf itself is a value
    model.load_state_dict(sd)


# --------------------------------------------------------------------------------------------
# Regression tests of the fuzzing's findings in the kernels and decoding (F1, F6: NaN rows of the
# softmax; F2: decoding emitted pad; F3: beam kernels crashed on a list output; F4: probs could
# overlap attention_decode's inputs), all fixed.

def test_softmax_propagates_nan_like_numpy():
    scores = np.array([[[np.nan, np.nan], [np.nan, -np.inf]]], np.float32)
    probs = ops.softmax(scores)
    print(probs)
    assert np.isnan(probs).all()


def test_decoding_never_emits_the_padding_id():
    cfg = T.ModelConfig(src_vocab_size=9, tgt_vocab_size=7, d_model=8, n_heads=2, d_ff=16,
                        n_encoder_layers=1, n_decoder_layers=2, dropout=0.0, max_len=7)
    model = T.Seq2SeqTransformer(cfg, seed=0)
    model.params.flat *= 3
    src = np.array([[6, 6, 4, 4, 3, 3]])
    hyp = model.greedy_decode(src, max_len=7)[0]
    print(hyp, model.forward(src, np.array([[cfg.bos_id] + hyp])[:, :7])[0].argmax(-1))
    assert cfg.pad_id not in hyp
    assert cfg.pad_id not in model.beam_search(src, beam_size=1, max_len=7)[0]


def test_beam_topk_refuses_a_list_as_output():
    code = ("import numpy as np\nfrom transformer import _C\n"
            "try:\n"
            "    _C.beam_topk(np.zeros((6, 4), np.float32), np.zeros((3, 2)), 0, 3,\n"
            "                 np.zeros((3, 3), np.int64), [[0.0] * 3] * 3)\n"
            "except TypeError as exc:\n"
            "    assert 'top_score' in str(exc), exc\n"
            "else:\n"
            "    raise SystemExit('a list as top_score was accepted')\n")
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tempfile.gettempdir())
    assert proc.returncode == 0, f"returncode {proc.returncode}: {proc.stderr[-2000:]}"


def test_attention_decode_refuses_probs_overlapping_the_query():
    from transformer import _C

    buf = np.zeros(64, np.float32)
    q = buf[:6].reshape(3, 2)                      # N=3, H=1, dh=2
    probs = buf[1:7].reshape(3, 1, 2)              # n_keys=2: shares q's memory
    cache = np.ones((3, 1, 2, 2), np.float32)
    with pytest.raises(ValueError, match="probs"):
        _C.attention_decode(q, cache, cache.copy(), 2, np.zeros((3, 2), np.float32), 0.5, probs=probs)


def test_softmax_of_a_nan_row_has_the_same_bits_at_every_simd_level():
    from conftest import ISA_LEVELS
    from transformer import _C

    scores = np.zeros((1, 2, 3), np.float32)
    scores[0, 0, 0] = np.inf                       # query 0 sees only key 0: inf - inf = NaN
    results = []
    try:
        for level in ISA_LEVELS:
            _C.set_isa(level)
            results.append(ops.softmax(scores, causal=True))
    finally:
        _C.set_isa(_C.best_isa())
    print(results)
    for r in results[1:]:
        assert np.array_equal(r, results[0], equal_nan=True)
    assert np.isnan(results[0][0, 0]).all()       # numpy's answer: the whole row is NaN



@pytest.mark.parametrize("value", [np.inf, -np.inf])
def test_softmax_with_scale_zero_of_an_infinite_score_is_nan_at_every_simd_level(value):
    # 0 * inf is NaN: the only visible score of the row is NaN, as numpy computes it
    from conftest import ISA_LEVELS
    from transformer import _C

    scores = np.array([[[value, 1.0]]], np.float32)
    try:
        for level in ISA_LEVELS:
            _C.set_isa(level)
            assert np.isnan(ops.softmax(scores, scale=0.0, causal=True)).all(), level
    finally:
        _C.set_isa(_C.best_isa())
