"""The decoder's step in C (csrc/decoder.c) against the same step composed kernel by kernel from
Python (DecoderCache._step_python), bit for bit, at every precision, SIMD level and split of the
rows across threads; and its argument checks. (Greedy and beam search against full recomputation
and PyTorch, which now run on this step, are in test_decoding.py and test_model_parity.py.)"""
import numpy as np
import pytest

import transformer as T
import transformer.decoding as dec
from transformer import _C

from conftest import ALL_ISA_LEVELS, isa_fixture, num_threads
from test_decoding import MARIAN, make_model, padded_source

isa = isa_fixture(ALL_ISA_LEVELS)


def two_caches(model, src, precision, K, steps):
    """A native and a Python cache over one encoder run, each with buffers of its own."""
    shared, src_pad = dec._encode_once(model, src, precision, {})
    native = dec.DecoderCache(model, shared, src_pad, K, steps)
    python = dec.DecoderCache(model, shared, src_pad, K, steps)
    return native, python


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("options", [dict(norm_first=False), dict(norm_first=True, activation="gelu"),
                                     dict(activation="silu", **MARIAN),
                                     dict(norm="scale", fix_norm=True), dict(norm="scale", norm_first=True)])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("threads, groups", [(1, 1), (2, 1), (2, 2), (3, 3), (2, 5)])
