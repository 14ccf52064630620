"""Benchmark: embedding, bias + activation, residual add and dropout against PyTorch at the same
thread count.

Each measurement times ours and the PyTorch equivalent interleaved in the same loop (after a
warm-up), takes the median of `repeats` batches, and reports seconds per call, GB/s (bytes the op
must read and write once) and ratio = torch time / our time (> 1: we are faster).

PyTorch equivalents (preallocated outputs through out= where torch has one, so neither side pays
for page faults):
- embedding forward: F.embedding(ids, W) * scale + pe[:T] (three ops, as nn.Transformer users write).
- embedding backward: torch.autograd.grad of that expression w.r.t. W (dense [V, D] gradient, what
  autograd runs); ours adds scale * dout into the rows of an existing gradient buffer.
- bias_act forward: x.add_(b); gelu/relu(x, out=y) (ours: the fused bias_act_forward).
- act backward: aten gelu_backward / threshold_backward with grad_input= (what autograd runs).
- add: torch.add(a, b, out=c).
- add_bias: x.add_(b); bias_grad: torch.sum(dout, 0, out=db) (ours adds into db).
- dropout forward: F.dropout(x, p, training=True); backward: torch.autograd.grad through it.
- dropout_add (ours fused): residual + F.dropout(x, p, training=True); with a bias:
  residual + F.dropout(x + b, p, training=True).

python -m transformer.bench.elementwise  prints one JSON line per measurement.
"""

import numpy as np

from .harness import engine_threads, kernel_record, print_records, time_pair

EMBEDDING_SHAPES = [(32, 32, 128, 4000), (16, 64, 512, 8000)]   # B, T, D, V
ACT_SHAPE = (2048, 2048)
ADD_SHAPE = (1024, 512)
BIAS_SHAPE = (1024, 2048)
DROPOUT_SHAPE = (1024, 512)
DROPOUT_P = 0.1


def _embedding(torch, _C, threads, repeats):
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    out = []
    for B, T, D, V in EMBEDDING_SHAPES:
        ids = rng.integers(0, V, size=(B, T)).astype(np.int64)
        table = rng.standard_normal((V, D)).astype(np.float32)
        pe = rng.standard_normal((T, D)).astype(np.float32)
        dout = rng.standard_normal((B, T, D)).astype(np.float32)
        y = np.empty((B, T, D), np.float32)
        dtable = np.zeros((V, D), np.float32)
        scale = float(np.sqrt(D))
        ids_t, W, pe_t, g_t = (torch.from_numpy(ids), torch.from_numpy(table.copy()).requires_grad_(),
                               torch.from_numpy(pe), torch.from_numpy(dout))
        shape = (B, T, D, V)

        def ours_fwd():
            _C.embedding_forward(ids, table, y, scale, pe, 0)

        def ref_fwd():
            with torch.no_grad():
                F.embedding(ids_t, W) * scale + pe_t

        o, r = time_pair(ours_fwd, ref_fwd, repeats)
        out.append(kernel_record("embedding_forward", shape, threads, o, r, (2 * B * T * D + T * D) * 4 + B * T * 8))

        y_t = F.embedding(ids_t, W) * scale + pe_t

        def ours_bwd():
            _C.embedding_backward(ids, dout, dtable, scale)

        def ref_bwd():
            torch.autograd.grad(y_t, W, g_t, retain_graph=True)

        o, r = time_pair(ours_bwd, ref_bwd, repeats)
        out.append(kernel_record("embedding_backward", shape, threads, o, r, 3 * B * T * D * 4 + B * T * 8,
                                 note="torch builds a dense [V, D] gradient; ours adds into one"))
    return out


def _activations(torch, _C, threads, repeats):
    N, D = ACT_SHAPE
    rng = np.random.default_rng(1)
    x = rng.standard_normal((N, D)).astype(np.float32)
    bias = (rng.standard_normal(D) * 1e-3).astype(np.float32)  # repeated in-place adds barely drift
    g = rng.standard_normal((N, D)).astype(np.float32)
    y, dx = np.empty_like(x), np.empty_like(x)
    xt, bt, gt = torch.from_numpy(x.copy()), torch.from_numpy(bias), torch.from_numpy(g)
    yt, dxt = torch.empty_like(xt), torch.empty_like(xt)
    aten = torch.ops.aten
    out = []
    for act in ("relu", "gelu"):
        def ours_fwd():
            _C.bias_act_forward(x, bias, y, act)

        if act == "gelu":
            def ref_fwd():
                xt.add_(bt)
                aten.gelu.out(xt, out=yt)

            def ref_bwd():
                aten.gelu_backward.grad_input(gt, xt, grad_input=dxt)
        else:
            def ref_fwd():
                xt.add_(bt)
                torch.clamp_min(xt, 0, out=yt)

            def ref_bwd():
                aten.threshold_backward.grad_input(gt, xt, 0, grad_input=dxt)

        def ours_bwd():
            _C.act_backward(g, x, dx, act)

        o, r = time_pair(ours_fwd, ref_fwd, repeats)
        out.append(kernel_record(f"bias_{act}_forward", ACT_SHAPE, threads, o, r, 3 * N * D * 4 + D * 4))
        o, r = time_pair(ours_bwd, ref_bwd, repeats)
        out.append(kernel_record(f"{act}_backward", ACT_SHAPE, threads, o, r, 3 * N * D * 4))
    return out


