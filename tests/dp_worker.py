"""Run by tests/test_distributed.py, under `mpiexec -n N` or alone: 20 Adam steps of a small model on
fixed global batches, each rank on its shard (rows rank::N), then every rank writes its weights.

    python tests/dp_worker.py OUT_DIR [plain]     # plain: no DataParallel, the whole batch
    python tests/dp_worker.py OUT_DIR stall       # rank 1 answers late: rank 0 times out after 2 s
                                                  # and writes the error to OUT_DIR/stall-<rank>.txt
"""
import os
import sys
import time

import numpy as np

import transformer as T


def batch(step, B=6, S=7, T_=6, vocab=23):
    rng = np.random.default_rng([7, step])
    src = rng.integers(3, vocab, size=(B, S))
    tgt = rng.integers(3, vocab, size=(B, T_ + 1))
    for b in range(B):                       # ragged lengths: padding differs between shards
        src[b, rng.integers(2, S + 1):] = 0
        tgt[b, rng.integers(3, T_ + 2):] = 0
    tgt[:, 0] = 1
    return src, tgt[:, :-1], tgt[:, 1:]


def stall(out):
    from transformer.distributed import DistributedError

    cfg = T.ModelConfig(src_vocab_size=23, tgt_vocab_size=23, d_model=16, n_heads=2, d_ff=32,
                        n_encoder_layers=1, n_decoder_layers=1, dropout=0.0, max_len=16)
    model = T.Seq2SeqTransformer(cfg)
    dp = T.DataParallel(model, timeout=2)
    src, tgt_in, tgt_out = batch(0)
    if dp.rank == 1:
        time.sleep(8)
    try:
        dp.forward_backward(src, tgt_in, tgt_out)
    except DistributedError as exc:
        # a file, not stdout: Abort can end the job before mpiexec forwards what was printed
        with open(os.path.join(out, f"stall-{dp.rank}.txt"), "w") as f:
            f.write(str(exc))
        dp.comm.Abort(3)


def main(out, plain=False):
    cfg = T.ModelConfig(src_vocab_size=23, tgt_vocab_size=23, d_model=32, n_heads=4, d_ff=64,
                        n_encoder_layers=2, n_decoder_layers=2, dropout=0.0, max_len=16)
    rank = 0
    model = T.Seq2SeqTransformer(cfg, seed=11)
    if not plain:
        dp = T.DataParallel(model, bucket_mb=0.01)    # small buckets: several all-reduces per pass
        rank, size = dp.rank, dp.size
        if rank:                                     # rank 0's weights must win
            model.params.flat[:] = np.random.default_rng(rank).standard_normal(model.params.size)
        dp.broadcast_parameters()
    opt = T.Adam(model, lr=3e-3)
    losses = []
    for step in range(20):
        src, tgt_in, tgt_out = batch(step)
        model.zero_grad()
        if plain:
            loss = model.forward_backward(src, tgt_in, tgt_out, label_smoothing=0.1)
        else:
            part = slice(rank, None, size)
            loss = dp.forward_backward(src[part], tgt_in[part], tgt_out[part], label_smoothing=0.1)
        T.clip_grad_norm(model, 0.5)
        opt.step()
        losses.append(loss)
    if not plain:
        dp.check_replicas(step=20, optimizer=opt)
    np.save(os.path.join(out, f"weights-{rank}.npy"), model.params.flat)
    np.save(os.path.join(out, f"losses-{rank}.npy"), np.array(losses))


if __name__ == "__main__":
    mode = sys.argv[2] if len(sys.argv) > 2 else ""
    if mode == "stall":
        stall(sys.argv[1])
    else:
        main(sys.argv[1], plain=mode == "plain")
