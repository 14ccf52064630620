# The decoder's step in C (csrc/decoder.h). Included by _C.pyx.

from cpython.exc cimport PyErr_Fetch, PyErr_Restore
from cpython.ref cimport PyObject
from libc.math cimport sqrt
from libc.stdlib cimport calloc, free

cdef extern from "decoder.h" nogil:
    ctypedef struct tf_linear:
        const void *w
        int int8
        int prec
        int isa
        long N, K
        const float *bias
    ctypedef struct tf_decoder_layer:
        const float *norm_w[3]
        const float *norm_b[3]
        tf_linear qkv, self_out, cross_q, cross_out, linear1, linear2
        const void *memory_k
        const void *memory_v
        void *self_k
        void *self_v
    ctypedef struct tf_decoder:
        long D, H, dh, d_ff, V, S, Tmax, B, N, n_layers
        int norm_first, kv16, activation
        float embed_scale, scale, eps
        const float *embed
        const float *pe
        const uint8_t *src_pad
        const float *final_w
        const float *final_b
        tf_linear generator
        const tf_decoder_layer *layers
        float *x
        float *h
        float *tmp
        float *ctx
        float *query
        float *qkv
        float *ff_pre
        float *ff_act
        float *logits
        float *mean
        float *rstd
    void c_decoder_step "decoder_step"(const tf_decoder *d, const int64_t *ids, long n, long t,
                                       const int64_t *slot, int64_t *origin, long ld_origin,
                                       const int64_t *sentence, int log_softmax, const int64_t *banned,
                                       int n_banned, int64_t *argmax, int groups)
    ctypedef struct tf_poll:
        int (*fn)(void *ctx) noexcept nogil
        void *ctx
        int stopped
    ctypedef struct tf_greedy:
        const int64_t *limits
        long min_len, ngram
        int64_t bos, eos, pad
        int forced_eos, n_banned
        const int64_t *banned
        int64_t *out
        int64_t *lengths
        long ld_out
        int64_t *ids
        int64_t *slot
        int64_t *sentence
        int64_t *argmax
        int64_t *origin
        tf_poll *poll
        uint8_t *finished
        const uint8_t *cancelled
    void c_decoder_greedy "decoder_greedy"(const tf_decoder *d, const tf_greedy *g, int groups)
    ctypedef struct tf_beam:
        const int64_t *limits
        long K, min_len, ngram
        double length_penalty
        int64_t bos, eos, pad
        int forced_eos, renormalize, length_form, early_stopping, n_banned
        const int64_t *banned
        double *kept
        int64_t *n_kept
        int64_t *best
        int64_t *best_len
        long ld_best
        double *scores
        double *new_scores
        double *fin_scores
        double *best_score
        int64_t *ids
        int64_t *slot
        int64_t *sentence
        int64_t *parents
        int64_t *tokens
        int64_t *fin_rows
        int64_t *fin_tokens
        int64_t *n_finished
        int64_t *fin_count
        int64_t *live
        int64_t *origin
        int64_t *origin_spare
        int64_t *hyps
        int64_t *hyps_spare
        uint8_t *done
        uint8_t *last_step
        tf_poll *poll
        uint8_t *finished
        const uint8_t *cancelled
    void c_decoder_beam "decoder_beam"(const tf_decoder *d, const tf_beam *g, int groups)
    void c_argmax_rows "argmax_rows"(const float *x, long n, long V, int64_t *out, int reference)

# A decoding loop in C asks the interpreter for its signals between steps (csrc/decoder.h:
# tf_poll): a KeyboardInterrupt, or what a signal handler raised, stops it and is raised when it
# returns, as the step-by-step loop raised it between two steps.
cdef extern from "Python.h":
    int _check_signals "PyErr_CheckSignals"()   # -1 with the exception set: fetched below, not raised


cdef struct _signals:
    PyObject *type
    PyObject *value
    PyObject *traceback


cdef int _poll_signals(void *ctx) noexcept nogil:
    cdef _signals *caught = <_signals *>ctx
    with gil:
        if _check_signals() == 0:
            return 0
        PyErr_Fetch(&caught.type, &caught.value, &caught.traceback)   # held until the loop returns
    return 1


cdef int _raise_caught(_signals *caught) except -1:
    PyErr_Restore(caught.type, caught.value, caught.traceback)       # takes the references
    return -1


_DS_BUFFERS = ("x", "h", "tmp", "ctx", "query", "qkv", "ff_pre", "ff_act", "logits", "mean", "rstd")


cdef void *_ds_array(object a, str name, object dtype, tuple shape, bint writeable) except NULL:
    """The data of a non-empty C-contiguous array of `dtype` and `shape` (a key or value cache:
    float32, or uint16 holding bf16)."""
    _check(a, name, dtype, len(shape), writeable)
    if a.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name} must not be empty")
    return cnp.PyArray_DATA(<cnp.ndarray>a)


