# Beam search candidate selection (csrc/beam.h). Included by _C.pyx.

cdef extern from "beam.h" nogil:
    void c_beam_select "beam_select"(const float *logp, const double *scores, int64_t *n_finished,
                                     long n, long K, long V, int64_t banned, int64_t eos,
                                     const uint8_t *last_step, int64_t *parents, int64_t *tokens,
                                     double *new_scores, uint8_t *done, int64_t *fin_rows,
                                     int64_t *fin_tokens, double *fin_scores, int64_t *fin_count,
                                     int early_stopping)
    void c_beam_topk "beam_topk"(const float *logp, const double *scores, long n, long K, long V,
                                 int64_t banned, long width, int64_t *top_index, double *top_score)
    void c_beam_topk_reference "beam_topk_reference"(const float *logp, const double *scores,
                                                     long n, long K, long V, int64_t banned,
                                                     long width, int64_t *top_index,
                                                     double *top_score)
    void c_no_repeat_ngram_ban "no_repeat_ngram_ban"(float *logits, long n, long V,
                                                     const int64_t *history, long stride,
                                                     const int64_t *rows, long length, long ngram,
                                                     int64_t keep)

cdef object _F64 = np.dtype(np.float64)
cdef object _U8 = np.dtype(np.uint8)


cdef bint _beam_meet(object x, object y):
    """Whether two C-contiguous arrays share a byte (exact: each is one contiguous range).
    False unless both are arrays: an output not checked yet is refused by its own check."""
    if not (isinstance(x, cnp.ndarray) and isinstance(y, cnp.ndarray)):
        return False
    cdef char *px = <char *>cnp.PyArray_DATA(<cnp.ndarray>x)
    cdef char *py = <char *>cnp.PyArray_DATA(<cnp.ndarray>y)
    cdef Py_ssize_t nx = cnp.PyArray_NBYTES(<cnp.ndarray>x), ny = cnp.PyArray_NBYTES(<cnp.ndarray>y)
    return nx > 0 and ny > 0 and px < py + ny and py < px + nx


cdef void _beam_out(object x, str name, object dtype, tuple shape, list inputs) except *:
    """An output array: dtype, C-contiguous, writeable, exactly `shape`, apart from the inputs
    (a list of (array, name) already checked C-contiguous; x itself is skipped)."""
    _check(x, name, dtype, len(shape), True)
    if x.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {x.shape}")
    for other, other_name in inputs:
        if other is not x and _beam_meet(x, other):
            raise ValueError(f"{name} must not overlap {other_name}")


cdef tuple _beam_inputs(object logp, object scores):
    """logp float32 C-contiguous [n*K, V]; scores float64 C-contiguous [n, K]; returns (n, K, V)."""
    _check_f32(logp, "logp", 2)
    _check(scores, "scores", _F64, 2)
    cdef Py_ssize_t n = scores.shape[0], K = scores.shape[1], V = logp.shape[1]
    if K < 1:
        raise ValueError(f"scores must have at least one beam per slot, got shape {scores.shape}")
    if logp.shape[0] != n * K:
        raise ValueError(f"logp must have n*K = {n * K} rows (scores is {scores.shape}), got "
                         f"{logp.shape[0]}")
    return n, K, V


cdef int64_t _beam_token(object value, str name, Py_ssize_t V, bint allow_none) except? -2:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if allow_none and value == -1:
        return -1
    if not 0 <= value < V:
        raise ValueError(f"{name} must be in [0, {V}){' or -1' if allow_none else ''}, got {value}")
    return <int64_t>value


