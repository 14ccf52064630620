"""Beam search's step kernels against numpy: candidate ranking (beam_topk), the selection walk
(beam_select), and attention / cache stores that read and write the key/value cache through
row indices instead of moving it."""
import numpy as np
import pytest

from transformer import _C

from conftest import ISA_LEVELS, num_threads

NEG = -np.inf
# (slots n, beams K, vocabulary V): ones, primes, and around the 8- and 16-wide vector loops.
SHAPES = [(1, 1, 1), (1, 1, 2), (2, 1, 7), (3, 2, 15), (2, 3, 16), (4, 4, 17), (3, 2, 31), (2, 5, 33),
          (5, 3, 64), (1, 4, 65), (7, 2, 101), (2, 16, 9)]


def numpy_topk(logp, scores, banned, width):
    """Each slot's best `width` candidates above -inf: sorted by score descending, then index."""
    n, K = scores.shape
    V = logp.shape[1]
    cand = (scores.reshape(-1, 1) + logp.astype(np.float64)).reshape(n, K * V)
    if banned >= 0:
        cand.reshape(n, K, V)[:, :, banned] = NEG
    index = np.full((n, width), -1, np.int64)
    best = np.full((n, width), NEG)
    for slot in range(n):
        ok = np.flatnonzero(cand[slot] > NEG)           # also drops NaN
        order = ok[np.lexsort((ok, -cand[slot, ok]))][:width]
        index[slot, :len(order)] = order
        best[slot, :len(order)] = cand[slot, order]
    return index, best


def problem(n, K, V, seed, ties=True):
    """Log-probabilities with ties (rounded), a few -inf tokens, dead beams and equal scores."""
    rng = np.random.default_rng(seed)
    logp = rng.standard_normal((n * K, V)).astype(np.float32) * 3
    if ties:
        logp = np.round(logp * 2) / 2                  # many exactly equal candidates
    logp[rng.random(logp.shape) < 0.1] = NEG
    scores = np.round(rng.standard_normal((n, K)) * 2) / 2
    scores[rng.random((n, K)) < 0.25] = NEG             # dead beams give no candidates
    return np.ascontiguousarray(logp, np.float32), scores


def topk(logp, scores, banned, width, reference=False):
    n = scores.shape[0]
    index, best = np.empty((n, width), np.int64), np.empty((n, width))
    _C.beam_topk(logp, scores, banned, width, index, best, reference=reference)
    return index, best


@pytest.mark.parametrize("n, K, V", SHAPES)
def test_topk_ranks_like_numpy_with_ties_dead_beams_and_a_banned_token(isa, n, K, V):
    logp, scores = problem(n, K, V, seed=n * 1000 + K * 10 + V)
    for banned in (-1, 0, V - 1):
        for width in sorted({1, 2 * K, min(2 * K, K * V), K * V + 3}):
            want = numpy_topk(logp, scores, banned, width)
            for reference in (False, True):
                got = topk(logp, scores, banned, width, reference)
                assert np.array_equal(got[0], want[0]), (isa, banned, width, reference, got[0], want[0])
                assert np.array_equal(got[1], want[1])


def test_topk_scans_long_rows_with_a_late_best_candidate(isa):
    # The winners sit past many vector widths, in the second beam, and NaN never wins.
    logp = np.full((2, 1000), -5.0, np.float32)
    logp[1, 997], logp[1, 998], logp[0, 3] = -0.5, -0.25, np.nan
    scores = np.array([[-0.1, -0.2]])
    index, best = topk(logp, scores, -1, 3)
    assert index.tolist() == [[1998, 1997, 0]]
    assert best[0, :2].tolist() == [-0.2 + np.float64(np.float32(-0.25)), -0.2 - 0.5]


