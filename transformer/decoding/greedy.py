"""Greedy decoding: each sentence's most probable token at every step."""
import numpy as np

from .. import _C
from ..precision import check_precision
from . import tuning
from .cache import DecoderCache, _encode_once, _lend_workspace, _return_workspace
from .checks import greedy_args


def greedy_decode(model, src, max_len=None, min_len=0, return_attention=False, no_repeat_ngram=0,
                  precision="fp32", *, forced_eos=False, banned=()):
    """Batched greedy decoding. Returns a list of token-id lists (BOS dropped, cut before EOS).

    Each sentence stops at its length limit: min(max_len, the model's max_len) for an int max_len,
    or with max_len None (the default) min(MAX_LEN_A * its source length + MAX_LEN_B, the model's
    max_len), its source length being its non-pad tokens. EOS is not chosen before min_len tokens.
    no_repeat_ngram=N > 0 never completes an n-gram of N tokens already in the hypothesis
    (Hugging Face's no_repeat_ngram_size; N = 1: no token twice; EOS is never banned, and a row
    with nothing else left may end before min_len; csrc/beam.h: no_repeat_ngram_ban). The
    hypothesis is the generated tokens: Hugging Face counts the start token too, which bans the
    same tokens, since BOS is never generated again.
    With return_attention, also each sentence's last-layer cross-attention [steps, H, S].
    precision: "fp32", "bf16" or "int8" (module docstring).
    The rules of a model's generation settings (generation.py; off by default): forced_eos: a
    sentence's token at its length limit is EOS (generate's forced_eos_token_id); banned: a
    tuple of token ids never chosen (generate's bad_words_ids of one token)."""
    precision = check_precision(precision)
    src, limits, min_len, no_repeat_ngram, rules = greedy_args(model, src, max_len, min_len, no_repeat_ngram,
                                                               forced_eos, banned)
    workspace = _lend_workspace(model)
    try:
        return _greedy_decode(model, src, limits, min_len, no_repeat_ngram, return_attention, workspace,
                              precision, rules)
    finally:
        _return_workspace(model, workspace)


def _greedy_decode(model, src, limits, min_len, no_repeat_ngram, return_attention, workspace, precision,
                   rules):
    cfg = model.cfg
    shared, src_pad = _encode_once(model, src, precision, workspace)
    B = src.shape[0]
    steps = int(limits.max())
    cache = DecoderCache(model, shared, src_pad, 1, steps, keep_attention=return_attention, workspace=workspace)
    if cache._native is not None and not tuning._PYTHON_LOOPS:   # the whole loop in C (decoder_greedy)
        out, lengths = cache._native.greedy(limits, min_len, no_repeat_ngram, cfg.bos_id, cfg.eos_id,
                                            cfg.pad_id, cache._groups(B), banned=rules["banned"],
                                            forced_eos=rules["forced_eos"])
        return [out[b, :lengths[b]].tolist() for b in range(B)]
    out = np.full((B, steps), cfg.pad_id, dtype=np.int64)     # sentence -> its tokens so far
    lengths = limits.copy()                      # a sentence that never ends stops at its limit
    alive = np.arange(B, dtype=np.int64)         # row -> sentence
    ids = np.full(B, cfg.bos_id, dtype=np.int64)
    attention = [[] for _ in range(B)]
    chosen = np.empty(B, np.int64)
    for t in range(steps):
        banned = (cfg.pad_id, cfg.bos_id) + rules["banned"]   # never "nothing" or a second start
        if no_repeat_ngram:
            logits = cache.step(ids, t, banned=banned)
            _C.no_repeat_ngram_ban(logits, out, t, no_repeat_ngram, cfg.eos_id, rows=alive)
            if t < min_len:
                _forbid_eos(logits, cfg.eos_id)
            ids = logits.argmax(axis=1).astype(np.int64)
        else:                                    # the choice made in the step
            cache.step(ids, t, banned=banned + ((cfg.eos_id,) if t < min_len else ()), argmax_out=chosen)
            ids = chosen[:len(ids)].copy()
        if rules["forced_eos"]:                  # generate's row of -inf but EOS at the limit
            ids[limits[alive] == t + 1] = cfg.eos_id
        out[alive, t] = ids
        if return_attention:
            for row, sentence in enumerate(alive):
                attention[sentence].append(cache.attention[-1][row])
            cache.attention.clear()
        finished = ids == cfg.eos_id
        stopped = finished | (limits[alive] == t + 1)   # EOS, or the sentence's last step
        if stopped.any():
            lengths[alive[finished]] = t
            keep = np.flatnonzero(~stopped)
            alive, ids = alive[keep], ids[keep]
            if not len(alive):
                break
            cache.reorder(keep, t, keep)
    hyps = [out[b, :lengths[b]].tolist() for b in range(B)]
    if not return_attention:
        return hyps
    return hyps, [np.stack(a[:len(h) + 1]) if a else np.zeros((0, cfg.n_heads, shared.S), np.float32)
                  for a, h in zip(attention, hyps)]


def _forbid_eos(scores, eos_id):
    """EOS gets -inf (before min_len) where no-repeat-n-gram bans are in play: a row left with no
    other allowed token keeps its EOS score, so the hypothesis ends short of min_len rather than
    continuing with a token that was banned. (Without those bans the step itself bans EOS.)"""
    saved = scores[:, eos_id].copy()
    scores[:, eos_id] = -np.inf
    stuck = ~(scores > -np.inf).any(axis=1)
    scores[stuck, eos_id] = saved[stuck]


def _strip(tokens, eos_id):
    tokens = [int(t) for t in tokens]
    return tokens[:tokens.index(eos_id)] if eos_id in tokens else tokens
