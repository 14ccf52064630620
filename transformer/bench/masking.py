"""The claim the engine exists to demonstrate: the causal mask makes parallel training exact.

`transformer bench --what masking` shows it in numbers, in two parts.

1. Equivalence and speed. One batch is trained two ways from the same weights:
   - parallel: the masked decoder sees the whole shifted target at once (teacher forcing) and
     one forward/backward gives the loss at every position;
   - autoregressive: for t = 1..T the decoder is fed the prefix tgt_in[:, :t] alone, recomputed
     from scratch, and only position t-1 is scored (every other target is the ignore index);
     the T losses and gradients are summed with the weights that make up the mean.
   With the mask the two give the same loss and gradients (to float32 rounding): position i never
   sees a later position, so it cannot tell the prefix run from the full one. The parallel form
   does one pass instead of T ever longer ones; the speed-up grows with T (8, 32, 128).
   With the mask switched off the parallel loss no longer equals the autoregressive one.

2. Leakage. Two copies of one model learn the built-in reverse task (NOITNETTA) on a fixed set
   of words, one with the causal mask and one without. As in real data, the targets are not a
   pure function of the source: each target letter is replaced by a random one with probability
   NOISE, drawn afresh every time a word is used, so no model can predict those letters from the
   source. Without the mask, target position i attends to position i+1 of the decoder input,
   which IS the token it must predict, noise included, so it learns to copy: its training loss
   falls far lower. Greedy decoding of the very same words, which has no future to copy from,
   then fails, while the masked model decodes the reversal it learned.
"""
import json
import statistics
import sys
import time

import numpy as np

LENGTHS = (8, 32, 128)
# the equivalence model: DESIGN's tiny preset
EQ_SIZES = dict(d_model=128, n_heads=4, d_ff=512, n_encoder_layers=2, n_decoder_layers=2)
EQ_VOCAB, EQ_BATCH, EQ_SRC_LEN = 1000, 8, 32
# the leakage model: small enough to learn the reverse task in seconds
LEAK_SIZES = dict(d_model=64, n_heads=4, d_ff=256, n_encoder_layers=2, n_decoder_layers=2)
LEAK_LR, LEAK_WARMUP = 1e-3, 50     # Adam's step size after a linear warm-up
NOISE = 0.15                        # chance that a training target letter is replaced at random


def _equivalence_model(T, seed=0):
    import transformer as T_

    cfg = T_.ModelConfig(src_vocab_size=EQ_VOCAB, tgt_vocab_size=EQ_VOCAB, dropout=0.0,
                         max_len=max(T, EQ_SRC_LEN) + 1, **EQ_SIZES)
    model = T_.Seq2SeqTransformer(cfg, seed=seed)
    rng = np.random.default_rng([seed, T])
    src = rng.integers(4, EQ_VOCAB, (EQ_BATCH, EQ_SRC_LEN), dtype=np.int64)
    tgt = rng.integers(4, EQ_VOCAB, (EQ_BATCH, T + 1), dtype=np.int64)
    tgt[:, 0] = cfg.bos_id
    return model, src, tgt[:, :-1].copy(), tgt[:, 1:].copy()


def parallel_loss_and_grad(model, src, tgt_in, tgt_out):
    """The masked, parallel decoder: one forward/backward over all T positions."""
    model.zero_grad()
    loss = model.forward_backward(src, tgt_in, tgt_out, label_smoothing=0.0)
    return loss, model.params.flat_grad.copy()


def autoregressive_loss_and_grad(model, src, tgt_in, tgt_out):
    """The decoder fed one position at a time: T recomputations over growing prefixes, each
    scoring only its newest position; mean loss and its gradient over all scored targets."""
    pad = model.cfg.pad_id
    B, T = tgt_in.shape
    counted = tgt_out != pad
    total = int(counted.sum())
    loss, grad = 0.0, np.zeros_like(model.params.flat_grad)
    only_last = np.full((B, T), pad, dtype=tgt_out.dtype)
    for t in range(1, T + 1):
        n = int(counted[:, t - 1].sum())
        if n == 0:
            continue
        only_last[:, :t - 1] = pad
        only_last[:, t - 1] = tgt_out[:, t - 1]
        model.zero_grad()
        # forward_backward gives the mean over this prefix's n scored targets; weight it by n/total
        loss += model.forward_backward(src, tgt_in[:, :t], only_last[:, :t], label_smoothing=0.0) * n / total
        grad += model.params.flat_grad * np.float32(n / total)
    return loss, grad


