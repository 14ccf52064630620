"""Iteration-level batching (transformer/streaming.py, csrc/stream.c) against the decoding calls:
every sentence of a wave that joined a running batch at any step gets the tokens greedy_decode or
beam_search give it, alone or in its offline batch."""
import numpy as np
import pytest

import transformer as T
from transformer import decoding
from transformer.streaming import DecodingStream, NoRoom, workspace_bytes

from test_decoding import MARIAN, make_model


def _pieces(rng, vocab, n, longest=9):
    return [rng.integers(3, vocab, size=int(rng.integers(1, longest + 1))).tolist() for _ in range(n)]


def _offline(model, pieces, beam, precision, ngram=0, max_len=None):
    """Each piece decoded alone, as translate would (batch of one)."""
    out = []
    for ids in pieces:
        src = np.array([ids], np.int64)
        if beam > 1:
            out.append(model.beam_search(src, beam_size=beam, precision=precision, no_repeat_ngram=ngram,
                                         max_len=max_len)[0])
        else:
            out.append(model.greedy_decode(src, precision=precision, no_repeat_ngram=ngram, max_len=max_len)[0])
    return out


def _drive(stream, waves, joins, max_steps=1):
    """Adds waves[i] (pieces, beam, ngram) after joins[i] runs of max_steps, runs to the end;
    returns {tag: tokens}."""
    got, runs, pending = {}, 0, list(zip(joins, waves))
    while pending or any(w.live for w in stream.waves):
        while pending and pending[0][0] <= runs:
            _, (tag0, pieces, beam, ngram) = pending.pop(0)
            stream.add(pieces, [(tag0, i) for i in range(len(pieces))], beam=beam, no_repeat_ngram=ngram)
        for tag, tokens in stream.run(max_steps=max_steps):
            assert tag not in got and tokens is not None, f"{tag} returned twice, or as cancelled"
            got[tag] = tokens
        runs += 1
    return got


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("options", [dict(), dict(norm_first=True, activation="gelu"),
                                     dict(activation="silu", **MARIAN)], ids=["post-ln", "pre-ln", "marian"])
def test_waves_that_join_at_any_step_get_the_tokens_of_their_sentences_decoded_alone(precision, options):
    model = make_model(seed=3, **options)
    rng = np.random.default_rng(5)
    vocab = model.cfg.src_vocab_size
    waves = [(w, _pieces(rng, vocab, int(rng.integers(1, 5))), beam, ngram)
             for w, (beam, ngram) in enumerate([(1, 0), (3, 0), (1, 2), (2, 0), (3, 2), (1, 0), (4, 0)])]
    joins = [0, 0, 1, 3, 4, 9, 10]
    stream = DecodingStream(model, precision, rows=64)
    got = _drive(stream, waves, joins)
    for tag, pieces, beam, ngram in waves:
        expected = _offline(model, pieces, beam, precision, ngram)
        assert [got[(tag, i)] for i in range(len(pieces))] == expected, (tag, beam, ngram)
    assert not stream.waves


def test_a_sentence_gets_the_tokens_of_its_offline_batch_with_rows_split_across_threads(monkeypatch):
    """Blocks of rows (one per thread) cut waves anywhere: the tokens do not move."""
    monkeypatch.setattr(decoding, "DECODE_GROUPS", 3)
    model = make_model(seed=4)
    rng = np.random.default_rng(6)
    batch = _pieces(rng, model.cfg.src_vocab_size, 7)
    src = np.zeros((len(batch), max(map(len, batch))), np.int64)
    for row, ids in enumerate(batch):
        src[row, :len(ids)] = ids
    for beam in (1, 3):
        expected = model.beam_search(src, beam_size=beam) if beam > 1 else model.greedy_decode(src)
        stream = DecodingStream(model, rows=64)
        waves = [(0, batch[:3], beam, 0), (1, batch[3:4], beam, 0), (2, batch[4:], beam, 0)]
        got = _drive(stream, waves, [0, 2, 3])
        order = [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (2, 1), (2, 2)]
        assert [got[tag] for tag in order] == expected


def test_run_returns_when_a_sentence_finishes_or_a_wave_arrives():
    model = make_model(seed=3)
    stream = DecodingStream(model, rows=16)
    stream.add([[5, 6, 7, 8]], ["long"], beam=1, max_len=20)
    stream.arrived[0] = 1
    assert stream.run(max_steps=50) == []            # one step, then back: a wave is waiting
    assert stream.waves[0].loop.rows == 1
    stream.arrived[0] = 0
    stream.add([[9]], ["short"], beam=1, max_len=2)
    done = {}
    while stream.waves:
        finished = stream.run(max_steps=50)
        assert finished or not stream.waves          # back only when something finished
        done.update(finished)
    assert done == {"long": model.greedy_decode(np.array([[5, 6, 7, 8]]), max_len=20)[0],
                    "short": model.greedy_decode(np.array([[9]]), max_len=2)[0]}


