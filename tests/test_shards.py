"""Sentence shards (transformer/shards.py): a small model's training pass cut into shards of whole
sentences, each on a thread of its own, the shards' gradients summed in shard order.

What must hold: how a batch is cut depends on the batch and the model, never on the threads; the
pass gives the same bits at any thread count; with dropout 0 it equals the whole pass within
float32 rounding (so PyTorch parity carries over; one case is checked against PyTorch directly);
it adds into the gradient buffer as a whole pass does.

Tolerances (relative, per tensor: max|a - b| / max|b|): sharded against whole SHARD_RTOL; against
PyTorch the parity suite's GRAD_RTOL.
"""
import numpy as np
import pytest

import transformer as T
from transformer import shards
from transformer.params import parameter_specs

from conftest import num_threads

SHARD_RTOL = 1e-5
GRAD_RTOL = 1e-3
BASE = dict(src_vocab_size=41, tgt_vocab_size=43, d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2,
            n_decoder_layers=2, max_len=32, norm_first=True)


def config(**changes):
    return T.ModelConfig(**{**BASE, "dropout": 0.0, **changes})


def batch(B=9, S=13, Tt=11, seed=0, vocab=41):
    """Ragged rows: every row ends in its own run of padding, the last rows the longest."""
    rng = np.random.default_rng(seed)
    src = rng.integers(3, vocab, (B, S))
    tgt = rng.integers(3, vocab, (B, Tt + 1))
    tgt[:, 0] = 1
    for b in range(B):
        src[b, 3 + (b * 5) % (S - 3):] = 0
        tgt[b, 3 + (b * 7) % (Tt - 2):] = 0
    return src, tgt[:, :-1].copy(), tgt[:, 1:].copy()


@pytest.fixture
def forced(monkeypatch):
    def force(n):
        monkeypatch.setattr(shards, "forced", n)
    return force


def pass_of(cfg, data, precision="fp32", seed=3, calls=1):
    model = T.Seq2SeqTransformer(cfg, seed=seed)
    losses = [model.forward_backward(*data, label_smoothing=0.1, precision=precision) for _ in range(calls)]
    return losses, model.params.flat_grad.copy()


def rel(a, b):
    return np.abs(np.asarray(a, np.float64) - b).max() / max(np.abs(np.asarray(b, np.float64)).max(), 1e-30)


# -- how a batch is cut ----------------------------------------------------------------------------

def test_a_small_model_with_a_full_batch_is_cut_in_two_and_a_wide_one_is_not():
    small, wide = config(d_model=128), config(d_model=512, n_heads=8)
    assert shards.shard_count(small, 60, 2000) == 2
    assert shards.shard_count(small, 60, 2 * shards.SHARD_MIN_TOKENS - 1) == 1
    assert shards.shard_count(wide, 60, 2000) == 1
    assert shards.shard_count(small, 1, 2000) == 1          # one sentence cannot be cut


def test_the_cut_never_depends_on_the_threads():
    src, _, tgt_out = batch(B=17)
    with num_threads(1):
        one = shards.shard_rows(src, tgt_out, 0, 3)
    with num_threads(2):
        two = shards.shard_rows(src, tgt_out, 0, 3)
    assert one == two


@pytest.mark.parametrize("B,n", [(9, 2), (17, 3), (2, 2), (3, 5), (1, 2)])
def test_shards_are_contiguous_non_empty_and_cover_every_row(B, n):
    src, _, tgt_out = batch(B=B) if B > 1 else tuple(x[:1] for x in batch())
    bounds = shards.shard_rows(src, tgt_out, 0, n)
    assert bounds[0][0] == 0 and bounds[-1][1] == B
    assert all(r0 < r1 for r0, r1 in bounds)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert len(bounds) == min(n, B)


def test_shards_hold_about_equal_work():
    src, _, tgt_out = batch(B=40, S=20, Tt=20, seed=5)
    work = np.count_nonzero(src, axis=1) + np.count_nonzero(tgt_out, axis=1)
    bounds = shards.shard_rows(src, tgt_out, 0, 2)
    parts = [int(work[r0:r1].sum()) for r0, r1 in bounds]
    assert abs(parts[0] - parts[1]) <= work.max(), parts


