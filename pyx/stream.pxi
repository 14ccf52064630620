# Iteration-level batching in C (csrc/stream.h). Included by _C.pyx after decoder.pxi.

cdef class DecoderStream:
    """The step buffers of a stream: rows for every live wave's rows at one step. run() steps
    waves (DecoderStep.wave) together, each wave's rows attending over its own caches; between
    two runs the caller adds waves and drops the finished ones (csrc/stream.h)."""
    cdef dict buffers
    cdef readonly long rows

    def __init__(self, dict buffers, long rows):
        """buffers: writeable float32 arrays named as in DecoderStep's (x, h, tmp, ctx, query: [rows, D];
        qkv: [rows, 3D]; ff_pre, ff_act: [rows, d_ff]; logits: [rows, V]; mean, rstd: [rows]),
        disjoint; their widths are checked against the waves' model at each run."""
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        for name in _DS_BUFFERS:
            _ds_buffer(buffers, name, rows, 0 if name in ("mean", "rstd") else -1)
        self.buffers = {name: buffers[name] for name in _DS_BUFFERS}
        self.rows = rows

    def run(self, list waves, long max_steps, arrived=None, int groups=1, long min_steps=1):
        """Steps the live waves together until, after at least min_steps steps, one of their
        sentences has finished (its wave's finished flag set) or arrived[0] (int32 [1], set by
        another thread) is nonzero, or until max_steps steps are done; returns the steps taken.
        Every wave must come from a DecoderStep over the same prepared weights at the instruction
        set in use, and the live waves' rows must fit the buffers' rows. groups: threads, each
        stepping whole waves (csrc/stream.h; 1: every kernel with the process's team)."""
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups}")
        if max_steps < 0:
            raise ValueError(f"max_steps must be >= 0, got {max_steps}")
        if min_steps < 1:
            raise ValueError(f"min_steps must be >= 1, got {min_steps}")
        cdef const int *pa = NULL
        if arrived is not None:
            _check(arrived, "arrived", np.dtype(np.int32), 1)
            if arrived.shape[0] < 1:
                raise ValueError("arrived must hold one int32")
            pa = <const int *>cnp.PyArray_DATA(<cnp.ndarray>arrived)
        live = [w for w in waves if isinstance(w, DecoderLoop) and (<DecoderLoop>w).wave.loop.n > 0]
        for i, w in enumerate(waves):
            if not isinstance(w, DecoderLoop) or (<DecoderLoop>w).g.finished == NULL and \
                    (<DecoderLoop>w).bm.finished == NULL:
                raise TypeError(f"waves[{i}] must be a wave from DecoderStep.wave, got {type(w).__name__}")
        if not live:
            return 0
        cdef DecoderStep first = <DecoderStep>(<DecoderLoop>live[0]).step
        cdef tf_decoder d = first.d
        cdef DecoderStep other
        cdef long total = 0
        for w in live:
            other = <DecoderStep>(<DecoderLoop>w).step
            if other.level != tf_isa():
                raise ValueError(f"a wave's weights were packed for the {tf_isa_name(other.level).decode()} kernels, "
                                 f"the instruction set is now {tf_isa_name(tf_isa()).decode()}")
            if other.d.generator.w != d.generator.w or other.d.layers[0].qkv.w != d.layers[0].qkv.w \
                    or other.d.n_layers != d.n_layers or other.d.kv16 != d.kv16:
                raise ValueError("every wave of a stream must decode with the same prepared weights")
            total += (<DecoderLoop>w).rows
        if total > self.rows:
            raise ValueError(f"the live waves take {total} rows, the stream holds {self.rows}")
        _ds_bind(&d, self.buffers, self.rows)     # the stream's buffers, as wide as the waves' model
        cdef int n = len(live)
        cdef tf_wave **pw = <tf_wave **>calloc(n, sizeof(tf_wave *))
        if pw == NULL:
            raise MemoryError()
        for i, w in enumerate(live):
            pw[i] = &(<DecoderLoop>w).wave
        cdef long steps
        with nogil:
            steps = c_decoder_stream(&d, pw, n, min_steps, max_steps, pa, groups)
        free(pw)
        return steps
