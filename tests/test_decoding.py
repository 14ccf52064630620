"""Autoregressive decoding with the key/value cache against full recomputation and exhaustive search."""
import itertools

import numpy as np
import pytest

import transformer as T

from conftest import unit_embeddings


# MarianMT's options (ModelConfig): decoding starts from the pad token, one tied matrix
MARIAN = dict(positions="split", tie_embeddings="all", final_norm=False, bos_id=0)


def make_model(norm_first=False, activation="relu", vocab=40, seed=1, max_len=24, layers=2, **options):
    cfg = T.ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab + (0 if options else 7), d_model=32,
                        n_heads=4, d_ff=48, n_encoder_layers=layers, n_decoder_layers=layers,
                        dropout=0.1, **{"activation": activation, "norm_first": norm_first,
                                        "max_len": max_len, **options})
    return unit_embeddings(T.Seq2SeqTransformer(cfg, seed=seed))


def padded_source(rng, vocab, lengths):
    src = np.zeros((len(lengths), max(lengths)), dtype=np.int64)
    for row, n in enumerate(lengths):
        src[row, :n] = rng.integers(3, vocab, size=n)
    return src


def recompute_greedy(model, src, steps, min_len=0, no_repeat_ngram=0):
    """Greedy decoding the slow way: the whole prefix through model.forward at every step.
    steps: one limit for every sentence, or a list of each sentence's own."""
    cfg = model.cfg
    limits = [steps] * len(src) if isinstance(steps, int) else list(steps)
    ys = np.full((src.shape[0], 1), cfg.bos_id, dtype=np.int64)
    for t in range(max(limits)):
        logits = model.forward(src, ys)[:, -1].astype(np.float64)
        logits[:, [cfg.pad_id, cfg.bos_id]] = -np.inf     # decoding never emits padding or BOS
        for row in range(len(src)):
            ban_repeats(logits[row], ys[row].tolist(), no_repeat_ngram, cfg.eos_id)
        if t < min_len:
            forbid_eos(logits, cfg.eos_id, no_repeat_ngram)
        ys = np.concatenate([ys, logits.argmax(1)[:, None]], axis=1)
    return [T_cut(row[1:1 + limit], cfg.eos_id) for row, limit in zip(ys.tolist(), limits)]


def T_cut(tokens, eos):
    return tokens[:tokens.index(eos)] if eos in tokens else tokens


def banned_ngram_tokens(prefix, n):
    """Hugging Face's no_repeat_ngram_size rule (NoRepeatNGramLogitsProcessor) on one hypothesis,
    the start token included as in its generate: the last token of every n-gram whose first n-1
    tokens equal the hypothesis' last n-1."""
    if n == 0 or len(prefix) + 1 < n:
        return set()
    grams = {}
    for gram in zip(*[prefix[i:] for i in range(n)]):
        grams.setdefault(gram[:-1], set()).add(gram[-1])
    return grams.get(tuple(prefix[len(prefix) - n + 1:]), set())


def ban_repeats(scores, prefix, n, eos):
    """-inf for the tokens banned_ngram_tokens names, EOS excepted (a hypothesis can always end)."""
    for token in banned_ngram_tokens(prefix, n) - {eos}:
        scores[token] = -np.inf


def forbid_eos(scores, eos, no_repeat_ngram):
    """EOS -inf before min_len; with no_repeat_ngram, not in a row that has nothing else left."""
    others = np.delete(scores, eos, axis=1)
    stuck = ~(others > -np.inf).any(axis=1) if no_repeat_ngram else np.zeros(len(scores), bool)
    scores[~stuck, eos] = -np.inf


def repeats_an_ngram(tokens, n):
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


def own_limits(model, src, a=2, b=10):
    """Each sentence's default length limit: min(a * non-pad source tokens + b, the model's max_len)."""
    return [min(a * int((row != model.cfg.pad_id).sum()) + b, model.cfg.max_len) for row in src]


@pytest.mark.parametrize("norm_first, activation, options", [
    (False, "relu", {}), (True, "gelu", {}), (False, "silu", MARIAN),
    (True, "silu", dict(tie_embeddings="target", scale_embedding=False))])