def _relative(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def _timed(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), (min(times), max(times))


def equivalence(lengths=LENGTHS, repeats=3):
    """Part 1: one record per target length T."""
    records = []
    for T in lengths:
        model, src, tgt_in, tgt_out = _equivalence_model(T)
        loss_p, grad_p = parallel_loss_and_grad(model, src, tgt_in, tgt_out)
        loss_a, grad_a = autoregressive_loss_and_grad(model, src, tgt_in, tgt_out)
        model.decoder.causal = False
        try:
            loss_leak, _ = parallel_loss_and_grad(model, src, tgt_in, tgt_out)
        finally:
            model.decoder.causal = True
        par_s, par_spread = _timed(lambda: parallel_loss_and_grad(model, src, tgt_in, tgt_out), repeats)
        ar_s, ar_spread = _timed(lambda: autoregressive_loss_and_grad(model, src, tgt_in, tgt_out),
                                 max(1, repeats if T <= 32 else 1))
        records.append({"bench": "masking", "part": "equivalence", "T": T,
                        "shape": f"B{EQ_BATCH} S{EQ_SRC_LEN} T{T} V{EQ_VOCAB}",
                        "loss_parallel": loss_p, "loss_autoregressive": loss_a,
                        "loss_rel_diff": abs(loss_p - loss_a) / abs(loss_a),
                        "grad_max_rel_diff": _relative(grad_p, grad_a),
                        "loss_parallel_unmasked": loss_leak,
                        "unmasked_loss_rel_diff": abs(loss_leak - loss_a) / abs(loss_a),
                        "parallel_s": par_s, "parallel_spread_s": par_spread,
                        "autoregressive_s": ar_s, "autoregressive_spread_s": ar_spread,
                        "speedup": ar_s / par_s})
    return records


def _reverse_pool(n, seed):
    """The fixed set of words both models learn: (task, text pairs, id examples)."""
    from ..data import make_example
    from ..tasks import ReverseTask

    task = ReverseTask(min_len=4, max_len=10)
    rng = np.random.default_rng(seed)
    pairs = task.sample(rng, n)
    src_ids = task.src_tokenizer.encode_batch([s for s, _ in pairs])
    tgt_ids = task.tgt_tokenizer.encode_batch([t for _, t in pairs])
    examples = [make_example(s, t, 1, 2) for s, t in zip(src_ids, tgt_ids)]
    return task, pairs, examples


def _train_reverse(causal, steps, pool, batch, seed):
    import transformer as T_

    from ..data import collate

    task, _, examples = pool
    cfg = T_.ModelConfig(src_vocab_size=task.src_tokenizer.vocab_size,
                         tgt_vocab_size=task.tgt_tokenizer.vocab_size, dropout=0.0,
                         max_len=task.max_len + 2, **LEAK_SIZES)
    model = T_.Seq2SeqTransformer(cfg, seed=seed)
    model.decoder.causal = causal
    opt = T_.Adam(model)
    rng = np.random.default_rng(seed)
    losses = []
    t0 = time.perf_counter()
    letters = np.arange(4, cfg.tgt_vocab_size)       # the tokenizer's letters (ids 0-3 reserved)
    for step in range(1, steps + 1):
        idx = rng.choice(len(examples), batch, replace=False)
        src, tgt_in, tgt_out = collate(examples, idx, cfg.pad_id)
        # fresh noise on the letters (BOS, EOS and padding untouched), the same in both views
        noisy = (tgt_out >= 4) & (rng.random(tgt_out.shape) < NOISE)
        tgt_out[noisy] = rng.choice(letters, int(noisy.sum()))
        tgt_in[:, 1:] = np.where(tgt_in[:, 1:] == cfg.pad_id, cfg.pad_id, tgt_out[:, :-1])
        model.zero_grad()
        losses.append(model.forward_backward(src, tgt_in, tgt_out, label_smoothing=0.0))
        T_.clip_grad_norm(model, 1.0)
        opt.step(lr=LEAK_LR * min(1.0, step / LEAK_WARMUP))
    seconds = time.perf_counter() - t0
    return model, float(np.mean(losses[-20:])), seconds


def _accuracy(model, pool, n):
    """Teacher-forced token accuracy (one parallel forward, the mask as trained) and greedy
    decoding exact-match / character accuracy, on the first n training words, against their
    clean (noise-free) targets."""
    from ..data import collate

    task, pairs, examples = pool
    src, tgt_in, tgt_out = collate(examples, list(range(n)), model.cfg.pad_id)
    logits = model.forward(src, tgt_in)
    valid = tgt_out != model.cfg.pad_id
    forced = float(((logits.argmax(-1) == tgt_out) & valid).sum() / valid.sum())
    model.decoder.causal = True           # decoding is causal whatever the training was
    hyps = [task.tgt_tokenizer.decode(h) for h in model.greedy_decode(src, max_len=task.max_len + 1)]
    targets = [t for _, t in pairs[:n]]
    exact = float(np.mean([h == t for h, t in zip(hyps, targets)]))
    chars = float(np.mean([sum(a == b for a, b in zip(h, t)) / len(t) for h, t in zip(hyps, targets)]))
    samples = [f"{s} -> {h}" for (s, _), h in list(zip(pairs, hyps))[:3]]
    return forced, exact, chars, samples


def leakage(steps=1200, pool_size=1024, batch=64, seed=0, evaluate=256):
    """Part 2: one record per mask setting (on, off), same data, steps and initial weights."""
    pool = _reverse_pool(pool_size, seed)
    records = []
    for causal in (True, False):
        model, loss, seconds = _train_reverse(causal, steps, pool, batch, seed)
        forced, exact, chars, samples = _accuracy(model, pool, min(evaluate, pool_size))
        records.append({"bench": "masking", "part": "leakage", "causal_mask": causal, "steps": steps,
                        "train_loss": loss, "teacher_forced_token_accuracy": forced,
                        "greedy_exact_match": exact, "greedy_char_accuracy": chars,
                        "train_seconds": seconds, "samples": samples})
    return records


def table(records):
    eq = [r for r in records if r.get("part") == "equivalence"]
    lk = [r for r in records if r.get("part") == "leakage"]
    lines = []
    if eq:
        lines += ["Parallel (masked, teacher forcing) vs autoregressive (one position at a time):",
                  f"  {'T':>4} {'loss parallel':>14} {'loss autoregr.':>15} {'loss diff':>10} "
                  f"{'grad diff':>10} {'parallel':>10} {'autoregr.':>10} {'speed-up':>9} "
                  f"{'unmasked loss':>14}"]
        for r in eq:
            lines.append(f"  {r['T']:>4} {r['loss_parallel']:>14.6f} {r['loss_autoregressive']:>15.6f} "
                         f"{r['loss_rel_diff']:>10.1e} {r['grad_max_rel_diff']:>10.1e} "
                         f"{r['parallel_s'] * 1e3:>8.1f}ms {r['autoregressive_s'] * 1e3:>8.0f}ms "
                         f"{r['speedup']:>8.1f}x {r['loss_parallel_unmasked']:>14.6f}")
        lines.append("  (diffs are relative: max |parallel - autoregressive| / max |autoregressive|)")
    if lk:
        lines += ["", f"The causal mask switched off (reverse task with {NOISE:.0%} noisy target letters, "
                      f"{lk[0]['steps']} steps; accuracies on the same words, clean targets):",
                  f"  {'mask':>5} {'train loss':>11} {'teacher-forced acc.':>20} {'greedy exact':>13} "
                  f"{'greedy chars':>13}"]
        for r in lk:
            lines.append(f"  {'on' if r['causal_mask'] else 'off':>5} {r['train_loss']:>11.4f} "
                         f"{r['teacher_forced_token_accuracy']:>19.1%} {r['greedy_exact_match']:>13.1%} "
                         f"{r['greedy_char_accuracy']:>13.1%}")
        for r in lk:
            lines.append(f"  mask {'on ' if r['causal_mask'] else 'off'}: " + "; ".join(r["samples"]))
    return "\n".join(lines)


def run(threads=(1,), lengths=LENGTHS, repeats=3, steps=1200, stream=None):
    """Both parts at the largest thread count given; returns the records."""
    import transformer as T_

    prev = T_.get_num_threads()
    T_.set_num_threads(max(threads))
    try:
        records = []
        for record in equivalence(lengths, repeats) + leakage(steps):
            record["threads"] = max(threads)
            records.append(record)
            if stream:
                print(json.dumps(record), file=stream, flush=True)
    finally:
        T_.set_num_threads(prev)
    return records


if __name__ == "__main__":
    print(table(run(stream=sys.stdout)), file=sys.stderr)