cdef float *_ds_f32(object a, str name, tuple shape, bint writeable) except NULL:
    return <float *>_ds_array(a, name, _F32, shape, writeable)


cdef object _ds_buffer(dict buffers, str name, long N, long width):
    """buffers[name]: a writeable float32 array of N rows, [N, width] (width > 0), [N, any]
    (width -1) or [N] (width 0)."""
    if name not in buffers:
        raise ValueError(f"buffers must hold {name!r}")
    a = buffers[name]
    label = f"buffers[{name!r}]"
    _check_f32(a, label, 1 if width == 0 else 2, True)
    if a.shape[0] != N or (width > 0 and a.shape[1] != width):
        shape = (N,) if width == 0 else (N, width if width > 0 else "any")
        raise ValueError(f"{label} must have shape {shape}, got {a.shape}")
    if a.size == 0:
        raise ValueError(f"{label} must not be empty")
    return a


cdef float *_ds_ptr(dict buffers, str name, long N, long width) except NULL:
    return <float *>cnp.PyArray_DATA(<cnp.ndarray>_ds_buffer(buffers, name, N, width))


cdef int _ds_bind(tf_decoder *d, dict buffers, long N) except -1:
    """d's step buffers: buffers' arrays (named as in _DS_BUFFERS) of N rows each, as wide as d's
    D, d_ff and V need; d.N = N."""
    d.N = N
    d.x, d.h = _ds_ptr(buffers, "x", N, d.D), _ds_ptr(buffers, "h", N, d.D)
    d.tmp, d.ctx, d.query = _ds_ptr(buffers, "tmp", N, d.D), _ds_ptr(buffers, "ctx", N, d.D), \
        _ds_ptr(buffers, "query", N, d.D)
    d.qkv = _ds_ptr(buffers, "qkv", N, 3 * d.D)
    d.ff_pre, d.ff_act = _ds_ptr(buffers, "ff_pre", N, d.d_ff), _ds_ptr(buffers, "ff_act", N, d.d_ff)
    d.logits = _ds_ptr(buffers, "logits", N, d.V)
    d.mean, d.rstd = _ds_ptr(buffers, "mean", N, 0), _ds_ptr(buffers, "rstd", N, 0)
    return 0


cdef void _ds_linear(tf_linear *out, object pair, str name, long N, long K, list keep) except *:
    """(prepared weight, bias) -> out: a PackedMatrix from gemm_pack_b or int8 bytes from
    qgemm_pack, of op(W) = [N, K]^T; bias None or float32 [N]."""
    if not isinstance(pair, tuple) or len(pair) != 2:
        raise TypeError(f"{name} must be a (weight, bias) tuple, got {type(pair).__name__}")
    w, bias = pair
    cdef PackedMatrix pm
    cdef int level
    cdef long n, k
    cdef const void *pw
    if isinstance(w, PackedMatrix):
        pm = <PackedMatrix>w
        if pm.data is None:
            raise TypeError(f"{name} must be a PackedMatrix from gemm_pack_b, got an empty one")
        out.w = cnp.PyArray_DATA(<cnp.ndarray>pm.data)
        out.int8, out.prec, out.isa, n, k = 0, pm.prec, pm.level, pm.N, pm.K
        keep.append(pm)
    else:
        _check(w, name, _QU8, 1)
        pw = cnp.PyArray_DATA(<cnp.ndarray>w)
        if <size_t>pw % 64 or c_qgemm_packed_info(pw, w.shape[0], &level, &n, &k) != 0:
            raise ValueError(f"{name} is not a buffer from qgemm_pack (bad alignment, header or size)")
        out.w, out.int8, out.prec, out.isa = pw, 1, 0, level
        keep.append(w)
    if n != N or k != K:
        raise ValueError(f"{name} must be [{N}, {K}] weights, got [{n}, {k}]")
    out.N, out.K = N, K
    out.bias = NULL
    if bias is not None:
        out.bias = _ds_f32(bias, f"{name} bias", (N,), False)
        keep.append(bias)


cdef extern from "stream.h" nogil:
    ctypedef struct tf_loop:
        long b0, n, t, steps, finished
    ctypedef struct tf_wave:
        const tf_decoder *d
        const tf_greedy *greedy
        const tf_beam *beam
        tf_loop loop
    void c_decoder_wave_begin "decoder_wave_begin"(tf_wave *w)
    long c_decoder_stream "decoder_stream"(const tf_decoder *d, tf_wave **waves, int n_waves, long min_steps,
                                           long max_steps, const int *arrived, int groups)