# -- the pass --------------------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("n", [2, 3])
def test_a_sharded_pass_is_bitwise_the_same_at_one_two_and_three_threads(forced, precision, n):
    """Dropout on: the masks of every shard, the loss and every gradient bit agree. Two shards on
    two threads run as OpenMP lanes (_C.run_lanes), on three threads through Python's threads."""
    forced(n)
    cfg, data = config(dropout=0.2), batch()
    with num_threads(1):
        one = pass_of(cfg, data, precision, calls=2)
    for threads in (2, 3):
        with num_threads(threads):
            other = pass_of(cfg, data, precision, calls=2)
        assert one[0] == other[0], (threads, one[0], other[0])
        assert np.array_equal(one[1], other[1]), \
            f"{threads} threads: max difference {np.abs(one[1] - other[1]).max()}"


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("n", [2, 3, 9])
def test_a_sharded_pass_equals_the_whole_pass_within_rounding(forced, precision, n):
    """Dropout 0: the same loss and gradients as one pass over the whole batch, every tensor; the
    shards' trailing padding is trimmed, which must change nothing."""
    cfg, data = config(), batch()
    forced(1)
    whole_loss, whole = pass_of(cfg, data, precision)
    forced(n)
    loss, grads = pass_of(cfg, data, precision)
    assert abs(loss[0] - whole_loss[0]) <= SHARD_RTOL * abs(whole_loss[0])
    model = T.Seq2SeqTransformer(cfg)
    for name, shape, _ in parameter_specs(cfg):
        lo = model.params.offsets[name]
        part = slice(lo, lo + int(np.prod(shape)))
        if np.abs(whole[part]).max() > 0:
            assert rel(grads[part], whole[part]) < SHARD_RTOL, (name, rel(grads[part], whole[part]))


def test_a_sharded_pass_adds_into_the_gradient_buffer(forced):
    forced(2)
    cfg, data = config(), batch()
    _, once = pass_of(cfg, data)
    _, twice = pass_of(cfg, data, calls=2)
    assert rel(twice, 2 * once) < SHARD_RTOL


def test_a_sharded_pass_matches_pytorch(forced):
    torch = pytest.importorskip("torch")
    from transformer.torch_compat import build_torch_model, torch_loss
    forced(3)
    cfg, (src, tgt_in, tgt_out) = config(norm_first=False), batch(B=7)
    torch.manual_seed(0)
    tm = build_torch_model(cfg)
    tm.train()
    ref_loss = torch_loss(tm, src, tgt_in, tgt_out, 0.1)
    ref_loss.backward()
    ours = T.Seq2SeqTransformer(cfg)
    ours.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    loss, grads = ours.loss_and_grads(src, tgt_in, tgt_out, 0.1)
    assert abs(loss - ref_loss.item()) < 1e-5 * abs(ref_loss.item())
    for name, p in tm.named_parameters():
        ref = p.grad.numpy().astype(np.float64)
        mine = grads[name].astype(np.float64)
        small = np.abs(ref) < 1e-5 * np.abs(ref).max()     # the zero gradients' rounding noise
        ref[small], mine[small] = 0.0, 0.0
        assert rel(mine, ref) < GRAD_RTOL, (name, rel(mine, ref))


def test_replicas_follow_new_weights_and_dropout(forced):
    """A replica reads the model's weights (loaded after the first pass) and its dropout rate."""
    forced(2)
    cfg, data = config(dropout=0.3), batch()
    model = T.Seq2SeqTransformer(cfg, seed=1)
    model.forward_backward(*data)
    other = T.Seq2SeqTransformer(cfg, seed=2)
    model.load_state_dict(other.state_dict())
    model.set_dropout(0.0)
    other.set_dropout(0.0)
    model.zero_grad()
    a = model.forward_backward(*data)
    b = other.forward_backward(*data)
    assert a == b
    assert np.array_equal(model.params.flat_grad, other.params.flat_grad)


def test_a_shard_without_targets_falls_back_to_one_whole_pass(forced):
    forced(2)
    cfg, (src, tgt_in, tgt_out) = config(), batch(B=4)
    src[:2] = 5                        # the first two rows: long sources and no target at all
    tgt_out[:2] = 0
    tgt_in[:2, 1:] = 0
    assert shards.shard_rows(src, tgt_out, 0, 2)[0] == (0, 2)
    loss = T.Seq2SeqTransformer(cfg, seed=3)
    got = loss.forward_backward(src, tgt_in, tgt_out)
    forced(1)
    ref = T.Seq2SeqTransformer(cfg, seed=3)
    assert got == ref.forward_backward(src, tgt_in, tgt_out)
    assert np.array_equal(loss.params.flat_grad, ref.params.flat_grad)