def test_a_cancelled_sentence_leaves_and_is_never_returned_while_the_others_go_on():
    model = make_model(seed=3)
    rng = np.random.default_rng(8)
    pieces = _pieces(rng, model.cfg.src_vocab_size, 4)
    for beam in (1, 2):
        stream = DecodingStream(model, rows=32)
        waves = stream.add(pieces, list(range(4)), beam=beam, max_len=12)
        stream.run(max_steps=1)
        wave = next(w for w in waves if 1 in w.tags)
        wave.cancel(wave.tags.index(1))
        got = {}
        while stream.waves:
            got.update(stream.run(max_steps=1))
        assert got.pop(1) is None                  # it left: no tokens
        expected = _offline(model, pieces, beam, "fp32", max_len=12)
        assert {i: got[i] for i in (0, 2, 3)} == {i: expected[i] for i in (0, 2, 3)}


def test_a_wave_past_the_streams_rows_is_refused_naming_them():
    model = make_model(seed=3)
    stream = DecodingStream(model, rows=5)
    stream.add([[4, 5]] * 2, ["a", "b"], beam=2)
    with pytest.raises(ValueError, match="a wave of 2 rows does not fit: 4 of 5 in use"):
        stream.add([[4, 5]], ["c"], beam=2)
    with pytest.raises(ValueError, match="rows must be an int >= 1"):
        DecodingStream(model, rows=0)


def test_waves_of_two_models_are_refused_in_one_stream():
    one, other = make_model(seed=3), make_model(seed=4)
    stream = DecodingStream(one, rows=8)
    stream.add([[4, 5]], ["a"])
    foreign, = DecodingStream(other, rows=8).add([[4, 5]], ["b"])
    stream.waves.append(foreign)
    with pytest.raises(ValueError, match="same prepared weights"):
        stream.run()


def test_the_c_stream_checks_its_arguments():
    model = make_model(seed=3)
    stream = DecodingStream(model, rows=8)
    with pytest.raises(TypeError, match=r"waves\[0\] must be a wave from DecoderStep.wave"):
        stream._stream.run(["not a wave"], 1)
    with pytest.raises(TypeError, match="arrived must have dtype int32"):
        stream._stream.run([], 1, np.zeros(1, np.int64))
    with pytest.raises(ValueError, match="buffers must hold 'x'"):
        T._C.DecoderStream({}, 4)


def test_the_workspaces_kept_for_later_waves_stay_bounded():
    """Twenty one-sentence waves in flight: twenty workspaces while they decode, then no more
    than twice the biggest kept (not one per wave ever seen)."""
    model = make_model(seed=3)
    stream = DecodingStream(model, rows=32)
    for i in range(20):
        stream.add([[4 + i % 20, 5]], [i], beam=1, max_len=6)
    got = {}
    while stream.waves:
        got.update(stream.run())
    assert len(got) == 20
    sizes = [sum(a.nbytes for a in ws.values() if isinstance(a, np.ndarray)) for ws in stream._spare_workspaces]
    assert 1 <= len(sizes) <= 2 and sum(sizes) <= 2 * max(sizes)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("n, longest, beam", [(1, 3, 1), (1, 9, 4), (6, 9, 1), (6, 9, 3), (12, 20, 2)])
def test_a_wave_is_admitted_as_no_less_than_its_workspace_holds(precision, n, longest, beam):
    """The oracle: the arrays a wave's workspace holds once it is made (encoder output, caches,
    step tables), against the bytes the stream admitted it as (wave_bytes)."""
    model = make_model(seed=3, max_len=48)
    rng = np.random.default_rng(n + longest + beam)
    stream = DecodingStream(model, precision, rows=64)
    waves = stream.add(_pieces(rng, model.cfg.src_vocab_size, n, longest), list(range(n)), beam=beam)
    for wave in waves:
        assert workspace_bytes(wave.workspace) <= wave.nbytes, (workspace_bytes(wave.workspace), wave.nbytes)
    assert stream.held() == sum(wave.nbytes for wave in waves) + stream._prepared.nbytes()


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_what_a_stream_holds_counts_what_numpy_gave_it(precision):
    """The oracle: tracemalloc sees numpy's allocations. From before the stream is made to after
    its waves have finished, it grew by its step buffers, its spare workspaces, its prepared
    weights and the model's workspace (13-31 MB here, each part 0.4 MB or more), all counted but
    a fixed 45-80 KB of Python objects and small arrays: a part left out would show."""
    import tracemalloc

    from transformer.streaming import stream_row_bytes

    model = T.Seq2SeqTransformer(T.ModelConfig(src_vocab_size=100, tgt_vocab_size=100, d_model=128, n_heads=2,
                                               d_ff=512, n_encoder_layers=2, n_decoder_layers=2, max_len=96), seed=3)
    model.params.freeze()
    rng = np.random.default_rng(7)
    workspace = model.ws.nbytes()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        stream = DecodingStream(model, precision, rows=256)
        for n in (20, 20):
            stream.add(_pieces(rng, model.cfg.src_vocab_size, n, longest=30), list(range(n)), beam=2)
        while stream.waves:
            stream.run()
        grew = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    parts = [stream._prepared.nbytes(), sum(map(workspace_bytes, stream._spare_workspaces)), model.ws.nbytes() - workspace,
             256 * stream_row_bytes(model.cfg)]
    assert min(parts) > 256 << 10, parts
    counted = stream.held() + parts[2] + parts[3]
    assert grew - (128 << 10) <= counted <= grew, (grew, counted)


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_encoding_a_wave_grows_the_models_workspace_by_no_more_than_encoder_bytes(wide, precision):
    from transformer.streaming import encoder_bytes

    rng = np.random.default_rng(11)
    for n, longest in [(1, 4), (5, 12), (16, 30), (40, 45)]:
        model = make_model(seed=3, max_len=64) if not wide else T.Seq2SeqTransformer(T.ModelConfig(
            src_vocab_size=100, tgt_vocab_size=100, d_model=128, n_heads=2, d_ff=512, n_encoder_layers=3,
            n_decoder_layers=3, max_len=64), seed=3)
        stream = DecodingStream(model, precision, rows=256)
        pieces = _pieces(rng, model.cfg.src_vocab_size, n, longest)
        pieces[0] = pieces[0] + [5] * (longest - len(pieces[0]))        # the padded width is `longest`
        stream.add(pieces, list(range(n)), beam=1)
        assert 0 < model.ws.nbytes() <= encoder_bytes(model.cfg, n, longest), (n, longest)