@pytest.mark.parametrize("n, K, V", [(9, 4, 257), (33, 3, 500)])
def test_topk_and_select_are_bitwise_equal_at_one_and_two_threads_and_every_isa(n, K, V):
    logp, scores = problem(n, K, V, seed=5)
    results = []
    for isa in ISA_LEVELS:
        for threads in (1, 2):
            _C.set_isa(isa)
            try:
                with num_threads(threads):
                    results.append((topk(logp, scores, 3, 2 * K), select(logp, scores, np.zeros(n, np.int64),
                                                                          -1, 3, False)))
            finally:
                _C.set_isa(_C.best_isa())
    for other in results[1:]:
        for a, b in zip(results[0][0] + tuple(results[0][1].values()), other[0] + tuple(other[1].values())):
            assert np.array_equal(a, b)


def select(logp, scores, n_finished, banned, eos, last_step):
    n, K = scores.shape
    out = dict(n_finished=n_finished.copy(), parents=np.empty(n * K, np.int64), tokens=np.empty(n * K, np.int64),
               new_scores=np.empty((n, K)), done=np.empty(n, np.uint8), fin_rows=np.zeros((n, 2 * K), np.int64),
               fin_tokens=np.zeros((n, 2 * K), np.int64), fin_scores=np.zeros((n, 2 * K)),
               fin_count=np.empty(n, np.int64))    # fin_* past fin_count stay zero
    _C.beam_select(logp, scores, out["n_finished"], banned, eos, last_step, out["parents"], out["tokens"],
                   out["new_scores"], out["done"], out["fin_rows"], out["fin_tokens"], out["fin_scores"],
                   out["fin_count"])
    return out


def python_select(logp, scores, n_finished, banned, eos, last_step):
    """The walk beam search did in Python before the kernel, over numpy's ranking (with Hugging
    Face's rule since: an EOS candidate ranked below the K best finishes nothing)."""
    n, K = scores.shape
    V = logp.shape[1]
    index, best = numpy_topk(logp, scores, banned, min(2 * K, K * V))
    n_finished = n_finished.copy()
    parents = np.repeat(np.arange(n) * K, K)
    tokens = np.full(n * K, eos, np.int64)
    new_scores = np.full((n, K), NEG)
    done = np.zeros(n, np.uint8)
    finished = [[] for _ in range(n)]
    for slot in range(n):
        kept = 0
        for rank, (candidate, score) in enumerate(zip(index[slot], best[slot])):
            if candidate < 0 or not np.isfinite(score):
                break
            beam, token = divmod(int(candidate), V)
            row = slot * K + beam
            if token == eos and not last_step and rank >= K:
                continue                 # EOS below the K best candidates: not a final hypothesis
            if token == eos or last_step:
                finished[slot].append((row, token, score))
                n_finished[slot] += 1
                if n_finished[slot] >= K:
                    break
                continue
            parents[slot * K + kept], tokens[slot * K + kept], new_scores[slot, kept] = row, token, score
            kept += 1
            if kept == K:
                break
        done[slot] = n_finished[slot] >= K or last_step or kept == 0
    return dict(n_finished=n_finished, parents=parents, tokens=tokens, new_scores=new_scores, done=done,
                finished=finished)


