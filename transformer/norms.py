"""ScaleNorm and FixNorm ("Transformers without Tears", Nguyen & Salazar 2019; FixNorm from Nguyen &
Chiang 2018): the normalisation lever of issue 57, chosen by ModelConfig.norm and .fix_norm.

- ScaleNorm(x) = x * (g / max(||x||, SCALE_NORM_EPS)) per row, g one learned scalar a norm (started
  at sqrt(d_model)): a LayerNorm without the centring and with one gain for every feature.
- FixNorm: a table's rows read at unit length, W / max(||W_row||, FIX_NORM_EPS) (F.normalize's), for
  every embedding table and the output projection's weight; a logit is then the output bias plus
  |h| times a cosine. The stored weights stay as trained; what reads them reads the unit rows.

Both run on ScaleNorm's two C kernels (csrc/layernorm.h; the decoder's step runs the forward too;
FixNorm is the kernels with g = 1). Everything is row-local (a row's result depends on that row
alone) and every sum runs in a fixed order, so a step keeps its bits at any thread count; the
reference is transformer/torch_compat.py's ScaleNorm and F.normalize.
"""
import numpy as np

from . import _C

__all__ = ["SCALE_NORM_EPS", "FIX_NORM_EPS", "ScaleNorm", "FixNorm", "unit_rows"]

SCALE_NORM_EPS = 1e-5     # Nguyen & Salazar's clamp
FIX_NORM_EPS = 1e-12      # F.normalize's

_f32 = np.float32


_ONE = np.ones(1, _f32)


def unit_rows(table, out=None, norms=None):
    """table's rows at unit length (FixNorm): out [V, D] (a new array when None); norms [V] receives
    max(||row||, eps). ScaleNorm's kernel with g = 1."""
    out = np.empty_like(table) if out is None else out
    norms = np.empty(len(table), _f32) if norms is None else norms
    _C.scalenorm_forward(np.ascontiguousarray(table), _ONE, out, norms, FIX_NORM_EPS)
    return out


class ScaleNorm:
    """ScaleNorm (module docstring) with the LayerNorm interface the layers call (forward,
    backward, and the residual connection fused into the norm: forward_residual,
    backward_residual, on csrc/residual_norm.h's ScaleNorm kernels)."""

    def __init__(self, weight, dweight, ws):
        self.weight, self.dweight, self.ws = weight, dweight, ws     # g [1] and its gradient

    def _buffers(self, x):
        self.norms = self.ws.persistent(self, "norms", (len(x),))
        return self.ws.persistent(self, "out", x.shape)

    def forward(self, x):
        # x [N, D] (kept, not copied: the caller must not overwrite it before backward)
        out = self._buffers(x)
        _C.scalenorm_forward(x, self.weight, out, self.norms, SCALE_NORM_EPS)
        self.x = x
        return out

    def forward_residual(self, sub, linear, residual, dropout, s):
        """As LayerNorm.forward_residual: s = residual + dropout(sub + linear's bias) into s [N, D]
        (kept), and ScaleNorm(s) returned, in one pass."""
        out = self._buffers(s)
        _C.residual_scalenorm_forward(sub, linear.bias, residual, s, self.weight, out, self.norms,
                                      SCALE_NORM_EPS, *dropout.call())
        self.x = s
        return out

    def backward(self, dout, dx, accumulate=False):
        # dout [N, D]; dx [N, D] (may be dout when not accumulate)
        _C.scalenorm_backward(dout, self.x, self.norms, self.weight, dx, self.dweight, SCALE_NORM_EPS, accumulate)
        return dx

    def backward_residual(self, dout, linear, dropout, tmp):
        """As LayerNorm.backward_residual: dout becomes d s; returns the sub-layer output's gradient
        (in tmp, or dout itself when dropout is off) and adds its column sums into linear's bias
        gradient."""
        p, seed, offset = dropout.call()
        dd = tmp if p > 0.0 else None
        _C.residual_scalenorm_backward(dout, self.x, self.norms, self.weight, dout, dd, self.dweight, linear.dbias,
                                       SCALE_NORM_EPS, p, seed, offset)
        return dout if dd is None else dd


class FixNorm:
    """A table read at unit rows by its readers (the embeddings, the output projection): `unit` is
    what they read and `dunit` where their backward passes add; refresh() before a pass (and zero
    dunit for a training pass), backward() after the last reader's backward adds the table's
    gradient.

    A table that only embeddings read is refreshed and differentiated, in a training pass, at the
    rows the pass looks up (refresh(training, rows), backward(rows)): every other row's gradient
    through the normalisation is exactly +0 (its dunit row is zero), and adding it leaves the
    gradient as it was, so the bits are the whole table's. The backward zeroes the dunit rows it
    read, so the next pass finds dunit clean without a fill (`clean`; a pass that stopped half-way
    leaves it unclean, and the next refresh fills)."""

    def __init__(self, table, dtable):
        self.table, self.dtable = table, dtable
        self.unit = np.zeros_like(table)
        self.dunit = np.zeros_like(table)
        self.norms = np.empty(len(table), _f32)
        self.clean = True

    def refresh(self, training, rows=None):
        """The unit rows from the table as it is now: every row, or `rows` (strictly increasing
        indices) for a training pass that reads no others."""
        if rows is None:
            unit_rows(self.table, self.unit, self.norms)
        else:
            _C.scalenorm_forward_at(self.table, _ONE, self.unit, self.norms, rows, FIX_NORM_EPS)
        if training:
            if not self.clean:
                self.dunit.fill(0.0)
            self.clean = False

    def backward(self, rows=None):
        """The table's gradient through the normalisation, added into dtable: every row, or `rows`
        (those refresh made), whose dunit rows are then zeroed."""
        if rows is None:
            _C.scalenorm_backward(self.dunit, self.table, self.norms, _ONE, self.dtable, None, FIX_NORM_EPS, True)
            return
        _C.scalenorm_backward_at(self.dunit, self.table, self.norms, _ONE, self.dtable, rows, FIX_NORM_EPS)
        self.clean = True