def test_shards_run_on_threads_of_their_own_when_there_are_threads(forced, monkeypatch):
    """Two threads, two shards: the second shard runs on another thread (an OpenMP lane), its kernels
    capped at one thread; the cap is lifted afterwards."""
    import threading
    forced(2)
    seen = []
    original = T.Seq2SeqTransformer._train_pass_whole

    def spy(self, *args, **kwargs):
        seen.append((threading.get_ident(), T.get_num_threads()))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(T.Seq2SeqTransformer, "_train_pass_whole", spy)
    with num_threads(2):
        T.Seq2SeqTransformer(config()).forward_backward(*batch())
        assert T.get_num_threads() == 2
    assert len(seen) == 2 and seen[0][0] != seen[1][0]
    assert [n for _, n in seen] == [1, 1]


@pytest.mark.parametrize("threads", [2, 3])
def test_a_shards_error_reaches_the_caller_and_the_caps_are_lifted(forced, monkeypatch, threads):
    """The second shard fails (on an OpenMP lane at 2 threads, a Python thread at 3): the error is
    raised by forward_backward, and the caller's thread count is whole again."""
    forced(2)
    original = T.Seq2SeqTransformer._train_pass_whole

    def failing(self, *args, **kwargs):
        if self.shards is None:      # a replica: the second shard's model
            raise MemoryError("shard 2 out of memory")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(T.Seq2SeqTransformer, "_train_pass_whole", failing)
    with num_threads(threads):
        model = T.Seq2SeqTransformer(config())
        with pytest.raises(MemoryError, match="shard 2"):
            model.forward_backward(*batch())
        assert T.get_num_threads() == threads


# -- the step's threads ----------------------------------------------------------------------------

@pytest.mark.parametrize("threads, held, lanes", [(4, 2, [2, 2]), (3, 2, [2, 1]), (2, 2, [1, 1])])
def test_a_step_holds_lane_zeros_share_when_there_are_more_threads_than_lanes(forced, monkeypatch, threads,
                                                                              held, lanes):
    """Inside step_threads the calling thread's kernels keep lane 0's share of the threads (its
    team does not shrink for the pass and grow for the optimizer every step), while each shard
    still gets its share of the process's threads, not of the held share; with as many threads
    as lanes nothing is held; afterwards the thread count is whole again."""
    forced(2)
    seen = []
    original = T.Seq2SeqTransformer._train_pass_whole

    def spy(self, *args, **kwargs):
        seen.append(T.get_num_threads())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(T.Seq2SeqTransformer, "_train_pass_whole", spy)
    with num_threads(threads):
        model = T.Seq2SeqTransformer(config())
        with shards.step_threads(model):
            assert T.get_num_threads() == held
            with shards.step_threads(model):         # nested: the outer hold stands
                assert T.get_num_threads() == held
            model.forward_backward(*batch())
            assert T.get_num_threads() == held
        assert T.get_num_threads() == threads
    assert sorted(seen, reverse=True) == lanes


def test_a_step_of_a_model_that_never_shards_holds_nothing(forced):
    forced(1)
    with num_threads(4):
        model = T.Seq2SeqTransformer(config())
        with shards.step_threads(model):
            assert T.get_num_threads() == 4


def test_a_step_that_fails_gives_the_threads_back(forced):
    forced(2)
    with num_threads(4):
        model = T.Seq2SeqTransformer(config())
        with pytest.raises(RuntimeError, match="mid-step"):
            with shards.step_threads(model):
                raise RuntimeError("mid-step")
        assert T.get_num_threads() == 4
        assert shards._held.threads is None


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_held_step_is_bitwise_the_same_at_one_three_and_four_threads(forced, precision):
    """Zeroing, the sharded pass, clipping and Adam inside step_threads, as Trainer.step runs them:
    the same loss and weights, bit for bit."""
    forced(2)
    cfg, data = config(dropout=0.2), batch()

    def steps(threads):
        with num_threads(threads):
            model = T.Seq2SeqTransformer(cfg, seed=3)
            opt = T.Adam(model, lr=1e-3)
            losses = []
            for _ in range(2):
                with shards.step_threads(model):
                    model.zero_grad()
                    losses.append(model.forward_backward(*data, label_smoothing=0.1, precision=precision))
                    T.clip_grad_norm(model, 1.0)
                    opt.step()
            return losses, model.params.flat.copy()

    one = steps(1)
    for threads in (3, 4):
        other = steps(threads)
        assert one[0] == other[0], (threads, one[0], other[0])
        assert np.array_equal(one[1], other[1]), f"{threads} threads"