@pytest.mark.parametrize("n, K, V", SHAPES)
def test_select_walks_the_ranking_like_the_python_loop(isa, n, K, V):
    logp, scores = problem(n, K, V, seed=7 * n + V)
    rng = np.random.default_rng(V)
    for eos in sorted({0, V // 2, V - 1}):
        for last_step in (False, True):
            for banned in (-1, eos):
                n_finished = rng.integers(0, K, size=n).astype(np.int64)
                got = select(logp, scores, n_finished, banned, eos, last_step)
                want = python_select(logp, scores, n_finished, banned, eos, last_step)
                for key in ("n_finished", "parents", "tokens", "new_scores", "done"):
                    assert np.array_equal(got[key], want[key]), (key, got[key], want[key])
                for slot in range(n):
                    c = got["fin_count"][slot]
                    assert list(zip(got["fin_rows"][slot, :c].tolist(), got["fin_tokens"][slot, :c].tolist(),
                                    got["fin_scores"][slot, :c].tolist())) == want["finished"][slot]


def test_select_finishes_everything_at_the_last_step_and_stops_at_k_finished():
    logp = np.log(np.array([[0.5, 0.3, 0.2], [0.6, 0.3, 0.1]], np.float32))
    scores = np.array([[0.0, -1.0]])
    got = select(logp, scores, np.zeros(1, np.int64), -1, 2, True)
    assert got["fin_count"].tolist() == [2] and got["done"].tolist() == [1]
    assert got["fin_rows"][0, :2].tolist() == [0, 0] and got["fin_tokens"][0, :2].tolist() == [0, 1]
    got = select(logp, scores, np.zeros(1, np.int64), -1, 0, False)     # token 0 is EOS now
    # ranking: (beam 0, EOS) -0.69, (0, 1) -1.20, (1, EOS) -1.51, (0, 2) -1.61: the second EOS is
    # below the K = 2 best, so it finishes nothing and (0, 2) fills the second beam
    assert got["fin_count"].tolist() == [1] and got["n_finished"].tolist() == [1]
    assert got["done"].tolist() == [0] and got["tokens"].tolist() == [1, 2]
    got = select(logp, scores, np.ones(1, np.int64), -1, 0, False)      # one finished before
    assert got["n_finished"].tolist() == [2] and got["done"].tolist() == [1]


def select_args(n=2, K=2, V=5):
    logp = np.zeros((n * K, V), np.float32)
    return [logp, np.zeros((n, K)), np.zeros(n, np.int64), -1, 2, False, np.empty(n * K, np.int64),
            np.empty(n * K, np.int64), np.empty((n, K)), np.empty(n, np.uint8), np.empty((n, 2 * K), np.int64),
            np.empty((n, 2 * K), np.int64), np.empty((n, 2 * K)), np.empty(n, np.int64)]


NAMES = ["logp", "scores", "n_finished", "banned", "eos", "last_step", "parents", "tokens", "new_scores", "done",
         "fin_rows", "fin_tokens", "fin_scores", "fin_count"]


@pytest.mark.parametrize("position, value, error", [
    (0, np.zeros((4, 5), np.float64), TypeError),
    (0, np.zeros((4, 5), np.float16), TypeError),
    (0, np.zeros((3, 5), np.float32), ValueError),
    (0, np.zeros((8, 5), np.float32)[::2], ValueError),
    (1, np.zeros((2, 2), np.float32), TypeError),
    (1, np.zeros(4), ValueError),
    (2, np.zeros(3, np.int64), ValueError),
    (2, np.zeros(2, np.int32), TypeError),
    (3, 5, ValueError),
    (3, -2, ValueError),
    (3, 1.0, TypeError),
    (4, 5, ValueError),
    (4, "2", TypeError),
    (5, 1, TypeError),
    (6, np.empty(3, np.int64), ValueError),
    (7, np.empty(4, np.float64), TypeError),
    (8, np.empty((2, 3)), ValueError),
    (9, np.empty(2, np.int64), TypeError),
    (10, np.empty((2, 3), np.int64), ValueError),
    (11, np.empty((2, 4), object), TypeError),
    (12, np.empty((2, 4), np.float32), TypeError),
    (13, np.empty(3, np.int64), ValueError),
])
def test_select_bad_arguments_are_named(position, value, error):
    args = select_args()
    args[position] = value
    with pytest.raises(error, match=NAMES[position]):
        _C.beam_select(*args)


def test_select_refuses_read_only_and_overlapping_outputs():
    args = select_args()
    args[6] = np.empty(4, np.int64)
    args[6].flags.writeable = False
    with pytest.raises(ValueError, match="parents must be writeable"):
        _C.beam_select(*args)
    args = select_args()
    shared = np.empty(8, np.int64)
    args[6], args[7] = shared[:4], shared[2:6]
    with pytest.raises(ValueError, match="must not overlap"):
        _C.beam_select(*args)
    args = select_args()
    args[9] = np.empty(2, np.bool_)        # a bool done is fine
    _C.beam_select(*args)


def test_select_takes_each_slots_own_last_step():
    # A per-slot last_step finishes only those slots' candidates; the others walk as usual. All
    # slots equal gives the bits of the single bool.
    for n, K, V in [(1, 1, 2), (3, 2, 15), (4, 4, 17), (5, 3, 64), (7, 2, 101)]:
        logp, scores = problem(n, K, V, seed=3 * n + V)
        rng = np.random.default_rng(n + V)
        n_finished = rng.integers(0, K, size=n).astype(np.int64)
        last = rng.random(n) < 0.5
        got = select(logp, scores, n_finished, -1, 1, last)
        for slot in range(n):
            one = python_select(logp[slot * K:(slot + 1) * K], scores[slot:slot + 1], n_finished[slot:slot + 1], -1,
                                1, bool(last[slot]))
            assert got["n_finished"][slot] == one["n_finished"][0] and got["done"][slot] == one["done"][0]
            assert np.array_equal(got["parents"][slot * K:(slot + 1) * K] - slot * K, one["parents"])
            assert np.array_equal(got["tokens"][slot * K:(slot + 1) * K], one["tokens"])
            assert np.array_equal(got["new_scores"][slot], one["new_scores"][0])
            c = got["fin_count"][slot]
            assert [(r - slot * K, tok, sc) for r, tok, sc in zip(got["fin_rows"][slot, :c].tolist(),
                                                                  got["fin_tokens"][slot, :c].tolist(),
                                                                  got["fin_scores"][slot, :c].tolist())] \
                == one["finished"][0]
        for flag in (False, True):
            for as_array in (np.full(n, flag), np.full(n, flag, np.uint8)):
                a, b = select(logp, scores, n_finished, -1, 1, flag), select(logp, scores, n_finished, -1, 1, as_array)
                assert all(np.array_equal(a[key], b[key]) for key in a)


def test_select_bad_last_step_arrays_are_named():
    args = select_args()
    for value, error in ((np.zeros(3, bool), ValueError), (np.zeros((2, 1), bool), ValueError),
                         (np.zeros(2, np.int64), TypeError), ([True, False], TypeError), (None, TypeError)):
        args[5] = value
        with pytest.raises(error, match="last_step"):
            _C.beam_select(*args)


def test_topk_bad_arguments_are_named():
    logp, scores = np.zeros((4, 5), np.float32), np.zeros((2, 2))
    index, best = np.empty((2, 3), np.int64), np.empty((2, 3))
    with pytest.raises(ValueError, match="width"):
        _C.beam_topk(logp, scores, -1, -1, index, best)
    with pytest.raises(ValueError, match="top_index"):
        _C.beam_topk(logp, scores, -1, 4, index, best)
    with pytest.raises(TypeError, match="top_score"):
        _C.beam_topk(logp, scores, -1, 3, index, best.astype(np.float32))
    with pytest.raises(ValueError, match="banned"):
        _C.beam_topk(logp, scores, 7, 3, index, best)


# -- the no-repeat-n-gram guard ---------------------------------------------------------------------

def python_ngram_ban(logits, history, length, ngram, keep=-1, rows=None):
    """The rule written out: for each earlier position j whose ngram-1 tokens equal the last
    ngram-1 tokens of the row's hypothesis, the token after them is banned (except `keep`)."""
    out = logits.copy()
    for r in range(logits.shape[0]):
        hyp = history[r if rows is None else rows[r], :length].tolist()
        if ngram == 0:
            continue
        tail = hyp[length - ngram + 1:] if ngram > 1 else []
        for j in range(length - ngram + 1):
            if hyp[j:j + ngram - 1] == tail and hyp[j + ngram - 1] != keep:
                out[r, hyp[j + ngram - 1]] = NEG
    return out


def repetitive_history(rng, R, stride, V):
    """Rows of repeated short patterns (so that n-grams recur), some random, some constant."""
    history = rng.integers(0, V, size=(R, stride))
    for r in range(R):
        kind = r % 3
        if kind == 0:
            pattern = rng.integers(0, V, size=rng.integers(1, 4))
            history[r] = np.resize(pattern, stride)
        elif kind == 1:
            history[r] = rng.integers(0, min(V, 2), size=stride)     # two tokens: every n-gram recurs
    return np.ascontiguousarray(history, np.int64)


@pytest.mark.parametrize("n, V, stride", [(1, 1, 1), (1, 2, 5), (2, 3, 7), (3, 5, 12), (5, 17, 20), (8, 40, 33)])
@pytest.mark.parametrize("ngram", [0, 1, 2, 3, 4])
def test_ngram_ban_matches_the_rule_written_out(n, V, stride, ngram):
    rng = np.random.default_rng(n * 100 + V + ngram)
    history = repetitive_history(rng, n + 2, stride, V)
    logits = rng.standard_normal((n, V)).astype(np.float32)
    for length in sorted({0, 1, ngram - 1, ngram, ngram + 1, stride // 2, stride} & set(range(stride + 1))):
        for keep in sorted({-1, 0, V - 1}):
            for rows in (None, rng.integers(0, n + 2, size=n)):
                want = python_ngram_ban(logits, history, length, ngram, keep, rows)
                got = logits.copy()
                assert _C.no_repeat_ngram_ban(got, history, length, ngram, keep, rows=rows) is got
                assert np.array_equal(got, want), (length, keep, rows, got, want)


def test_ngram_ban_examples():
    # The first 5 columns are the hypotheses; what lies beyond `length` is never read.
    history = np.array([[5, 6, 7, 5, 6, 9, 9],     # "5 6" recurs: 7 would repeat "6 7" and "5 6 7"
                        [4, 4, 4, 4, 4, 9, 9],     # a constant run: 4 is banned for every N <= 5
                        [3, 4, 3, 4, 3, 9, 9]], np.int64)   # "3 4 3 4 3": 4 is banned for N = 2, 3, 4
    for ngram in (1, 2, 3, 4):
        logits = np.zeros((3, 10), np.float32)
        _C.no_repeat_ngram_ban(logits, history, 5, ngram)
        banned = [sorted(np.flatnonzero(row == NEG).tolist()) for row in logits]
        want = {1: [[5, 6, 7], [4], [3, 4]], 2: [[7], [4], [4]], 3: [[7], [4], [4]], 4: [[], [4], [4]]}[ngram]
        assert banned == want, (ngram, banned)
    logits = np.zeros((1, 10), np.float32)
    _C.no_repeat_ngram_ban(logits, history[1:2], 4, 1, keep=4)         # keep is never banned
    assert np.all(logits == 0)
    _C.no_repeat_ngram_ban(logits, history[:1], 2, 3)                    # shorter than n: nothing yet
    _C.no_repeat_ngram_ban(logits, history[:1], 5, 2**70)                # longer than any history
    assert np.all(logits == 0)


def test_ngram_ban_bad_arguments_are_named():
    logits, history = np.zeros((2, 5), np.float32), np.zeros((3, 4), np.int64)
    ban = _C.no_repeat_ngram_ban
    for call, error, match in [
            (lambda: ban(logits.astype(np.float64), history, 2, 2), TypeError, "logits"),
            (lambda: ban(logits[:, ::2], history, 2, 2), ValueError, "logits"),
            (lambda: ban(np.zeros((2, 5), np.float32)[None], history, 2, 2), ValueError, "logits"),
            (lambda: ban(logits, history.astype(np.int32), 2, 2), TypeError, "history"),
            (lambda: ban(logits, history[:1], 2, 2), ValueError, "history"),
            (lambda: ban(logits, history + 5, 2, 2), ValueError, "history"),
            (lambda: ban(logits, history - 1, 2, 1), ValueError, "history"),
            (lambda: ban(logits, history, 5, 2), ValueError, "length"),
            (lambda: ban(logits, history, -1, 2), ValueError, "length"),
            (lambda: ban(logits, history, 2.0, 2), TypeError, "length"),
            (lambda: ban(logits, history, 2, -1), ValueError, "ngram"),
            (lambda: ban(logits, history, 2, 1.5), TypeError, "ngram"),
            (lambda: ban(logits, history, 2, True), TypeError, "ngram"),
            (lambda: ban(logits, history, 2, 2, keep=5), ValueError, "keep"),
            (lambda: ban(logits, history, 2, 2, rows=np.array([0, 3])), ValueError, "rows"),
            (lambda: ban(logits, history, 2, 2, rows=np.array([0, 1, 2])), ValueError, "rows"),
            (lambda: ban(logits, history, 2, 2, rows=np.array([0, 1], np.int32)), TypeError, "rows")]:
        with pytest.raises(error, match=match):
            call()
    ro = logits.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="logits must be writeable"):
        ban(ro, history, 2, 2)
    shared = np.zeros(40, np.int64)
    with pytest.raises(ValueError, match="must not overlap"):
        ban(shared.view(np.float32)[40:50].reshape(2, 5), shared[10:].reshape(3, 10), 2, 2)


# -- attention through row indices ----------------------------------------------------------------

@pytest.mark.parametrize("R, N, H, Tmax, n_keys, dh", [(1, 1, 1, 1, 1, 1), (5, 3, 2, 9, 7, 17), (4, 6, 3, 20, 20, 32),
                                                       (3, 2, 4, 70, 65, 16), (2, 4, 1, 8, 0, 15)])
def test_indexed_attention_has_the_bits_of_gathering_the_cache_first(isa, R, N, H, Tmax, n_keys, dh):
    rng = np.random.default_rng(R * 100 + dh)
    fused = rng.standard_normal((N, 3 * H * dh), dtype=np.float32)
    q = fused[:, : H * dh]
    k = rng.standard_normal((R, H, Tmax, dh), dtype=np.float32)
    v = rng.standard_normal((R, H, Tmax, dh), dtype=np.float32)
    mask = rng.random((R, Tmax)) < 0.3
    mask[0] = True                                              # a fully masked row gives zeros
    rows = rng.integers(0, R, size=N)
    key_rows = rng.integers(0, R, size=(N, Tmax))
    # rows: cache and mask rows gathered.
    out = np.full((N, H * dh), np.nan, np.float32)
    probs = np.empty((N, H, n_keys), np.float32)
    _C.attention_decode(q, k, v, n_keys, out, 0.3, mask, probs, rows=rows)
    want, want_p = np.empty_like(out), np.empty_like(probs)
    _C.attention_decode(q, k[rows].copy(), v[rows].copy(), n_keys, want, 0.3, mask[rows].copy(), want_p)
    assert np.array_equal(out, want) and np.array_equal(probs, want_p)
    # key_rows: key j of row n from cache row key_rows[n, j].
    gathered_k = np.ascontiguousarray(np.stack([k[key_rows[n], :, np.arange(Tmax)].transpose(1, 0, 2)
                                                for n in range(N)]))
    gathered_v = np.ascontiguousarray(np.stack([v[key_rows[n], :, np.arange(Tmax)].transpose(1, 0, 2)
                                                for n in range(N)]))
    assert gathered_k.shape == (N, H, Tmax, dh)
    _C.attention_decode(q, k, v, n_keys, out, 0.3, None, probs, rows=rows, key_rows=key_rows)
    _C.attention_decode(q, gathered_k, gathered_v, n_keys, want, 0.3, None, want_p)
    assert np.array_equal(out, want) and np.array_equal(probs, want_p)
    # and against float64 numpy on the gathered cache
    scores = np.einsum("nhd,nhtd->nht", q.reshape(N, H, dh).astype(np.float64), gathered_k[:, :, :n_keys]) * 0.3
    p = np.exp(scores - scores.max(-1, keepdims=True, initial=-np.inf)) if n_keys else scores
    p = p / p.sum(-1, keepdims=True) if n_keys else p
    ref = np.einsum("nht,nhtd->nhd", p, gathered_v[:, :, :n_keys]).reshape(N, H * dh)
    assert np.abs(out - ref).max(initial=0) <= 1e-5 * max(np.abs(ref).max(initial=0), 1.0)


def test_indexed_attention_is_bitwise_equal_at_one_and_two_threads():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((8, 4 * 32), dtype=np.float32)
    k, v = (rng.standard_normal((5, 4, 40, 32), dtype=np.float32) for _ in range(2))
    key_rows = rng.integers(0, 5, size=(8, 40))
    outs = []
    for threads in (1, 2):
        with num_threads(threads):
            outs.append(_C.attention_decode(q, k, v, 37, np.empty_like(q), 0.2, rows=np.arange(8) % 5,
                                            key_rows=key_rows))
    assert np.array_equal(outs[0], outs[1])


def test_indexed_attention_bad_indices_are_named():
    q, out = np.zeros((3, 8), np.float32), np.zeros((3, 8), np.float32)
    k = np.zeros((2, 2, 5, 4), np.float32)
    with pytest.raises(ValueError, match="rows must be in"):
        _C.attention_decode(q, k, k, 3, out, 1.0, rows=np.array([0, 2, 1]))
    with pytest.raises(ValueError, match="rows must be in"):
        _C.attention_decode(q, k, k, 3, out, 1.0, rows=np.array([0, -1, 1]))
    with pytest.raises(ValueError, match="rows"):
        _C.attention_decode(q, k, k, 3, out, 1.0, rows=np.array([0, 1]))
    with pytest.raises(TypeError, match="rows"):
        _C.attention_decode(q, k, k, 3, out, 1.0, rows=np.array([0, 1, 1], np.int32))
    with pytest.raises(ValueError, match="key_rows must be in"):
        _C.attention_decode(q, k, k, 3, out, 1.0, rows=np.zeros(3, np.int64),
                            key_rows=np.array([[0, 1, 2, 9], [0] * 4, [0] * 4]))
    with pytest.raises(ValueError, match="key_rows"):
        _C.attention_decode(q, k, k, 3, out, 1.0, rows=np.zeros(3, np.int64), key_rows=np.zeros((3, 2), np.int64))
    with pytest.raises(ValueError, match="key_rows"):
        _C.attention_decode(q, k, k, 3, out, 1.0, rows=np.zeros(3, np.int64),
                            key_rows=np.zeros((3, 8), np.int64)[:, ::2])
    with pytest.raises(ValueError, match="k_cache must have at least"):
        _C.attention_decode(q, k, k, 3, out, 1.0, key_rows=np.zeros((3, 5), np.int64))
    with pytest.raises(ValueError, match="key_mask"):
        _C.attention_decode(q, k, k, 3, out, 1.0, np.zeros((3, 5), bool), rows=np.zeros(3, np.int64))


def test_cache_store_writes_step_t_of_the_given_rows(isa):
    rng = np.random.default_rng(0)
    for R, N, H, Tmax, dh in [(1, 1, 1, 1, 1), (5, 3, 2, 7, 17), (4, 4, 3, 9, 16)]:
        cache = rng.standard_normal((R, H, Tmax, dh), dtype=np.float32)
        fused = rng.standard_normal((N, 3 * H * dh), dtype=np.float32)
        x = fused[:, H * dh: 2 * H * dh]                     # a column slice, as in decoding
        rows = rng.permutation(R)[:N]
        want = cache.copy()
        want[rows, :, Tmax - 1] = x.reshape(N, H, dh)
        _C.attention_cache_store(x, cache, Tmax - 1, rows)
        assert np.array_equal(cache, want)
        want[:N, :, 0] = x.reshape(N, H, dh)
        _C.attention_cache_store(x, cache, 0)
        assert np.array_equal(cache, want)


def test_cache_store_bad_arguments_are_named():
    cache = np.zeros((2, 2, 5, 4), np.float32)
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="t must be"):
        _C.attention_cache_store(x, cache, 5)
    with pytest.raises(ValueError, match="x must be"):
        _C.attention_cache_store(np.zeros((2, 9), np.float32), cache, 0)
    with pytest.raises(TypeError, match="x"):
        _C.attention_cache_store(x.astype(np.float64), cache, 0)
    with pytest.raises(ValueError, match="rows must be in"):
        _C.attention_cache_store(x, cache, 0, np.array([0, 2]))
    with pytest.raises(ValueError, match="cache must have at least"):
        _C.attention_cache_store(np.zeros((3, 8), np.float32), cache, 0)
    ro = cache.copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="cache must be writeable"):
        _C.attention_cache_store(x, ro, 0)
    with pytest.raises(ValueError, match="cache must not overlap x"):
        _C.attention_cache_store(cache.reshape(2, 40)[:, :8], cache, 0)