def test_cached_greedy_gives_exactly_the_tokens_of_full_recomputation(norm_first, activation, options):
    model = make_model(norm_first, activation, **options)
    src = padded_source(np.random.default_rng(0), 40, [9, 5, 7, 1, 8])
    for min_len in (0, 10):
        got = model.greedy_decode(src, max_len=10, min_len=min_len)
        assert got == recompute_greedy(model, src, 10, min_len)


def recompute_beam(model, src_row, K, max_len, length_penalty, min_len=0, no_repeat_ngram=0):
    """Beam search the slow way for one sentence: every live hypothesis's whole prefix through
    model.forward at every step, log-probabilities in float64, candidates ranked by score then
    (beam, token); EOS finishes a hypothesis, the sentence is done at K finished or max_len.
    no_repeat_ngram bans each beam's repeats after the log-softmax."""
    cfg = model.cfg
    V, eos = cfg.tgt_vocab_size, cfg.eos_id
    beams = [([], 0.0)]
    finished = []
    for t in range(max_len):
        ys = np.array([[cfg.bos_id] + tokens for tokens, _ in beams])
        logits = model.forward(np.repeat(src_row[None], len(beams), 0), ys)[:, -1].astype(np.float64)
        logp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
        logp[:, [cfg.pad_id, cfg.bos_id]] = -np.inf       # never emitted (after normalising, as generate)
        for b, (tokens, _) in enumerate(beams):
            ban_repeats(logp[b], [cfg.bos_id] + tokens, no_repeat_ngram, eos)
        if t < min_len:
            forbid_eos(logp, eos, no_repeat_ngram)
        ranked = sorted(((score + logp[b, v], b * V + v) for b, (_, score) in enumerate(beams) for v in range(V)),
                        key=lambda c: (-c[0], c[1]))[:min(2 * K, K * V)]
        next_beams = []
        for rank, (score, candidate) in enumerate(ranked):
            if not np.isfinite(score):
                break
            b, v = divmod(candidate, V)
            if v == eos and t < max_len - 1 and rank >= K:
                continue                                   # only the K best can be final
            if v == eos or t == max_len - 1:
                finished.append((score / ((5.0 + t + 1) / 6.0) ** length_penalty,
                                 beams[b][0] + ([] if v == eos else [v])))
                if len(finished) >= K:
                    break
                continue
            next_beams.append((beams[b][0] + [v], score))
            if len(next_beams) == K:
                break
        if len(finished) >= K or not next_beams:
            break
        beams = next_beams
    return max(finished, key=lambda f: f[0])[1] if finished else []


# Seeds and EOS biases picked so that hypotheses end at different lengths (some at max_len).
@pytest.mark.parametrize("norm_first, K, seed, eos_bias, length_penalty, min_len", [
    (False, 3, 0, 1.0, 0.6, 0), (False, 3, 2, 1.0, 1.0, 0), (True, 4, 1, 1.0, 0.6, 0), (False, 1, 2, 1.0, 0.0, 0),
    (True, 2, 0, 1.0, 0.6, 0), (True, 2, 2, 0.0, 0.6, 2), (False, 5, 1, 0.5, 0.6, 3)])
def test_cached_beam_search_gives_the_hypothesis_of_full_recomputation(norm_first, K, seed, eos_bias,
                                                                      length_penalty, min_len):
    model = make_model(norm_first, seed=seed)
    model.params.data["generator.bias"][model.cfg.eos_id] += eos_bias
    src = padded_source(np.random.default_rng(K), 40, [5, 2, 7, 4])
    got = model.beam_search(src, beam_size=K, max_len=8, length_penalty=length_penalty, min_len=min_len)
    want = [recompute_beam(model, src[row, :max(1, int((src[row] != 0).sum()))], K, 8, length_penalty, min_len)
            for row in range(len(src))]
    print(got, want)
    assert got == want


@pytest.mark.parametrize("K", [1, 3])
def test_cached_beam_search_with_marian_options_gives_the_hypothesis_of_full_recomputation(K):
    model = make_model(activation="silu", seed=2, **MARIAN)
    model.params.data["generator.bias"][model.cfg.eos_id] += 1.0
    src = padded_source(np.random.default_rng(K), 40, [5, 2, 7, 4])
    got = model.beam_search(src, beam_size=K, max_len=8, length_penalty=0.6)
    want = [recompute_beam(model, src[row, :int((src[row] != 0).sum())], K, 8, 0.6) for row in range(len(src))]
    assert got == want