def test_a_wave_past_the_room_is_refused_before_anything_is_made_and_spares_give_way():
    model = make_model(seed=3, max_len=48)
    stream = DecodingStream(model, rows=64)
    pieces = [[4, 5, 6, 7]] * 3
    first, = stream.add(pieces, ["a", "b", "c"], beam=2)
    with pytest.raises(NoRoom, match=r"^3 sentences at beam 2 would take \d+ KiB for their decoding, more than the "
                                     r"\d+ KiB left$") as refused:
        stream.add(pieces, ["d", "e", "f"], beam=2, room=first.nbytes - 1)
    need = refused.value.need          # its caches, and the encoder's bound past the workspace grown
    assert need >= first.nbytes and len(stream.waves) == 1 and stream.rows_in_use() == 6
    with pytest.raises(NoRoom):
        stream.add(pieces, ["d", "e", "f"], beam=2, room=need - 1)
    while stream.waves:
        stream.run()
    spare = sum(map(workspace_bytes, stream._spare_workspaces))
    assert spare > 0 and stream.held() == spare + stream._prepared.nbytes()
    # the spare workspace counts as room: it is let go when the wave needs it
    again, = stream.add(pieces, ["g", "h", "i"], beam=2, room=need - spare)
    assert stream._spare_workspaces == [] and stream.held() == again.nbytes + stream._prepared.nbytes()
    with pytest.raises(NoRoom):
        stream.add(pieces, ["j", "k", "l"], beam=2, room=0)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_a_sentences_encoder_output_has_the_same_bits_alone_and_in_any_batch(precision):
    """What makes a translation independent of its batch: the encoder's output and the
    cross-attention keys and values of a sentence, alone (few rows: gemm's dot path, unless
    decoding.rows_apart) and padded among others, bit for bit. d_model 64 and one head: every
    product long enough in K for the dot path."""
    cfg = T.ModelConfig(src_vocab_size=50, tgt_vocab_size=57, d_model=64, n_heads=1, d_ff=96, n_encoder_layers=2,
                        n_decoder_layers=2, dropout=0.1, max_len=40)
    model = T.Seq2SeqTransformer(cfg, seed=5)
    rng = np.random.default_rng(9)
    sentence = rng.integers(3, 50, size=7).tolist()
    batch = np.zeros((6, 20), np.int64)
    for row in range(6):
        n = int(rng.integers(5, 21))
        batch[row, :n] = rng.integers(3, 50, size=n)
    batch[3] = 0
    batch[3, :7] = sentence
    alone = np.array([sentence], np.int64)
    got = {}
    for name, src in (("alone", alone), ("batch", batch)):
        ws = {}
        shared, _ = decoding._encode_once(model, src, precision, ws)
        row = 0 if name == "alone" else 3
        got[name] = [k[row, :, :7].copy() for k in shared.memory_k] + [v[row, :, :7].copy() for v in shared.memory_v]
    assert all(np.array_equal(a, b) for a, b in zip(got["alone"], got["batch"]))
    # and without rows_apart, the dot path differs: where there is one, the AVX-512 levels' fp32
    # GEMM (csrc/gemm/dispatch.c); below them every product packs its rows, whatever the batch
    if precision == "fp32" and T._C.isa() in ("avx512", "avx512_vnni", "avx512_bf16", "amx"):
        was = T._C.gemm_rows_apart(False)
        try:
            mem_alone = model._encode(alone, "fp32", None)
            mem_batch = model._encode(batch, "fp32", None)
        finally:
            T._C.gemm_rows_apart(was)
        assert not np.array_equal(mem_alone[0], mem_batch[3, :7])