def beam_select(logp, scores, n_finished, banned, eos, last_step, parents, tokens, new_scores,
                done, fin_rows, fin_tokens, fin_scores, fin_count, bint early_stopping=True):
    """One beam-search step's selection for n sentence slots of K beams (csrc/beam.h).

    logp: float32 C-contiguous [n*K, V] log-probabilities (row slot*K + beam); scores: float64
    [n, K] running scores, -inf for a dead beam; n_finished: int64 [n] finished hypotheses per
    slot, incremented in place. banned: a token in [0, V) never chosen (EOS before min_len) or -1;
    eos: a token in [0, V); last_step: a bool for every slot, or bool/uint8 C-contiguous [n], one
    per slot (each sentence's own length limit). Each slot's candidates score + logp[row, token]
    (float64) are ranked best first (ties: lower beam*V + token first), the best min(2K, K*V)
    above -inf kept, and walked in order: EOS (or anything at the slot's last step) finishes a
    hypothesis, listed in fin_rows / fin_tokens / fin_scores [n, 2K] (fin_count [n] of them per
    slot), until the slot has K finished; the others fill the next step's beams: parents [n*K]
    (the row extended; slot*K when unfilled), tokens [n*K] (eos when unfilled), new_scores [n, K]
    (-inf when unfilled). done [n] uint8: K finished, its last step, or no beam filled. The walk
    stops at a non-finite score; at a slot's last step only its K best finish hypotheses.
    early_stopping=False: K finished hypotheses neither stop the walk nor make the slot done (the
    caller decides, as generate's early_stopping=False does). Outputs: int64/float64/uint8 C-contiguous, writeable, exact
    shapes, not overlapping the inputs or each other.
    """
    cdef Py_ssize_t n, K, V
    n, K, V = _beam_inputs(logp, scores)
    cdef int64_t ban = _beam_token(banned, "banned", V, True)
    cdef int64_t end = _beam_token(eos, "eos", V, False)
    if isinstance(last_step, (bool, np.bool_)):
        last = np.full(n, 1 if last_step else 0, np.uint8)
    elif isinstance(last_step, np.ndarray):
        last = _check_mask(last_step, "last_step", 1)
        if last.shape[0] != n:
            raise ValueError(f"last_step must have shape ({n},) (one per slot), got {last_step.shape}")
    else:
        raise TypeError(f"last_step must be a bool or a bool array, got {type(last_step).__name__}")
    if isinstance(done, np.ndarray) and done.dtype == np.bool_:
        done = _check_mask(done, "done")
    outputs = [(n_finished, "n_finished"), (parents, "parents"), (tokens, "tokens"),
               (new_scores, "new_scores"), (done, "done"), (fin_rows, "fin_rows"),
               (fin_tokens, "fin_tokens"), (fin_scores, "fin_scores"), (fin_count, "fin_count")]
    inputs = [(logp, "logp"), (scores, "scores"), (last, "last_step")] + outputs
    _beam_out(parents, "parents", _I64, (n * K,), inputs)
    _beam_out(tokens, "tokens", _I64, (n * K,), inputs)
    _beam_out(new_scores, "new_scores", _F64, (n, K), inputs)
    _beam_out(done, "done", _U8, (n,), inputs)
    _beam_out(fin_rows, "fin_rows", _I64, (n, 2 * K), inputs)
    _beam_out(fin_tokens, "fin_tokens", _I64, (n, 2 * K), inputs)
    _beam_out(fin_scores, "fin_scores", _F64, (n, 2 * K), inputs)
    _beam_out(fin_count, "fin_count", _I64, (n,), inputs)
    _beam_out(n_finished, "n_finished", _I64, (n,), inputs)
    if n == 0:
        return
    cdef const float[:, ::1] lv = logp
    cdef const double[:, ::1] sv = scores
    cdef int64_t[::1] nf = n_finished, pv = parents, tv = tokens, cv = fin_count
    cdef double[:, ::1] nsv = new_scores, fsv = fin_scores
    cdef uint8_t[::1] dv = done
    cdef const uint8_t[::1] lsv = last
    cdef int64_t[:, ::1] frv = fin_rows, ftv = fin_tokens
    with nogil:
        c_beam_select(&lv[0, 0], &sv[0, 0], &nf[0], n, K, V, ban, end, &lsv[0], &pv[0], &tv[0],
                      &nsv[0, 0], &dv[0], &frv[0, 0], &ftv[0, 0], &fsv[0, 0], &cv[0], early_stopping)