@pytest.mark.parametrize("norm_first, no_repeat_ngram, min_len", [
    (False, 1, 0), (False, 2, 0), (True, 2, 6), (False, 3, 0), (True, 4, 0), (False, 3, 12)])
def test_greedy_with_no_repeat_ngram_gives_the_tokens_of_full_recomputation(norm_first, no_repeat_ngram, min_len):
    # An untrained model repeats itself, so the guard changes the output here.
    model = make_model(norm_first, seed=3, max_len=24)
    src = padded_source(np.random.default_rng(1), 40, [9, 5, 7, 1, 8])
    plain = model.greedy_decode(src, max_len=16, min_len=min_len)
    assert any(repeats_an_ngram(h, no_repeat_ngram) for h in plain)
    got = model.greedy_decode(src, max_len=16, min_len=min_len, no_repeat_ngram=no_repeat_ngram)
    assert got == recompute_greedy(model, src, 16, min_len, no_repeat_ngram)
    assert not any(repeats_an_ngram(h, no_repeat_ngram) for h in got)
    assert got != plain


@pytest.mark.parametrize("K, no_repeat_ngram, min_len", [(1, 2, 0), (3, 1, 0), (3, 2, 0), (4, 3, 3), (2, 2, 10)])
def test_beam_search_with_no_repeat_ngram_gives_the_hypothesis_of_full_recomputation(K, no_repeat_ngram, min_len):
    model = make_model(seed=3)
    model.params.data["generator.bias"][model.cfg.eos_id] -= 1.0     # long hypotheses: more to repeat
    src = padded_source(np.random.default_rng(K), 40, [5, 2, 7, 4])
    plain = model.beam_search(src, beam_size=K, max_len=12, min_len=min_len)
    got = model.beam_search(src, beam_size=K, max_len=12, min_len=min_len, no_repeat_ngram=no_repeat_ngram)
    want = [recompute_beam(model, src[row, :max(1, int((src[row] != 0).sum()))], K, 12, 0.6, min_len,
                           no_repeat_ngram) for row in range(len(src))]
    print(got, want)
    assert got == want
    assert not any(repeats_an_ngram(h, no_repeat_ngram) for h in got)
    assert got != plain


@pytest.mark.parametrize("K", [2, 4])
def test_n_best_gives_the_best_hypothesis_first_then_the_next_best_distinct_ones(K):
    """LibreTranslate's alternatives: n_best's first hypothesis is beam search's own (the C loop's),
    the others follow in score order, distinct, at most n_best; n_best 0 is refused."""
    model = make_model(seed=5)
    src = padded_source(np.random.default_rng(2), 40, [5, 9, 3, 7])
    best = model.beam_search(src, beam_size=K, max_len=10)
    lists = model.beam_search(src, beam_size=K, max_len=10, n_best=K)
    assert [hyps[0] for hyps in lists] == best
    assert all(1 <= len(hyps) <= K and len({tuple(h) for h in hyps}) == len(hyps) for hyps in lists)
    assert any(len(hyps) > 1 for hyps in lists)
    with pytest.raises(ValueError, match="n_best must be an int >= 1"):
        model.beam_search(src, beam_size=K, n_best=0)


def test_no_repeat_ngram_with_nothing_left_to_say_ends_the_sentence():
    # Two words and N = 1: after both, every word is banned; before min_len EOS is too, and then
    # EOS is what remains (never padding or BOS, never a repeat).
    cfg = T.ModelConfig(src_vocab_size=6, tgt_vocab_size=5, d_model=16, n_heads=2, d_ff=16,
                        n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, max_len=8)
    model = T.Seq2SeqTransformer(cfg, seed=7)
    model.params.data["generator.bias"][:] = [9, 9, -9, 0.0, 0.1]    # pad/BOS favourites, EOS unlikely
    src = np.array([[3, 4, 5], [5, 3, 0]])
    for min_len in (0, 5):
        for hyps in (model.greedy_decode(src, max_len=6, min_len=min_len, no_repeat_ngram=1),
                     model.beam_search(src, beam_size=3, max_len=6, min_len=min_len, no_repeat_ngram=1)):
            assert all(len(h) == len(set(h)) and set(h) <= {3, 4} for h in hyps), hyps
            if min_len:
                assert [sorted(h) for h in hyps] == [[3, 4], [3, 4]], hyps
    assert model.greedy_decode(src, max_len=6, min_len=5, no_repeat_ngram=1) == recompute_greedy(model, src, 6, 5, 1)