def test_native_step_has_the_bits_of_the_python_step(isa, options, precision, threads, groups):
    """Beam-search-shaped: rows dropped, reordered and sharing parents between steps, so rows read
    other rows' cache entries and the blocks of rows change from step to step."""
    model = make_model(seed=3, **options)
    V = model.cfg.tgt_vocab_size
    rng = np.random.default_rng(4)
    B, K, steps = 6, 3, 9
    src = padded_source(rng, 40, rng.integers(1, 10, size=B))
    with num_threads(threads):
        native, python = two_caches(model, src, precision, K, steps)
        native._groups = lambda n: max(1, min(groups, n // dec.MIN_GROUP_ROWS))   # blocks of the step
        n = B * K
        ids = rng.integers(0, V, size=n)
        chosen = np.full(n + 2, -1, np.int64)
        for t in range(steps):
            log_softmax = t % 2 == 1
            banned = (1, 5, V - 1)[:t % 4]
            chosen[:] = -1
            got = native.step(ids, t, log_softmax, banned, argmax_out=chosen)
            want = python._step_python(ids, t)
            if log_softmax:
                _C.log_softmax(want, want)
            want[:, list(banned)] = -np.inf
            assert same_bits(got, want), (t, np.abs(got - want).max())
            assert np.array_equal(chosen[:len(ids)], want.argmax(axis=1))
            assert (chosen[len(ids):] == -1).all()
            m = int(rng.integers(1, n + 1)) if t % 3 == 2 else n
            keep = np.sort(rng.choice(n, size=m, replace=False))
            parents = rng.integers(0, n, size=m)
            for cache in (native, python):
                cache.reorder(parents, t, keep if m < n else None)
            n, ids = m, rng.integers(0, V, size=m)


@pytest.mark.parametrize("groups", [1, 2])
def test_greedy_and_beam_search_give_the_same_tokens_split_by_rows_or_not(groups, restore_threads):
    model = make_model(seed=5)
    rng = np.random.default_rng(6)
    src = padded_source(rng, 40, rng.integers(1, 12, size=16))
    T.set_num_threads(2)
    before = dec.DECODE_GROUPS
    try:
        dec.DECODE_GROUPS = groups
        got = model.greedy_decode(src), model.beam_search(src, beam_size=3)
        dec.DECODE_GROUPS = 1
        T.set_num_threads(1)
        want = model.greedy_decode(src), model.beam_search(src, beam_size=3)
    finally:
        dec.DECODE_GROUPS = before
    assert got == want


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("threads, groups", [(1, 1), (2, 1), (2, 2), (3, 3), (2, 7)])
@pytest.mark.parametrize("max_len, min_len, no_repeat_ngram", [(None, 0, 0), (9, 3, 0), (None, 2, 2), (12, 0, 1)])
def test_greedy_loop_in_c_gives_the_tokens_of_the_loop_in_python(isa, precision, threads, groups, max_len, min_len,
                                                                no_repeat_ngram, monkeypatch):
    """decoder_greedy (every block of sentences to its end on its own thread) against
    _greedy_decode's step-by-step loop in Python (with the step in Python, as return_attention
    takes it, and in C), over sentences that stop at EOS or at limits of their own, in blocks of
    uneven sizes."""
    model = make_model(seed=1, vocab=12, max_len=40)    # EOS at steps 1 to 12, or never, at max_len None
    rng = np.random.default_rng(12)
    src = padded_source(rng, 12, rng.integers(1, 14, size=7))
    monkeypatch.setattr(dec, "DECODE_GROUPS", groups)
    monkeypatch.setattr(dec, "MIN_GROUP_ROWS", 1)
    args = dict(max_len=max_len, min_len=min_len, no_repeat_ngram=no_repeat_ngram, precision=precision)
    with num_threads(threads):
        got = model.greedy_decode(src, **args)
        want, _ = model.greedy_decode(src, return_attention=True, **args)   # the step in Python too
        monkeypatch.setattr(dec, "_PYTHON_LOOPS", True)
        also = model.greedy_decode(src, **args)
    assert got == want == also
    lengths = sorted({len(h) for h in got})
    assert len(lengths) > 2, lengths                           # sentences stop at different steps


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("threads, groups", [(1, 1), (2, 1), (2, 2), (3, 3), (2, 7)])
@pytest.mark.parametrize("K, max_len, min_len, no_repeat_ngram, length_penalty",
                         [(3, None, 0, 0, 0.6), (2, 9, 3, 0, 0.0), (4, None, 2, 2, 1.0), (3, 12, 0, 1, 0.6)])
def test_beam_loop_in_c_gives_the_tokens_of_the_loop_in_python(isa, precision, threads, groups, K, max_len, min_len,
                                                              no_repeat_ngram, length_penalty, monkeypatch):
    """decoder_beam against _beam_search's step-by-step loop in Python (the same step in C):
    sentences finishing at different steps, dropped from the batch, in blocks of uneven sizes."""
    model = make_model(seed=1, vocab=12, max_len=40)
    rng = np.random.default_rng(12)
    src = padded_source(rng, 12, rng.integers(1, 14, size=7))
    monkeypatch.setattr(dec, "DECODE_GROUPS", groups)
    monkeypatch.setattr(dec, "MIN_GROUP_ROWS", 1)
    args = dict(beam_size=K, max_len=max_len, min_len=min_len, no_repeat_ngram=no_repeat_ngram,
                length_penalty=length_penalty, precision=precision)
    with num_threads(threads):
        got = model.beam_search(src, **args)
        monkeypatch.setattr(dec, "_PYTHON_LOOPS", True)
        want = model.beam_search(src, **args)
    assert got == want
    assert len({len(h) for h in got}) > 2, got                 # sentences end at different steps


def test_beam_loop_in_c_ranks_the_finished_by_the_same_length_penalty(monkeypatch):
    """Sentences whose finished hypotheses of different lengths rank apart only by the length
    normalisation ((5 + t + 1) / 6) ** alpha: a step off in C changes 4 of these 24 sentences."""
    model = make_model(seed=5, vocab=20, max_len=40)
    rng = np.random.default_rng(12)
    src = padded_source(rng, 20, rng.integers(1, 14, size=24))
    got = model.beam_search(src, beam_size=4, length_penalty=4.0)
    monkeypatch.setattr(dec, "_PYTHON_LOOPS", True)
    assert got == model.beam_search(src, beam_size=4, length_penalty=4.0)


@pytest.mark.parametrize("python_loops", [False, True])
def test_beam_search_gives_nothing_for_a_sentence_with_no_finished_hypothesis(python_loops, monkeypatch):
    """NaN logits: beam search finishes no hypothesis (beam_select takes no candidate that is not
    finite), and the sentence decodes to nothing, not to a row of pads, in both loops."""
    model = make_model(seed=1, vocab=12, max_len=40)
    model.params.data["generator.weight"][:] = np.nan
    src = padded_source(np.random.default_rng(1), 12, [3, 5])
    monkeypatch.setattr(dec, "_PYTHON_LOOPS", python_loops)
    assert model.beam_search(src, beam_size=2) == [[], []]


def test_loop_blocks_take_every_sentence_once(monkeypatch):
    """Block k takes sentences k, k + groups, ...: with every block of one sentence per thread
    or of several, each sentence's tokens land in its own row, greedy and beam."""
    model = make_model(seed=13)
    rng = np.random.default_rng(14)
    src = padded_source(rng, 40, rng.integers(1, 10, size=10))
    monkeypatch.setattr(dec, "MIN_GROUP_ROWS", 1)
    want = [(model.greedy_decode(src[b:b + 1])[0], model.beam_search(src[b:b + 1], 3)[0]) for b in range(len(src))]
    for groups in (1, 3, 4, 10):
        monkeypatch.setattr(dec, "DECODE_GROUPS", groups)
        with num_threads(2):
            assert list(zip(model.greedy_decode(src), model.beam_search(src, 3))) == want, groups


def test_steps_are_split_by_rows_when_the_weights_are_small_or_the_rows_or_threads_many():
    tiny = T.ModelConfig(src_vocab_size=4000, tgt_vocab_size=4000, d_model=128, n_heads=4, d_ff=512,
                         n_encoder_layers=2, n_decoder_layers=2)
    base = T.ModelConfig(src_vocab_size=8000, tgt_vocab_size=8000)
    assert dec.step_groups(tiny, "fp32", 4, 32) == 4
    assert dec.step_groups(tiny, "int8", 2, 8) == 2
    assert dec.step_groups(tiny, "int8", 16, 32) == 8      # blocks of 4 rows at least
    assert dec.step_groups(tiny, "fp32", 1, 32) == 1
    assert dec.step_groups(tiny, "fp32", 2, 7) == 1
    # base: 38 MB of int8 (22 M int8 weights and the fp32 projection), 104 MB of fp32
    assert dec.step_groups(base, "fp32", 2, 8) == 1         # greedy B=8: kernels split
    assert dec.step_groups(base, "int8", 2, 8) == 1
    assert dec.step_groups(base, "int8", 2, 32) == 2        # beam 4: blocks of 16 rows
    assert dec.step_groups(base, "fp32", 2, 32) == 1        # ... not for 104 MB of fp32
    assert dec.step_groups(base, "fp32", 4, 8) == 4         # a team of 4 meeting per kernel costs more
    assert dec.step_groups(base, "int8", 16, 8) == 4        # blocks of 2 rows at least
    assert dec.step_groups(base, "int8", 16, 32) == 16
    opus = T.ModelConfig(src_vocab_size=58101, tgt_vocab_size=58101, activation="silu")
    assert dec.step_groups(opus, "fp32", 16, 32) == 1       # 207 MB a step: kernels split
    assert dec.step_groups(opus, "int8", 16, 32) == 16      # its projection quantized too: 52 MB


def native_cache():
    model = make_model(seed=7)
    src = padded_source(np.random.default_rng(8), 40, [3, 5])
    native, _ = two_caches(model, src, "fp32", 2, 6)
    return native._native, native


@pytest.mark.parametrize("change, match", [
    (dict(ids=np.array([0, 1, 2, 47], np.int64)), r"ids must be in \[0, 47\), got 47 at 3"),
    (dict(ids=np.array([0, -1], np.int64)), r"ids must be in \[0, 47\), got -1 at 1"),
    (dict(ids=np.zeros(5, np.int64)), r"ids must have at most N = 4 rows"),
    (dict(ids=np.zeros(4, np.int32)), r"ids must have dtype int64"),
    (dict(t=6), r"t must be in \[0, 6\), got 6"),
    (dict(t=-1), r"t must be in \[0, 6\), got -1"),
    (dict(slot=np.array([0, 1, 1, 3], np.int64)), r"slot must be distinct values in \[0, 4\), got 1 at 2"),
    (dict(slot=np.array([0, 1, 2, 4], np.int64)), r"slot must be distinct values in \[0, 4\), got 4 at 3"),
    (dict(sentence=np.array([0, 0, 1, 2], np.int64)), r"sentence must be in \[0, 2\), got 2 at 3"),
    (dict(origin=np.full((4, 6), 9, np.int64)), r"origin must be in \[0, 4\), got 9 at \(0, 0\)"),
    (dict(origin=np.zeros((4, 5), np.int64)), r"origin must be \[>= 4, 6\]"),
    (dict(groups=0), r"groups must be >= 1"),
    (dict(banned=(47,)), r"banned must hold token ids in \[0, 47\), got 47"),
    (dict(banned=[1]), r"banned must be a tuple"),
    (dict(argmax_out=np.zeros(3, np.int64)), r"argmax_out must have at least 4 entries"),
    (dict(argmax_out=np.zeros(4, np.float32)), r"argmax_out must have dtype int64"),
])
def test_bad_step_arguments_are_named(change, match):
    step, cache = native_cache()
    args = dict(ids=np.zeros(4, np.int64), t=1, slot=cache.slot, origin=cache.origin,
                sentence=cache.sentence, groups=1, banned=(), argmax_out=None)
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=match):
        step.step(args["ids"], args["t"], args["slot"], args["origin"], args["sentence"], args["groups"],
                  False, args["banned"], args["argmax_out"])


def test_a_step_after_the_instruction_set_changed_is_refused():
    if _C.best_isa() == "generic":
        pytest.skip("one instruction set only")
    step, cache = native_cache()
    try:
        _C.set_isa("generic")
        with pytest.raises(ValueError, match="prepare them again"):
            step.step(np.zeros(4, np.int64), 0, cache.slot, cache.origin, cache.sentence, 1)
    finally:
        _C.set_isa(_C.best_isa())


def test_overlapping_buffers_are_refused():
    model = make_model(seed=7)
    src = padded_source(np.random.default_rng(8), 40, [3, 5])
    cache, _ = two_caches(model, src, "fp32", 2, 6)
    layers = [dict(w, memory_k=k, memory_v=v, self_k=sk, self_v=sv) for w, k, v, sk, sv in
              zip(cache.layers, cache.memory_k, cache.memory_v, cache.self_k, cache.self_v)]
    buffers = dict(x=cache.x, h=cache.x, tmp=cache.tmp, ctx=cache.ctx, query=cache.query, qkv=cache.qkv,
                   ff_pre=cache.ff_pre, ff_act=cache.ff_act, logits=cache.logits, mean=cache.mean,
                   rstd=cache.rstd)
    with pytest.raises(ValueError, match="must not overlap"):
        _C.DecoderStep(layers, cache.generator, cache.final_norm, cache.embed, cache.embed_scale, cache.pe,
                       cache.src_pad, buffers, model.cfg.n_heads, model.cfg.activation, model.cfg.norm_first)
    buffers["h"] = cache.h
    for change, match in ((dict(rstd=None), r"buffers\['rstd'\] must be a numpy.ndarray"),
                          (dict(qkv=cache.qkv[:, :64]), r"buffers\['qkv'\] must be C-contiguous"),
                          (dict(qkv=np.zeros((4, 64), np.float32)), r"buffers\['qkv'\] must have shape \(4, 96\)")):
        with pytest.raises((ValueError, TypeError), match=match):
            _C.DecoderStep(layers, cache.generator, cache.final_norm, cache.embed, cache.embed_scale, cache.pe,
                           cache.src_pad, dict(buffers, **change), model.cfg.n_heads, model.cfg.activation,
                           model.cfg.norm_first)
    without = dict(buffers)
    del without["mean"]
    with pytest.raises(ValueError, match=r"buffers must hold 'mean'"):
        _C.DecoderStep(layers, cache.generator, cache.final_norm, cache.embed, cache.embed_scale, cache.pe,
                       cache.src_pad, without, model.cfg.n_heads, model.cfg.activation, model.cfg.norm_first)
    layers[1]["qkv"] = layers[0]["linear1"]
    with pytest.raises(ValueError, match=r"layers\[1\]\['qkv'\] must be \[96, 32\] weights, got \[48, 32\]"):
        _C.DecoderStep(layers, cache.generator, cache.final_norm, cache.embed, cache.embed_scale, cache.pe,
                       cache.src_pad, buffers, model.cfg.n_heads, model.cfg.activation, model.cfg.norm_first)


def test_bans_and_argmax_over_a_big_vocabulary_split_across_threads(restore_threads):
    """One block of rows (groups 1) with n x V past the tail's grain: the bans and argmax run over
    rows in parallel (csrc/decoder.c), with the bits and choices of the Python step."""
    model = make_model(seed=9, vocab=30000)
    V = model.cfg.tgt_vocab_size
    rng = np.random.default_rng(10)
    src = padded_source(rng, 40, rng.integers(1, 10, size=24))
    T.set_num_threads(2)
    native, python = two_caches(model, src, "fp32", 1, 4)
    native._groups = lambda n: 1
    chosen = np.empty(24, np.int64)
    ids = rng.integers(0, V, size=24)
    for t in range(4):
        got = native.step(ids, t, t % 2 == 1, (0, 2, V - 1), argmax_out=chosen)
        want = python._step_python(ids, t)
        if t % 2:
            _C.log_softmax(want, want)
        want[:, [0, 2, V - 1]] = -np.inf
        assert same_bits(got, want)
        assert np.array_equal(chosen, want.argmax(axis=1))
        ids = chosen.copy()


def argmax_cases():
    """Rows whose argmax a vectorised search could get wrong: ties (the first wins), -0 before +0,
    infinities, NaNs (the first wins, wherever the maximum is), a NaN past a greater value, every
    length around a vector's 8 and 16 lanes, and the maximum in the tail after the last whole vector."""
    rng = np.random.default_rng(7)
    rows = []
    for V in (1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 100, 4000, 4001):
        x = rng.standard_normal(V).astype(np.float32)
        rows.append(x.copy())
        for where in {0, V // 2, V - 1}:
            y = x.copy(); y[where] = 9.0; rows.append(y)                      # a single peak
            y = x.copy(); y[where] = 9.0; y[V - 1 - where] = 9.0; rows.append(y)   # a tie
            y = x.copy(); y[where] = np.nan; rows.append(y)
            y = x.copy(); y[where] = np.inf; rows.append(y)
            y = np.full(V, -np.inf, np.float32); y[where] = -1e30; rows.append(y)
        rows.append(np.full(V, -np.inf, np.float32))
        y = np.zeros(V, np.float32); y[:: 2] = -0.0; rows.append(y)          # -0 and +0 tie
        if V > 3:
            y = x.copy(); y[1] = 50.0; y[V - 1] = np.nan; y[V - 2] = np.nan; rows.append(y)
    return rows


def test_argmax_rows_is_numpys_argmax(isa):
    """The step's argmax (greedy decoding's choice) against numpy's, and the one-element-at-a-time
    definition, on rows built to trip a vectorised search."""
    for x in argmax_cases():
        row = x[None, :]
        want = int(np.argmax(x))
        assert _C.argmax_rows(row)[0] == want, (isa, x.size, want)
        assert _C.argmax_rows(row, reference=True)[0] == want
    many = np.random.default_rng(8).standard_normal((5, 37)).astype(np.float32)
    assert np.array_equal(_C.argmax_rows(many), many.argmax(axis=1))
    assert _C.argmax_rows(np.zeros((0, 4), np.float32)).shape == (0,)


def test_argmax_rows_checks_its_argument():
    with pytest.raises(TypeError, match="x must have dtype float32"):
        _C.argmax_rows(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="x must be 2-D"):
        _C.argmax_rows(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        _C.argmax_rows(np.zeros((3, 4), np.float32)[:, ::2])


def greedy_cache(K=1):
    model = make_model(seed=7)
    src = padded_source(np.random.default_rng(8), 40, [3, 5])
    native, _ = two_caches(model, src, "fp32", K, 6)
    return native._native


@pytest.mark.parametrize("change, match", [
    (dict(limits=np.array([3, 7], np.int64)), r"limits must be in \[1, 6\], got 3 .. 7"),
    (dict(limits=np.array([0, 2], np.int64)), r"limits must be in \[1, 6\], got 0 .. 2"),
    (dict(limits=np.array([3], np.int64)), r"limits must have B = 2 entries, got 1"),
    (dict(limits=np.array([3, 3], np.int32)), r"limits must have dtype int64"),
    (dict(min_len=-1), r"min_len must be an int >= 0, got -1"),
    (dict(ngram=True), r"ngram must be an int >= 0, got True"),
    (dict(bos=47), r"bos must be a token id in \[0, 47\), got 47"),
    (dict(eos=-1), r"eos must be a token id in \[0, 47\), got -1"),
    (dict(pad=None), r"pad must be a token id in \[0, 47\), got None"),
    (dict(groups=0), r"groups must be >= 1, got 0"),
])
def test_bad_greedy_arguments_are_named(change, match):
    args = dict(limits=np.array([3, 6], np.int64), min_len=0, ngram=0, bos=1, eos=2, pad=0, groups=1)
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=match):
        greedy_cache().greedy(**args)


def test_greedy_loop_refuses_several_rows_a_sentence():
    with pytest.raises(ValueError, match=r"one row per sentence: N = 4 rows for B = 2"):
        greedy_cache(K=2).greedy(np.array([3, 6], np.int64))


@pytest.mark.parametrize("change, match", [
    (dict(K=3), r"K must be the rows a sentence: N = 4 rows for B = 2, got K = 3"),
    (dict(K=0), r"K must be the rows a sentence"),
    (dict(length_penalty=-0.5), r"length_penalty must be finite and >= 0, got -0.5"),
    (dict(length_penalty=float("nan")), r"length_penalty must be finite and >= 0, got nan"),
    (dict(limits=np.array([3, 9], np.int64)), r"limits must be in \[1, 6\], got 3 .. 9"),
    (dict(eos=47), r"eos must be a token id in \[0, 47\), got 47"),
    (dict(ngram=-2), r"ngram must be an int >= 0, got -2"),
    (dict(groups=0), r"groups must be >= 1, got 0"),
])
def test_bad_beam_arguments_are_named(change, match):
    args = dict(limits=np.array([3, 6], np.int64), K=2, length_penalty=0.6, min_len=0, ngram=0, bos=1, eos=2,
                pad=0, groups=1)
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=match):
        greedy_cache(K=2).beam(**args)


class Stop(Exception):
    pass


@pytest.mark.parametrize("search", ["greedy", "beam"])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_signal_stops_the_loop_in_c_within_steps(search, threads, monkeypatch):
    """What a signal handler raises (Ctrl-C's KeyboardInterrupt, here a SIGALRM's Stop) stops the
    loop in C between two steps and reaches the caller, as it did between two steps of the loop
    in Python, instead of after the whole batch; the model decodes as before afterwards."""
    import signal
    import time
    cfg = T.ModelConfig(src_vocab_size=500, tgt_vocab_size=500, d_model=64, n_heads=4, d_ff=128,
                        n_encoder_layers=1, n_decoder_layers=2, max_len=600)
    model = T.Seq2SeqTransformer(cfg, seed=3)
    src = padded_source(np.random.default_rng(4), 500, [12] * 32)
    monkeypatch.setattr(dec, "MIN_GROUP_ROWS", 1)
    decode = (lambda: model.greedy_decode(src, max_len=600, min_len=600)) if search == "greedy" else \
        (lambda: model.beam_search(src, beam_size=4, max_len=300, min_len=300))

    def handler(signum, frame):
        raise Stop

    before = signal.signal(signal.SIGALRM, handler)
    try:
        with num_threads(threads):
            start = time.perf_counter()
            want = decode()
            whole = time.perf_counter() - start
            signal.setitimer(signal.ITIMER_REAL, whole / 10)
            start = time.perf_counter()
            with pytest.raises(Stop):
                decode()
            stopped = time.perf_counter() - start
            assert stopped < whole / 2, (stopped, whole)
            assert decode() == want
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_a_signal_stops_the_other_blocks_after_the_calling_threads_block_is_done(search, monkeypatch):
    """The calling thread is the one that asks for signals. Its block here (the even sentences,
    one-token sources, limits of 12 tokens) is done within a few steps, while the other block
    (long sources, limits of 600 tokens) runs on: the calling thread goes on asking, so a signal
    still stops that block between two of its steps instead of after the whole batch."""
    import signal
    import time
    cfg = T.ModelConfig(src_vocab_size=500, tgt_vocab_size=500, d_model=64, n_heads=4, d_ff=128,
                        n_encoder_layers=1, n_decoder_layers=2, max_len=600)
    model = T.Seq2SeqTransformer(cfg, seed=3)
    long = (cfg.max_len - dec.MAX_LEN_B) // dec.MAX_LEN_A
    src = padded_source(np.random.default_rng(4), 500, [1, long] * 4)   # block k: sentences k, k + 2, ...
    monkeypatch.setattr(dec, "DECODE_GROUPS", 2)
    decode = (lambda: model.greedy_decode(src, min_len=cfg.max_len)) if search == "greedy" else \
        (lambda: model.beam_search(src, beam_size=4, min_len=cfg.max_len))

    def handler(signum, frame):
        raise Stop

    def seconds(fn):
        start = time.perf_counter()
        result = fn()
        return time.perf_counter() - start, result

    before = signal.signal(signal.SIGALRM, handler)
    try:
        with num_threads(2):
            seconds(decode)
            first, _ = min(seconds(lambda: model.greedy_decode(src, max_len=1)) for _ in range(3))
            whole, want = seconds(decode)
            assert [len(h) for h in want[:2]] == [dec.MAX_LEN_A + dec.MAX_LEN_B, cfg.max_len]
            loop = whole - first    # the loop in C, past the encoder and its first step
            signal.setitimer(signal.ITIMER_REAL, first + loop / 5)
            start = time.perf_counter()
            with pytest.raises(Stop):
                decode()
            stopped = time.perf_counter() - start
            assert stopped < first + loop * 0.6, (stopped, first, whole)
            assert decode() == want
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