cdef class DecoderLoop:
    """The arrays of one decoding loop over a DecoderStep (tf_greedy or tf_beam, csrc/decoder.h):
    what DecoderStep.greedy and .beam run to the end at once, or, made by DecoderStep.wave, a wave
    that a DecoderStream steps together with others (csrc/stream.h). Holds every array it points
    into, and its DecoderStep."""
    cdef object step            # the DecoderStep: caches, encoder keys/values, weights
    cdef tf_greedy g
    cdef tf_beam bm
    cdef tf_wave wave
    cdef bint is_beam
    cdef long steps
    cdef readonly long K
    cdef list keep
    cdef object out, lengths
    cdef readonly object finished, cancelled    # uint8 [B]: a wave's sentences stopped / to drop
    cdef _signals caught
    cdef tf_poll poll

    def __cinit__(self):
        self.caught = _signals(NULL, NULL, NULL)
        self.poll = tf_poll(_poll_signals, &self.caught, 0)
        self.K = 1

    cdef int raise_caught(self) except -1:
        if self.poll.stopped:
            self.poll.stopped = 0
            _raise_caught(&self.caught)
        return 0

    @property
    def live(self):
        """True while the wave has a sentence left to step."""
        return self.wave.loop.n > 0

    @property
    def rows(self):
        """The decoder rows it takes at its next step (0 once done)."""
        return self.wave.loop.n * (self.K if self.is_beam else 1)

    @property
    def sentences(self):
        return (<DecoderStep>self.step).d.B

    def result(self, Py_ssize_t b):
        """Sentence b's tokens (a list; EOS dropped): greedy's up to its EOS or limit, beam
        search's best finished hypothesis ([] when none finished). Meaningful once finished[b]."""
        if not 0 <= b < self.sentences:
            raise IndexError(f"sentence {b} of a wave of {self.sentences}")
        n = int(self.lengths[b])
        return self.out[b, :n].tolist() if n > 0 else []