def test_default_max_len_is_each_sentences_own_relative_limit():
    # An untrained model that never emits EOS runs to each sentence's own limit,
    # min(2 * source length + 10, max_len): 12, 16, 24 (clamped from 28) and 22 here.
    model = make_model(seed=2, max_len=24)
    src = padded_source(np.random.default_rng(3), 40, [1, 3, 9, 6])
    limits = own_limits(model, src)
    assert limits == [12, 16, 24, 22]
    model.params.data["generator.bias"][model.cfg.eos_id] = -50.0
    greedy = model.greedy_decode(src)
    assert [len(h) for h in greedy] == limits
    assert greedy == recompute_greedy(model, src, limits)
    beam = model.beam_search(src, beam_size=2)
    assert [len(h) for h in beam] == limits
    # with EOS possible, each output still equals the reference run with its own limit
    model.params.data["generator.bias"][model.cfg.eos_id] = 1.5
    greedy = model.greedy_decode(src)
    assert greedy == recompute_greedy(model, src, limits)
    assert all(len(h) <= limit for h, limit in zip(greedy, limits))
    beam = model.beam_search(src, beam_size=3)
    assert beam == [recompute_beam(model, src[row, :max(1, int((src[row] != 0).sum()))], 3, limits[row], 0.6)
                    for row in range(len(src))]
    assert len(set(len(h) for h in beam)) > 1


def test_an_explicit_max_len_is_one_limit_for_every_sentence():
    model = make_model(seed=2, max_len=24)
    model.params.data["generator.bias"][model.cfg.eos_id] = -50.0
    src = padded_source(np.random.default_rng(3), 40, [1, 3, 9, 6])
    assert [len(h) for h in model.greedy_decode(src, max_len=14)] == [14] * 4
    assert [len(h) for h in model.beam_search(src, beam_size=2, max_len=100)] == [24] * 4
    # min_len beyond a sentence's own default limit: that sentence stops at its limit
    assert [len(h) for h in model.greedy_decode(src, min_len=20)] == [12, 16, 24, 22]


def test_default_greedy_decoding_is_comparable_with_pytorch():
    # The PyTorch reference (transformer/torch_compat.py) decoding greedily with the same
    # per-sentence limit: each of our tokens is its favourite (up to MARGIN), and each output
    # ends where it would end: at EOS, or at the sentence's limit.
    torch = pytest.importorskip("torch")
    from transformer.torch_compat import to_torch

    MARGIN = 1e-3
    model = make_model(seed=6, max_len=30)
    model.params.data["generator.bias"][model.cfg.eos_id] += 0.5     # some end early, one at its limit
    cfg = model.cfg
    src = padded_source(np.random.default_rng(8), 40, [2, 7, 4, 10, 1])
    limits = own_limits(model, src)
    hyps = model.greedy_decode(src)
    reference = to_torch(model).eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for row, (hyp, limit) in enumerate(zip(hyps, limits)):
            assert len(hyp) <= limit
            wanted = hyp + ([cfg.eos_id] if len(hyp) < limit else [])
            with torch.no_grad():
                logits = reference(torch.from_numpy(src[row:row + 1]), torch.tensor([[cfg.bos_id] + wanted[:-1]]))
            logits = logits[0].double().numpy()
            logits[:, [cfg.pad_id, cfg.bos_id]] = -np.inf
            for t, token in enumerate(wanted):
                assert logits[t, token] >= logits[t].max() - MARGIN, (row, t, token, int(logits[t].argmax()))
    finally:
        torch.set_num_threads(threads)
    assert len({len(h) for h in hyps}) > 1 and any(len(h) == limit for h, limit in zip(hyps, limits))