def beam_topk(logp, scores, banned, Py_ssize_t width, top_index, top_score, reference=False):
    """The ranking beam_select walks, on its own: for each of n slots, the best `width`
    candidates score[slot, beam] + logp[slot*K + beam, token] (float64) above -inf, best first,
    ties by lower beam*V + token; the banned token (or -1: none) and dead beams (score -inf)
    give none. logp float32 [n*K, V]; scores float64 [n, K]; top_index int64 [n, width]
    (beam*V + token, -1 past the last found); top_score float64 [n, width] (-inf past it).
    reference=True runs the naive one-thread C scan instead."""
    cdef Py_ssize_t n, K, V
    n, K, V = _beam_inputs(logp, scores)
    cdef int64_t ban = _beam_token(banned, "banned", max(V, 1), True)
    if width < 0:
        raise ValueError(f"width must be >= 0, got {width}")
    inputs = [(logp, "logp"), (scores, "scores"), (top_index, "top_index"), (top_score, "top_score")]
    _beam_out(top_index, "top_index", _I64, (n, width), inputs)
    _beam_out(top_score, "top_score", _F64, (n, width), inputs)
    if n * width == 0:
        return
    if V == 0:
        top_index[:] = -1
        top_score[:] = -np.inf
        return
    cdef const float[:, ::1] lv = logp
    cdef const double[:, ::1] sv = scores
    cdef int64_t[:, ::1] iv = top_index
    cdef double[:, ::1] ov = top_score
    cdef bint ref = bool(reference)
    with nogil:
        if ref:
            c_beam_topk_reference(&lv[0, 0], &sv[0, 0], n, K, V, ban, width, &iv[0, 0], &ov[0, 0])
        else:
            c_beam_topk(&lv[0, 0], &sv[0, 0], n, K, V, ban, width, &iv[0, 0], &ov[0, 0])


cdef Py_ssize_t _beam_bad_history(const int64_t *history, Py_ssize_t stride, const int64_t *rows,
                                  Py_ssize_t n, Py_ssize_t length, Py_ssize_t V) noexcept nogil:
    """Flat position (in history) of the first token outside [0, V) among the rows read, or -1."""
    cdef Py_ssize_t r, j, row
    for r in range(n):
        row = rows[r] if rows != NULL else r
        for j in range(length):
            if <uint64_t>history[row * stride + j] >= <uint64_t>V:
                return row * stride + j
    return -1


def no_repeat_ngram_ban(logits, history, length, ngram, keep=-1, rows=None):
    """The no-repeat-n-gram guard, in place (csrc/beam.h): for each of the n rows of logits
    (float32 C-contiguous [n, V], writeable), every token that would complete an n-gram of length
    `ngram` already in the row's hypothesis is set to -inf (fairseq's / Hugging Face's
    no_repeat_ngram_size: for each j with hyp[j:j+ngram-1] equal to the last ngram-1 tokens,
    hyp[j+ngram-1] is banned; ngram 1 bans every token already generated; 0 bans nothing).
    history: int64 C-contiguous [R, stride]; row r's hypothesis is history[rows[r], :length]
    (rows: None, meaning row r itself, with n <= R; or int64 C-contiguous [n] in [0, R)), its
    tokens in [0, V). length: int in [0, stride]; ngram: int >= 0; keep: a token in [0, V) never
    banned (EOS), or -1. logits must not overlap history or rows. Returns logits."""
    _check_f32(logits, "logits", 2, True)
    _check(history, "history", _I64, 2)
    cdef Py_ssize_t n = logits.shape[0], V = logits.shape[1]
    cdef Py_ssize_t R = history.shape[0], stride = history.shape[1]
    for value, name in ((length, "length"), (ngram, "ngram")):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= length <= stride:
        raise ValueError(f"length must be in [0, {stride}] (history's columns), got {length}")
    if ngram < 0:
        raise ValueError(f"ngram must be >= 0 (0: nothing banned), got {ngram}")
    cdef int64_t kept = _beam_token(keep, "keep", max(V, 1), True)
    cdef long L = length, N = min(ngram, stride + 1)     # an n-gram longer than history: no bans
    cdef const int64_t *rows_ptr = NULL
    cdef const int64_t[::1] rows_view
    if rows is not None:
        _att_rows(rows, "rows", n, R)
        _att_apart(logits, "logits", rows, "rows")
        if n:
            rows_view = rows
            rows_ptr = &rows_view[0]
    elif n > R:
        raise ValueError(f"history must have at least n = {n} rows (one per logits row), got {R}")
    _att_apart(logits, "logits", history, "history")
    if n == 0 or L < N or N == 0:
        return logits                        # no complete n-gram yet: nothing to ban
    cdef const int64_t[:, ::1] hv = history
    cdef Py_ssize_t bad
    with nogil:
        bad = _beam_bad_history(&hv[0, 0], stride, rows_ptr, n, L, V)
    if bad >= 0:
        raise ValueError(f"history must hold tokens in [0, {V}) (logits' columns), got "
                         f"{history.reshape(-1)[bad]} at row {bad // stride}, column {bad % stride}")
    cdef float[:, ::1] lv = logits
    with nogil:
        c_no_repeat_ngram_ban(&lv[0, 0], n, V, &hv[0, 0], stride, rows_ptr, L, N, kept)
    return logits