cdef class DecoderStep:
    """The decoder's step in C over arrays decoding/cache.py's DecoderCache holds (csrc/decoder.h): the
    same kernels and bits as its Python step. Made once per decoding call; holds every array it
    reads or writes (nothing is copied: the caller must not resize them)."""
    cdef tf_decoder d
    cdef tf_decoder_layer *layers
    cdef list keep
    cdef object logits_buffer
    cdef int level

    def __cinit__(self):
        self.layers = NULL

    def __dealloc__(self):
        free(self.layers)

    def __init__(self, list layers, generator, final_norm, embed, float embed_scale, pe, src_pad,
                 dict buffers, long n_heads, str activation, bint norm_first, float eps=1e-5):
        """layers: per decoder layer a dict of norm1, norm2, norm3 ((weight, bias) float32 [D], or
        ScaleNorm's (g float32 [1], None)),
        qkv, self_out, cross_q, cross_out, linear1, linear2 ((prepared weight, bias), as
        _ds_linear takes), memory_k, memory_v (float32 [B, H, S, dh]), self_k, self_v (float32
        writeable [N, H, Tmax, dh]); or all four caches uint16 holding bf16 (attention_decode). generator: (prepared weight, bias) of [V, D]; final_norm: None
        or a norm as above; embed: float32 [V, D]; pe: float32 [Tmax, D]; src_pad: bool [B, S];
        buffers: writeable float32 arrays named as in _DS_BUFFERS with N rows, disjoint."""
        if not layers:
            raise ValueError("layers must not be empty")
        self.keep = []
        cdef tf_decoder *d = &self.d
        cdef long D, H, Tmax, N, B, S, V, F, dh
        _check_f32(embed, "embed", 2)
        V, D = embed.shape[0], embed.shape[1]
        if n_heads < 1 or D % n_heads:
            raise ValueError(f"n_heads must divide d_model = {D}, got {n_heads}")
        H, dh = n_heads, D // n_heads
        _check_f32(pe, "pe", 2)
        Tmax = pe.shape[0]
        first = layers[0]
        if not isinstance(first, dict):
            raise TypeError(f"layers[0] must be a dict, got {type(first).__name__}")
        _att_cache(first.get("self_k"), "layers[0]['self_k']", True)
        kv = first["self_k"].dtype
        _check(first.get("memory_k"), "layers[0]['memory_k']", kv, 4)
        N, B, S = first["self_k"].shape[0], first["memory_k"].shape[0], first["memory_k"].shape[2]
        F = _ds_buffer(buffers, "ff_pre", N, -1).shape[1]
        d.D, d.H, d.dh, d.d_ff, d.V, d.S, d.Tmax, d.B, d.N = D, H, dh, F, V, S, Tmax, B, N
        d.n_layers = len(layers)
        d.norm_first = norm_first
        d.kv16 = kv == _U16
        d.activation = _ew_activation(activation)
        d.embed_scale, d.scale, d.eps = embed_scale, <float>(1.0 / sqrt(<double>dh)), _eps_arg(eps)
        d.embed = _ds_f32(embed, "embed", (V, D), False)
        d.pe = _ds_f32(pe, "pe", (Tmax, D), False)
        src_pad = _check_mask(src_pad, "src_pad", 2)
        if src_pad.shape != (B, S):
            raise ValueError(f"src_pad must have shape {(B, S)}, got {src_pad.shape}")
        d.src_pad = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>src_pad)
        self.keep += [embed, pe, src_pad]

        _ds_bind(d, buffers, N)
        arrays = {name: buffers[name] for name in _DS_BUFFERS}
        written = [(f"buffers[{k!r}]", a) for k, a in arrays.items()]
        self.logits_buffer = arrays["logits"]
        self.keep += [a for _, a in written]

        self.layers = <tf_decoder_layer *>calloc(len(layers), sizeof(tf_decoder_layer))
        if self.layers == NULL:
            raise MemoryError()
        cdef tf_decoder_layer *w
        cdef int i, j, level
        for i, layer in enumerate(layers):
            if not isinstance(layer, dict):
                raise TypeError(f"layers[{i}] must be a dict, got {type(layer).__name__}")
            w = &self.layers[i]
            for j, part in enumerate(("norm1", "norm2", "norm3")):
                pair = layer.get(part)
                if not isinstance(pair, tuple) or len(pair) != 2:
                    raise TypeError(f"layers[{i}][{part!r}] must be a (weight, bias) tuple")
                if pair[1] is None:     # ScaleNorm: (g [1], None)
                    w.norm_w[j] = _ds_f32(pair[0], f"layers[{i}][{part!r}] gain", (1,), False)
                    w.norm_b[j] = NULL
                    self.keep.append(pair[0])
                    continue
                w.norm_w[j] = _ds_f32(pair[0], f"layers[{i}][{part!r}] weight", (D,), False)
                w.norm_b[j] = _ds_f32(pair[1], f"layers[{i}][{part!r}] bias", (D,), False)
                self.keep += list(pair)
            _ds_linear(&w.qkv, layer.get("qkv"), f"layers[{i}]['qkv']", 3 * D, D, self.keep)
            _ds_linear(&w.self_out, layer.get("self_out"), f"layers[{i}]['self_out']", D, D, self.keep)
            _ds_linear(&w.cross_q, layer.get("cross_q"), f"layers[{i}]['cross_q']", D, D, self.keep)
            _ds_linear(&w.cross_out, layer.get("cross_out"), f"layers[{i}]['cross_out']", D, D, self.keep)
            _ds_linear(&w.linear1, layer.get("linear1"), f"layers[{i}]['linear1']", F, D, self.keep)
            _ds_linear(&w.linear2, layer.get("linear2"), f"layers[{i}]['linear2']", D, F, self.keep)
            w.memory_k = _ds_array(layer.get("memory_k"), f"layers[{i}]['memory_k']", kv, (B, H, S, dh), False)
            w.memory_v = _ds_array(layer.get("memory_v"), f"layers[{i}]['memory_v']", kv, (B, H, S, dh), False)
            w.self_k = _ds_array(layer.get("self_k"), f"layers[{i}]['self_k']", kv, (N, H, Tmax, dh), True)
            w.self_v = _ds_array(layer.get("self_v"), f"layers[{i}]['self_v']", kv, (N, H, Tmax, dh), True)
            self.keep += [layer["memory_k"], layer["memory_v"], layer["self_k"], layer["self_v"]]
            written += [(f"layers[{i}]['self_k']", layer["self_k"]), (f"layers[{i}]['self_v']", layer["self_v"])]
        _ds_linear(&d.generator, generator, "generator", V, D, self.keep)
        d.final_w = d.final_b = NULL
        if final_norm is not None:
            if not isinstance(final_norm, tuple) or len(final_norm) != 2:
                raise TypeError("final_norm must be None or a (weight, bias) tuple")
            if final_norm[1] is None:     # ScaleNorm: (g [1], None)
                d.final_w = _ds_f32(final_norm[0], "final_norm gain", (1,), False)
                self.keep.append(final_norm[0])
            else:
                d.final_w = _ds_f32(final_norm[0], "final_norm weight", (D,), False)
                d.final_b = _ds_f32(final_norm[1], "final_norm bias", (D,), False)
                self.keep += list(final_norm)
        d.layers = self.layers

        # Every array written must be apart from every other array held (those read may share).
        held = [(None, a) for a in self.keep if isinstance(a, np.ndarray)] + \
            [(None, (<PackedMatrix>a).data) for a in self.keep if isinstance(a, PackedMatrix)]
        held = written + [h for h in held if not any(h[1] is a for _, a in written)]
        cdef list spans = []
        cdef size_t lo
        for _, a in held:    # every array here is C-contiguous: [lo, lo + nbytes)
            lo = <size_t>cnp.PyArray_DATA(<cnp.ndarray>a)
            spans.append((lo, lo + a.nbytes))
        for i in range(len(written)):
            for j in range(len(held)):
                if j != i and spans[i][0] < spans[j][1] and spans[j][0] < spans[i][1]:
                    raise ValueError(f"{written[i][0]} must not overlap "
                                     f"{held[j][0] or 'the arrays it reads'}")

        # One instruction set for every prepared weight (the one they were packed for).
        self.level = d.generator.isa
        for i in range(d.n_layers):
            w = &self.layers[i]
            for level in (w.qkv.isa, w.self_out.isa, w.cross_q.isa, w.cross_out.isa, w.linear1.isa,
                          w.linear2.isa):
                if level != self.level:
                    raise ValueError(f"layers[{i}]: weights packed for {tf_isa_name(level).decode()}, "
                                     f"the generator for {tf_isa_name(self.level).decode()}")

    def step(self, ids, Py_ssize_t t, slot, origin, sentence, int groups=1, bint log_softmax=False,
             banned=(), argmax_out=None):
        """Feed ids (int64 [n], in [0, V)) at position t in [0, Tmax); returns logits[:n] (a view of
        the logits buffer, valid until the next step). slot: int64 [>= n], distinct, in [0, N): the
        cache row each row writes; origin: int64 C-contiguous writeable [>= n, Tmax], the cache row
        that computed each earlier step of row r's hypothesis (columns < t in [0, N); column t is
        set to slot); sentence: int64 [>= n] in [0, B). groups: threads that each take a block of
        rows (1: every kernel with the process's team). log_softmax: return log_softmax(logits)
        (computed in place) instead. banned: up to 8 token ids in [0, V) set to -inf in every row
        (after log_softmax). argmax_out: None or int64 writeable [>= n], receiving each row's
        argmax (numpy's) after the bans."""
        cdef tf_decoder *d = &self.d
        if self.level != tf_isa():
            raise ValueError(f"the weights were packed for the {tf_isa_name(self.level).decode()} kernels, the "
                             f"instruction set is now {tf_isa_name(tf_isa()).decode()}: prepare them again")
        _check(ids, "ids", _I64, 1)
        cdef Py_ssize_t n = ids.shape[0]
        if n > d.N:
            raise ValueError(f"ids must have at most N = {d.N} rows, got {n}")
        if not 0 <= t < d.Tmax:
            raise ValueError(f"t must be in [0, {d.Tmax}), got {t}")
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups}")
        _check(slot, "slot", _I64, 1)
        _check(sentence, "sentence", _I64, 1)
        _check(origin, "origin", _I64, 2, True)
        if slot.shape[0] < n or sentence.shape[0] < n:
            raise ValueError(f"slot and sentence must have at least {n} entries, got "
                             f"{slot.shape[0]} and {sentence.shape[0]}")
        if origin.shape[0] < n or origin.shape[1] != d.Tmax:
            raise ValueError(f"origin must be [>= {n}, {d.Tmax}], got shape {origin.shape}")
        cdef int64_t ban[8]
        cdef int n_banned = 0
        if not isinstance(banned, tuple) or len(banned) > 8:
            raise TypeError(f"banned must be a tuple of at most 8 token ids, got {banned!r}")
        for b in banned:
            if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 <= b < d.V:
                raise ValueError(f"banned must hold token ids in [0, {d.V}), got {b!r}")
            ban[n_banned] = b
            n_banned += 1
        cdef int64_t *pa = NULL
        if argmax_out is not None:
            _check(argmax_out, "argmax_out", _I64, 1, True)
            if argmax_out.shape[0] < n:
                raise ValueError(f"argmax_out must have at least {n} entries, got {argmax_out.shape[0]}")
            pa = <int64_t *>cnp.PyArray_DATA(<cnp.ndarray>argmax_out)
        if n == 0:
            return self.logits_buffer[:0]
        cdef const int64_t *pi = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>ids)
        cdef const int64_t *ps = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>slot)
        cdef const int64_t *pn = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>sentence)
        cdef int64_t *po = <int64_t *>cnp.PyArray_DATA(<cnp.ndarray>origin)
        cdef Py_ssize_t r, j, bad = -1, bad_origin = -1
        cdef int which = 0
        cdef unsigned char *seen = <unsigned char *>calloc(d.N, 1)
        if seen == NULL:
            raise MemoryError()
        with nogil:
            for r in range(n):
                if pi[r] < 0 or pi[r] >= d.V:
                    bad, which = r, 1
                    break
                if ps[r] < 0 or ps[r] >= d.N or seen[ps[r]]:
                    bad, which = r, 2
                    break
                seen[ps[r]] = 1
                if pn[r] < 0 or pn[r] >= d.B:
                    bad, which = r, 3
                    break
                for j in range(t):
                    if po[r * d.Tmax + j] < 0 or po[r * d.Tmax + j] >= d.N:
                        bad, bad_origin, which = r, j, 4
                        break
                if which:
                    break
        free(seen)
        if which == 1:
            raise ValueError(f"ids must be in [0, {d.V}), got {ids[bad]} at {bad}")
        if which == 2:
            raise ValueError(f"slot must be distinct values in [0, {d.N}), got {slot[bad]} at {bad}")
        if which == 3:
            raise ValueError(f"sentence must be in [0, {d.B}), got {sentence[bad]} at {bad}")
        if which == 4:
            raise ValueError(f"origin must be in [0, {d.N}), got {origin[bad, bad_origin]} at "
                             f"{(bad, bad_origin)}")
        with nogil:
            c_decoder_step(d, pi, n, t, ps, po, d.Tmax, pn, log_softmax, ban, n_banned, pa, groups)
        return self.logits_buffer[:n]

    cdef long _loop_args(self, limits, min_len, ngram, bos, eos, pad, int groups) except -1:
        """The checks decoder_greedy and decoder_beam share; returns max(limits)."""
        cdef tf_decoder *d = &self.d
        if self.level != tf_isa():
            raise ValueError(f"the weights were packed for the {tf_isa_name(self.level).decode()} kernels, the "
                             f"instruction set is now {tf_isa_name(tf_isa()).decode()}: prepare them again")
        _check(limits, "limits", _I64, 1)
        if limits.shape[0] != d.B:
            raise ValueError(f"limits must have B = {d.B} entries, got {limits.shape[0]}")
        if limits.size and (limits.min() < 1 or limits.max() > d.Tmax):
            raise ValueError(f"limits must be in [1, {d.Tmax}], got {limits.min()} .. {limits.max()}")
        for value, name in ((min_len, "min_len"), (ngram, "ngram")):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        for value, name in ((bos, "bos"), (eos, "eos"), (pad, "pad")):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < d.V:
                raise ValueError(f"{name} must be a token id in [0, {d.V}), got {value!r}")
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups}")
        return int(limits.max()) if limits.size else 0

    cdef object _ban_layout(self, banned, bos, eos, pad):
        """int64 [pad, bos, *banned, eos]: the layout decoder_greedy and decoder_beam read."""
        if not isinstance(banned, tuple):
            raise TypeError(f"banned must be a tuple of token ids, got {type(banned).__name__}")
        for b in banned:
            if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 <= b < self.d.V:
                raise ValueError(f"banned must hold token ids in [0, {self.d.V}), got {b!r}")
        return np.array((pad, bos) + tuple(int(b) for b in banned) + (eos,), np.int64)

    cdef DecoderLoop _greedy_loop(self, limits, min_len, ngram, bos, eos, pad, int groups, banned, bint forced_eos):
        """The arrays of greedy decoding's loop (tf_greedy), checked."""
        cdef tf_decoder *d = &self.d
        if d.N != d.B:
            raise ValueError(f"greedy decoding takes one row per sentence: N = {d.N} rows for B = {d.B}")
        cdef long steps = self._loop_args(limits, min_len, ngram, bos, eos, pad, groups)
        cdef DecoderLoop loop = DecoderLoop.__new__(DecoderLoop)
        loop.step, loop.is_beam, loop.steps = self, False, steps
        bans = self._ban_layout(banned, bos, eos, pad)
        out = np.full((d.B, max(steps, 1)), pad, np.int64)
        lengths = np.zeros(d.B, np.int64)
        scratch = np.zeros((4, d.N), np.int64)
        origin = np.zeros((d.N, d.Tmax), np.int64)
        loop.finished = np.zeros(max(d.B, 1), np.uint8)
        loop.cancelled = np.zeros(max(d.B, 1), np.uint8)
        loop.out, loop.lengths = out, lengths
        loop.keep = [limits, bans, scratch, origin]
        cdef tf_greedy *g = &loop.g
        g.limits = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>limits)
        g.min_len, g.ngram, g.bos, g.eos, g.pad = min_len, ngram, bos, eos, pad
        g.forced_eos, g.n_banned = forced_eos, len(banned)
        g.banned = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>bans)
        g.out = <int64_t *>cnp.PyArray_DATA(<cnp.ndarray>out)
        g.lengths = <int64_t *>cnp.PyArray_DATA(<cnp.ndarray>lengths)
        g.ld_out = out.shape[1]
        cdef int64_t *ps = <int64_t *>cnp.PyArray_DATA(<cnp.ndarray>scratch)
        g.ids, g.slot, g.sentence, g.argmax = ps, ps + d.N, ps + 2 * d.N, ps + 3 * d.N
        g.origin = <int64_t *>cnp.PyArray_DATA(<cnp.ndarray>origin)
        g.poll = &loop.poll
        g.finished = g.cancelled = NULL     # a wave's only (wave())
        loop.wave.greedy, loop.wave.beam = g, NULL
        loop.wave.d = d
        return loop

    def greedy(self, limits, min_len=0, ngram=0, bos=1, eos=2, pad=0, int groups=1, banned=(),
               bint forced_eos=False):
        """Greedy decoding's whole loop in C (csrc/decoder.h: decoder_greedy), one row per sentence
        (N = B). limits: int64 [B], each sentence's most tokens, in [1, Tmax]; min_len: EOS banned
        before it; ngram: the no-repeat-n-gram size (0: off); bos, eos, pad: token ids in [0, V);
        groups: blocks of sentences, each decoded to its end by one thread (1: every kernel with
        the process's team). banned: a tuple of token ids also banned at every step (a model's
        generation settings); forced_eos: EOS at each sentence's last step. Returns (out,
        lengths): int64 [B, max(limits)] holding each sentence's tokens (pad past its last step)
        and int64 [B], the tokens before its EOS, or its limit. Writes the caches and the step
        buffers."""
        cdef DecoderLoop loop = self._greedy_loop(limits, min_len, ngram, bos, eos, pad, groups, banned, forced_eos)
        if self.d.B:
            with nogil:
                c_decoder_greedy(&self.d, &loop.g, groups)
        loop.raise_caught()
        return loop.out[:, :loop.steps], loop.lengths

    cdef DecoderLoop _beam_loop(self, limits, long K, double length_penalty, min_len, ngram, bos, eos, pad,
                                int groups, banned, bint forced_eos, bint renormalize, length_form,
                                early_stopping):
        """The arrays of beam search's loop (tf_beam), checked."""
        cdef tf_decoder *d = &self.d
        if K < 1 or d.N != d.B * K:
            raise ValueError(f"K must be the rows a sentence: N = {d.N} rows for B = {d.B}, got K = {K}")
        if length_form == "generate" and not abs(length_penalty) < float("inf"):   # len ** a: any a
            raise ValueError(f"length_penalty must be finite, got {length_penalty}")
        if length_form != "generate" and not (length_penalty >= 0 and length_penalty < float("inf")):
            raise ValueError(f"length_penalty must be finite and >= 0, got {length_penalty}")
        forms = {"gnmt": 0, "generate": 1}
        if length_form not in forms:
            raise ValueError(f"length_form must be 'gnmt' or 'generate', got {length_form!r}")
        stopping = {True: 1, False: 0, "never": 2}
        if not isinstance(early_stopping, (bool, str)) or early_stopping not in stopping:
            raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
        cdef long steps = self._loop_args(limits, min_len, ngram, bos, eos, pad, groups)
        bans = self._ban_layout(banned, bos, eos, pad)
        cdef long B = d.B, N = d.N, ld = max(steps, 1)
        cdef DecoderLoop loop = DecoderLoop.__new__(DecoderLoop)
        loop.step, loop.is_beam, loop.steps = self, True, steps
        kept = np.zeros(N, np.float64)            # K per sentence
        n_kept = np.zeros(B, np.int64)
        best = np.full((B, ld), pad, np.int64)
        best_len = np.full(B, -1, np.int64)
        f64 = np.zeros(4 * N + B, np.float64)     # scores, new_scores (N each), fin_scores (2N), best_score (B)
        i64 = np.zeros(9 * N + 3 * B, np.int64)   # ids .. tokens (N each), fin_rows, fin_tokens (2N each), 3 x B
        u8 = np.zeros(2 * B, np.uint8)
        origins = np.zeros((2, N, d.Tmax), np.int64)
        hyps = np.zeros((2, N, ld), np.int64)
        loop.finished = np.zeros(max(B, 1), np.uint8)
        loop.cancelled = np.zeros(max(B, 1), np.uint8)
        loop.out, loop.lengths = best, best_len
        loop.keep = [limits, bans, kept, n_kept, f64, i64, u8, origins, hyps]
        cdef double *pf = <double *>cnp.PyArray_DATA(<cnp.ndarray>f64)
        cdef int64_t *pi = <int64_t *>cnp.PyArray_DATA(<cnp.ndarray>i64)
        cdef uint8_t *pu = <uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>u8)
        cdef int64_t *po = <int64_t *>cnp.PyArray_DATA(<cnp.ndarray>origins)
        cdef int64_t *ph = <int64_t *>cnp.PyArray_DATA(<cnp.ndarray>hyps)
        cdef tf_beam *g = &loop.bm
        g.limits = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>limits)
        g.K, g.min_len, g.ngram, g.length_penalty = K, min_len, ngram, length_penalty
        g.bos, g.eos, g.pad = bos, eos, pad
        g.forced_eos, g.renormalize, g.n_banned = forced_eos, renormalize, len(banned)
        g.length_form, g.early_stopping = forms[length_form], stopping[early_stopping]
        g.banned = <const int64_t *>cnp.PyArray_DATA(<cnp.ndarray>bans)
        g.kept = <double *>cnp.PyArray_DATA(<cnp.ndarray>kept)
        g.n_kept = <int64_t *>cnp.PyArray_DATA(<cnp.ndarray>n_kept)
        g.best = <int64_t *>cnp.PyArray_DATA(<cnp.ndarray>best)
        g.best_len = <int64_t *>cnp.PyArray_DATA(<cnp.ndarray>best_len)
        g.ld_best = ld
        g.scores, g.new_scores, g.fin_scores, g.best_score = pf, pf + N, pf + 2 * N, pf + 4 * N
        g.ids, g.slot, g.sentence, g.parents, g.tokens = pi, pi + N, pi + 2 * N, pi + 3 * N, pi + 4 * N
        g.fin_rows, g.fin_tokens = pi + 5 * N, pi + 7 * N
        g.n_finished, g.fin_count, g.live = pi + 9 * N, pi + 9 * N + B, pi + 9 * N + 2 * B
        g.done, g.last_step = pu, pu + B
        g.origin, g.origin_spare = po, po + N * d.Tmax
        g.hyps, g.hyps_spare = ph, ph + N * ld
        g.poll = &loop.poll
        g.finished = g.cancelled = NULL     # a wave's only (wave())
        loop.wave.greedy, loop.wave.beam = NULL, g
        loop.wave.d = d
        return loop

    def beam(self, limits, long K, double length_penalty=0.6, min_len=0, ngram=0, bos=1, eos=2, pad=0,
             int groups=1, banned=(), bint forced_eos=False, bint renormalize=False, length_form="gnmt",
             early_stopping=True):
        """Beam search's whole loop in C (csrc/decoder.h: decoder_beam), K rows a sentence
        (N = B * K). limits, min_len, ngram, bos, eos, pad, groups as in greedy; length_penalty:
        the exponent, finite (and >= 0 for GNMT's form). banned, forced_eos as in greedy; renormalize: every row
        normalised again after the bans; length_form: "gnmt" ((5 + len) / 6) ** alpha or
        "generate" len ** alpha; early_stopping: True (done at K finished), False or "never"
        (generate's rules, csrc/decoder.h). Returns (best, best_len): int64 [B, max(limits)] holding
        each sentence's best-scored finished hypothesis (EOS dropped) and int64 [B], its length
        (-1: none finished). Writes the caches and the step buffers."""
        cdef DecoderLoop loop = self._beam_loop(limits, K, length_penalty, min_len, ngram, bos, eos, pad, groups,
                                                banned, forced_eos, renormalize, length_form, early_stopping)
        if self.d.B:
            with nogil:
                c_decoder_beam(&self.d, &loop.bm, groups)
        loop.raise_caught()
        return loop.out[:, :loop.steps], loop.lengths

    def wave(self, limits, long K=1, double length_penalty=0.6, min_len=0, ngram=0, bos=1, eos=2, pad=0,
             banned=(), bint forced_eos=False, bint renormalize=False, length_form="gnmt", early_stopping=True):
        """This call's sentences as a wave of a DecoderStream (csrc/stream.h), before their first
        step: greedy decoding for K = 1 (arguments as greedy's; length_penalty, renormalize,
        length_form and early_stopping unused), else beam search of K beams (as beam's). Its
        step buffers are unused: the stream's hold every wave's rows."""
        cdef DecoderLoop loop
        if K == 1:
            loop = self._greedy_loop(limits, min_len, ngram, bos, eos, pad, 1, banned, forced_eos)
            loop.g.finished = <uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>loop.finished)
            loop.g.cancelled = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>loop.cancelled)
            loop.g.poll = NULL
        else:
            loop = self._beam_loop(limits, K, length_penalty, min_len, ngram, bos, eos, pad, 1, banned, forced_eos,
                                   renormalize, length_form, early_stopping)
            loop.bm.finished = <uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>loop.finished)
            loop.bm.cancelled = <const uint8_t *>cnp.PyArray_DATA(<cnp.ndarray>loop.cancelled)
            loop.bm.poll = NULL
        loop.K = K
        if self.d.B:
            c_decoder_wave_begin(&loop.wave)
        return loop

def argmax_rows(x, bint reference=False):
    """int64 [n]: each row's argmax as a decoding step takes it (numpy's: the first index of the
    maximum, or of the first NaN), at the SIMD level in use; reference=True: one element at a time
    (the definition). x: float32 C-contiguous [n, V]."""
    _check_f32(x, "x", 2)
    cdef Py_ssize_t n = x.shape[0], V = x.shape[1]
    out = np.zeros(n, np.int64)
    if n == 0 or V == 0:
        return out
    cdef const float[:, ::1] xv = x
    cdef int64_t[::1] ov = out
    cdef int ref = 1 if reference else 0
    with nogil:
        c_argmax_rows(&xv[0, 0], n, V, &ov[0], ref)
    return out