def test_batched_decoding_equals_one_sentence_at_a_time():
    model = make_model(seed=3)
    rng = np.random.default_rng(5)
    src = padded_source(rng, 40, [6, 3, 8, 2])
    batched_greedy = model.greedy_decode(src, max_len=12)
    batched_beam = model.beam_search(src, beam_size=3, max_len=12)
    for row in range(len(src)):
        one = src[row:row + 1, :max(1, int((src[row] != 0).sum()))]
        assert model.greedy_decode(one, max_len=12) == [batched_greedy[row]]
        assert model.beam_search(one, beam_size=3, max_len=12) == [batched_beam[row]]


def test_beam_of_one_is_greedy():
    model = make_model(norm_first=True, seed=4)
    src = padded_source(np.random.default_rng(1), 40, [7, 4, 6])
    assert model.beam_search(src, beam_size=1, max_len=9, length_penalty=0.0) == model.greedy_decode(src, max_len=9)


def sequence_logprob(model, src_row, tokens, eos, append_eos):
    ys = [model.cfg.bos_id] + tokens
    targets = tokens + ([eos] if append_eos else [])
    logits = model.forward(src_row[None], np.array([ys[:len(targets)]]))[0].astype(np.float64)
    logp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    return float(sum(logp[i, t] for i, t in enumerate(targets)))


def test_wide_beam_finds_the_best_sequence_of_exhaustive_search():
    # A 5-token target vocabulary (3 specials + 2 words) and max_len 3: 2 + 4 + 8 + 8 candidates.
    cfg = T.ModelConfig(src_vocab_size=6, tgt_vocab_size=5, d_model=16, n_heads=2, d_ff=16,
                        n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, max_len=8)
    model = T.Seq2SeqTransformer(cfg, seed=7)
    model.params.data["generator.bias"][:] = [-9, -9, 0.2, 0.0, 0.1]   # pad/BOS never; EOS plausible
    src = np.array([[3, 4, 5]])
    words, max_len = [3, 4], 3
    best, best_tokens = -np.inf, None
    for length in range(max_len + 1):
        for tokens in itertools.product(words, repeat=length):
            finished = length < max_len
            score = sequence_logprob(model, src[0], list(tokens), cfg.eos_id, append_eos=finished)
            if score > best:
                best, best_tokens = score, list(tokens)
    got = model.beam_search(src, beam_size=16, max_len=max_len, length_penalty=0.0)
    print(got, best_tokens, best)
    assert got == [best_tokens]


def test_min_len_and_max_len_are_respected():
    model = make_model(seed=2)
    model.params.data["generator.bias"][model.cfg.eos_id] = 50.0    # EOS is always the favourite
    src = padded_source(np.random.default_rng(2), 40, [5, 3])
    assert model.greedy_decode(src, max_len=8) == [[], []]
    for hyp in model.greedy_decode(src, max_len=8, min_len=4) + model.beam_search(src, max_len=8, min_len=4):
        assert len(hyp) == 4 and model.cfg.eos_id not in hyp
    model.params.data["generator.bias"][model.cfg.eos_id] = -50.0   # EOS never
    for hyp in model.greedy_decode(src, max_len=6) + model.beam_search(src, beam_size=2, max_len=6):
        assert len(hyp) == 6


def test_max_len_beyond_the_positional_table_is_clamped():
    model = make_model(seed=2, max_len=7)
    model.params.data["generator.bias"][model.cfg.eos_id] = -50.0
    src = np.array([[3, 4, 5]])
    assert [len(h) for h in model.greedy_decode(src, max_len=100)] == [7]
    assert [len(h) for h in model.beam_search(src, beam_size=2)] == [7]
    with pytest.raises(ValueError, match="min_len"):
        model.greedy_decode(src, max_len=100, min_len=8)


def test_returned_cross_attention_is_a_distribution_over_real_source_tokens():
    model = make_model(seed=6)
    src = padded_source(np.random.default_rng(4), 40, [6, 3])
    hyps, attention = model.greedy_decode(src, max_len=5, min_len=5, return_attention=True)
    for row, (hyp, weights) in enumerate(zip(hyps, attention)):
        assert weights.shape == (len(hyp), model.cfg.n_heads, src.shape[1])
        np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
        assert np.all(weights[:, :, src[row] == 0] == 0)