def _add_and_dropout(torch, _C, threads, repeats):
    F = torch.nn.functional
    rng = np.random.default_rng(2)
    out = []
    a = rng.standard_normal(ADD_SHAPE).astype(np.float32)
    b = rng.standard_normal(ADD_SHAPE).astype(np.float32)
    c = np.empty_like(a)
    at, bt, ct = torch.from_numpy(a), torch.from_numpy(b), torch.empty(ADD_SHAPE)
    o, r = time_pair(lambda: _C.add(a, b, c), lambda: torch.add(at, bt, out=ct), repeats)
    out.append(kernel_record("add", ADD_SHAPE, threads, o, r, 3 * a.size * 4))

    N, D = BIAS_SHAPE
    h = rng.standard_normal(BIAS_SHAPE).astype(np.float32)
    bias = (rng.standard_normal(D) * 1e-3).astype(np.float32)
    dbias = np.zeros(D, np.float32)
    ht, bias_t, dbias_t = torch.from_numpy(h.copy()), torch.from_numpy(bias), torch.zeros(D)
    o, r = time_pair(lambda: _C.add_bias(h, bias), lambda: ht.add_(bias_t), repeats)
    out.append(kernel_record("add_bias", BIAS_SHAPE, threads, o, r, 2 * h.size * 4))
    o, r = time_pair(lambda: _C.bias_grad(h, dbias), lambda: torch.sum(ht, 0, out=dbias_t), repeats)
    out.append(kernel_record("bias_grad", BIAS_SHAPE, threads, o, r, h.size * 4))

    x = rng.standard_normal(DROPOUT_SHAPE).astype(np.float32)
    g = rng.standard_normal(DROPOUT_SHAPE).astype(np.float32)
    y, dx = np.empty_like(x), np.empty_like(x)
    xt = torch.from_numpy(x.copy()).requires_grad_()
    gt = torch.from_numpy(g)
    counter = [0]

    def ours_fwd():
        counter[0] += x.size          # a fresh mask per call, as in training
        _C.dropout_forward(x, y, DROPOUT_P, 1234, counter[0])

    def ref_fwd():
        with torch.no_grad():
            F.dropout(xt, DROPOUT_P, training=True)

    o, r = time_pair(ours_fwd, ref_fwd, repeats)
    out.append(kernel_record("dropout_forward", DROPOUT_SHAPE, threads, o, r, 2 * x.size * 4, p=DROPOUT_P))
    yt = F.dropout(xt, DROPOUT_P, training=True)
    o, r = time_pair(lambda: _C.dropout_backward(g, dx, DROPOUT_P, 1234, 0),
                     lambda: torch.autograd.grad(yt, xt, gt, retain_graph=True), repeats)
    out.append(kernel_record("dropout_backward", DROPOUT_SHAPE, threads, o, r, 2 * x.size * 4, p=DROPOUT_P))
    res = rng.standard_normal(DROPOUT_SHAPE).astype(np.float32)
    res_t = torch.from_numpy(res)

    def ref_add():
        with torch.no_grad():
            res_t + F.dropout(xt, DROPOUT_P, training=True)

    o, r = time_pair(lambda: _C.dropout_add_forward(x, res, y, DROPOUT_P, 1234, 0), ref_add, repeats)
    out.append(kernel_record("dropout_add_forward", DROPOUT_SHAPE, threads, o, r, 3 * x.size * 4, p=DROPOUT_P))
    b = (rng.standard_normal(DROPOUT_SHAPE[1]) * 1e-3).astype(np.float32)
    b_t = torch.from_numpy(b)

    def ref_bias_add():
        with torch.no_grad():
            res_t + F.dropout(xt + b_t, DROPOUT_P, training=True)

    o, r = time_pair(lambda: _C.dropout_add_forward(x, res, y, DROPOUT_P, 1234, 0, bias=b), ref_bias_add,
                     repeats)
    out.append(kernel_record("bias_dropout_add_forward", DROPOUT_SHAPE, threads, o, r, 3 * x.size * 4, p=DROPOUT_P))
    return out


def run(threads=(1, 2), repeats=9):
    """One record per (kernel, shape, thread count); see the module docstring."""
    import torch

    from transformer import _C

    records = []
    with engine_threads(torch) as set_threads:
        for n in threads:
            set_threads(n)
            records += _embedding(torch, _C, n, repeats)
            records += _activations(torch, _C, n, repeats)
            records += _add_and_dropout(torch, _C, n, repeats)
    return records


if __name__ == "__main__":
    print_records(run())