@pytest.mark.parametrize("call, match", [
    (lambda m, s: m.greedy_decode(s, max_len=0), "max_len"),
    (lambda m, s: m.greedy_decode(s, max_len=5, min_len=6), "min_len"),
    (lambda m, s: m.greedy_decode(s, max_len=2.5), "max_len"),
    (lambda m, s: m.beam_search(s, beam_size=0), "beam_size"),
    (lambda m, s: m.beam_search(s, beam_size=10**9), "beam_size 1000000000 for 1 sentence:"),
    (lambda m, s: m.beam_search(s, length_penalty=-1), "length_penalty"),
    (lambda m, s: m.greedy_decode(s, no_repeat_ngram=-1), "no_repeat_ngram"),
    (lambda m, s: m.greedy_decode(s, no_repeat_ngram=1.5), "no_repeat_ngram"),
    (lambda m, s: m.greedy_decode(s, no_repeat_ngram=True), "no_repeat_ngram"),
    (lambda m, s: m.greedy_decode(s, no_repeat_ngram=None), "no_repeat_ngram"),
    (lambda m, s: m.beam_search(s, no_repeat_ngram=-1), "no_repeat_ngram"),
    (lambda m, s: m.beam_search(s, no_repeat_ngram=1.5), "no_repeat_ngram"),
    (lambda m, s: m.beam_search(s, no_repeat_ngram=True), "no_repeat_ngram"),
    (lambda m, s: m.greedy_decode(s, min_len=25), "min_len"),
    (lambda m, s: m.greedy_decode(s, max_len="5"), "max_len"),
    (lambda m, s: m.greedy_decode(s + 100), "src"),
    (lambda m, s: m.greedy_decode(s.astype(np.float32)), "src"),
    (lambda m, s: m.greedy_decode(s[0]), "src"),
])
def test_bad_arguments_are_named(call, match):
    model = make_model()
    src = np.array([[3, 4, 5]])
    with pytest.raises((ValueError, TypeError, MemoryError), match=match):
        call(model, src)


def test_concurrent_calls_from_python_threads_match_sequential_ones():
    from concurrent.futures import ThreadPoolExecutor

    model = make_model(seed=8)
    rng = np.random.default_rng(9)
    sources = [padded_source(rng, 40, rng.integers(1, 9, size=3)) for _ in range(8)]
    targets = [rng.integers(3, 47, size=(3, 6)) for _ in range(8)]
    expected = [(model.greedy_decode(s, max_len=8), model.beam_search(s, beam_size=2, max_len=8),
                 model.forward(s, t)) for s, t in zip(sources, targets)]

    def work(i):
        return (model.greedy_decode(sources[i], max_len=8), model.beam_search(sources[i], beam_size=2, max_len=8),
                model.forward(sources[i], targets[i]))

    for _ in range(3):
        with ThreadPoolExecutor(max_workers=4) as pool:
            got = list(pool.map(work, range(8)))
        for (g, b, f), (eg, eb, ef) in zip(got, expected):
            assert g == eg and b == eb
            assert np.array_equal(f, ef)


def test_decoding_sees_weights_changed_in_place_since_the_last_call():
    # Decoding reuses its buffers (packed weights, caches) from call to call; the weights are
    # packed again every call, so a change made in place in between is never missed.
    model = make_model(seed=4)
    src = padded_source(np.random.default_rng(6), 40, [7, 4, 9])
    before = model.greedy_decode(src, max_len=10), model.beam_search(src, beam_size=3, max_len=10)
    rng = np.random.default_rng(7)
    for name, w in model.params.data.items():
        if name.startswith(("transformer.decoder.", "generator.")):
            w += rng.normal(0, 0.3, w.shape).astype(np.float32)
    fresh = make_model(seed=5)   # no buffers from earlier calls
    fresh.load_state_dict(model.state_dict())
    after = model.greedy_decode(src, max_len=10), model.beam_search(src, beam_size=3, max_len=10)
    assert after == (fresh.greedy_decode(src, max_len=10), fresh.beam_search(src, beam_size=3, max_len=10))
    assert after != before   # the change matters, so stale weights would show
