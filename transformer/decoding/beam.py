"""Beam search: the beam_size best hypotheses of each sentence at every step, ranked by
log-probability over a length penalty."""
import numpy as np

from .. import _C
from ..precision import check_precision
from . import tuning
from .cache import DecoderCache, _encode_once, _lend_workspace, _return_workspace
from .checks import beam_args
from .greedy import _forbid_eos


def beam_search(model, src, beam_size=4, max_len=None, length_penalty=0.6, min_len=0, no_repeat_ngram=0,
                precision="fp32", *, forced_eos=False, banned=(), renormalize=False, length_form="gnmt",
                early_stopping=True, n_best=1):
    """Batched beam search. Returns the best hypothesis per sentence (token-id lists, BOS dropped,
    cut before EOS), ranked by log-probability / ((5 + length) / 6) ** length_penalty.

    A hypothesis that emits EOS is finished and kept; a sentence is done once it has beam_size
    finished hypotheses, or at its length limit (as in greedy_decode: max_len, or with max_len
    None one relative to its source length), where its live beams are finished as they stand.
    Each step's candidates (every beam times every token, scored by the beam's log-probability
    plus the token's) are ranked best first, ties by beam then token; csrc/beam.c does the ranking
    and the walk through it, Python only records finished hypotheses. no_repeat_ngram as in
    greedy_decode, applied to each beam's own hypothesis after the log-softmax (the banned tokens'
    probability is not given to the others, as in Hugging Face's beam search). precision as in
    greedy_decode.

    The rules of a model's generation settings (generation.py, csrc/decoder.h; the defaults
    are the rules above): forced_eos and banned as in greedy_decode (the forced EOS adds 0 to
    its hypothesis's score); renormalize: each row normalised again after the bans (generate's
    renormalize_logits); length_form "generate": scores divided by length ** length_penalty
    instead of GNMT's; early_stopping False or "never": generate's stopping rules instead of
    stopping at beam_size finished hypotheses.

    n_best > 1: for each sentence, a list of its best finished hypotheses, at most n_best, best
    first (the first is the one n_best 1 gives; LibreTranslate's alternatives). The C loop keeps
    only the best, so these run the same steps in Python (the same kernels, the same bits).
    """
    precision = check_precision(precision)
    src, K, limits, min_len, no_repeat_ngram, rules = _checked_n_best(
        model, src, beam_size, max_len, length_penalty, min_len, no_repeat_ngram, precision, forced_eos, banned,
        renormalize, length_form, early_stopping, n_best)
    workspace = _lend_workspace(model)
    try:
        return _beam_search(model, src, K, limits, float(length_penalty), min_len, no_repeat_ngram,
                            workspace, precision, rules, int(n_best))
    finally:
        _return_workspace(model, workspace)


def _checked_n_best(model, src, beam_size, max_len, length_penalty, min_len, no_repeat_ngram, precision,
                    forced_eos, banned, renormalize, length_form, early_stopping, n_best):
    """beam_args, after n_best is checked: what beam_search and beam_search_steps both start with."""
    if isinstance(n_best, bool) or not isinstance(n_best, (int, np.integer)) or n_best < 1:
        raise ValueError(f"n_best must be an int >= 1, got {n_best!r}")
    return beam_args(model, src, beam_size, max_len, length_penalty, min_len, no_repeat_ngram, precision,
                     forced_eos, banned, renormalize, length_form, early_stopping)


def beam_search_steps(model, src, beam_size=4, max_len=None, length_penalty=0.6, min_len=0, no_repeat_ngram=0,
                      precision="fp32", *, forced_eos=False, banned=(), renormalize=False, length_form="gnmt",
                      early_stopping=True, n_best=1, workspace=None):
    """beam_search one step at a time: a generator that yields None after each decoder step and
    returns (StopIteration.value, or `yield from`) what beam_search returns for the same arguments,
    by the same steps in Python (the same kernels, the same bits). Its caller may do other work
    between two steps, as the server's scheduler runs its stream between an n-best request's steps
    (serve/scheduler.py), so that a request of wide beams over many sentences holds up the others
    for a step at a time, not for its whole batch. The caller drives it from one thread; closing it
    early (close(), or dropping it) ends the search.

    workspace: a dict the search keeps its buffers in (prepared weights, caches), the caller's to
    keep for its next search (fresh memory costs a page fault per 4 KiB, and the weights are
    prepared again); no other call may use it until this one ends. Not the model's own
    (_lend_workspace): other decoding calls of the model may run between two of its steps."""
    precision = check_precision(precision)
    src, K, limits, min_len, no_repeat_ngram, rules = _checked_n_best(
        model, src, beam_size, max_len, length_penalty, min_len, no_repeat_ngram, precision, forced_eos, banned,
        renormalize, length_form, early_stopping, n_best)
    workspace = {} if workspace is None else workspace
    shared, src_pad = _encode_once(model, src, precision, workspace)
    cache = DecoderCache(model, shared, src_pad, K, int(limits.max()), workspace=workspace)
    return (yield from _beam_steps(model, cache, K, limits, float(length_penalty), min_len, no_repeat_ngram, rules,
                                   int(n_best)))


def _beam_search(model, src, K, limits, length_penalty, min_len, no_repeat_ngram, workspace, precision, rules,
                 n_best=1):
    cfg = model.cfg
    shared, src_pad = _encode_once(model, src, precision, workspace)
    B = src.shape[0]
    max_len = int(limits.max())
    cache = DecoderCache(model, shared, src_pad, K, max_len, workspace=workspace)
    if cache._native is not None and not tuning._PYTHON_LOOPS and n_best == 1:   # the whole loop in C (decoder_beam)
        best, best_len = cache._native.beam(limits, K, length_penalty, min_len, no_repeat_ngram, cfg.bos_id,
                                            cfg.eos_id, cfg.pad_id, min(cache._groups(B * K), B), **rules)
        return [best[b, :best_len[b]].tolist() if best_len[b] >= 0 else [] for b in range(B)]   # -1: none finished
    steps = _beam_steps(model, cache, K, limits, length_penalty, min_len, no_repeat_ngram, rules, n_best)
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value


def _beam_steps(model, cache, K, limits, length_penalty, min_len, no_repeat_ngram, rules, n_best):
    """The Python loop of beam search over `cache`'s sentences: yields after each step, returns the
    hypotheses (beam_search's docstring)."""
    cfg = model.cfg
    eos = cfg.eos_id
    B = cache.N // K
    max_len = int(limits.max())
    sentences = np.arange(B)                      # live sentence slots -> sentence index
    scores = np.full((B, K), -np.inf, dtype=np.float64)
    scores[:, 0] = 0.0                            # one live beam at first: the others are copies
    n_finished = np.zeros(B, dtype=np.int64)      # len(finished[sentences[slot]]) per slot
    finished = [[] for _ in range(B)]             # (normalised score, tokens)
    early = rules["early_stopping"]
    kept = [[] for _ in range(B)]                 # early_stopping False / "never": the K best scores

    def norm(length):
        return _length_penalty(length, length_penalty, rules["length_form"])
    hyps = np.full((B * K, max_len), cfg.pad_id, dtype=np.int64)   # live row -> its tokens so far
    spare = np.empty_like(hyps)
    ids = np.full(B * K, cfg.bos_id, dtype=np.int64)
    # beam_select's outputs, written every step (the new beams, the hypotheses just finished).
    parents, tokens = np.empty(B * K, np.int64), np.empty(B * K, np.int64)
    new_scores, done = np.empty((B, K)), np.empty(B, np.uint8)
    fin_rows, fin_tokens = np.empty((B, 2 * K), np.int64), np.empty((B, 2 * K), np.int64)
    fin_scores, fin_count = np.empty((B, 2 * K)), np.empty(B, np.int64)
    last_step = np.empty(B, np.uint8)             # per slot: its sentence's final step
    for t in range(max_len):
        nb = len(sentences)
        n = nb * K
        # never "nothing" or a second start; banned after the normalisation, as Hugging Face's
        # generate does, so a hypothesis's score is the model's log-probability of its tokens
        logp = cache.step(ids, t, log_softmax=True, banned=(cfg.pad_id, cfg.bos_id) + rules["banned"])
        banned = eos if t < min_len else -1
        if no_repeat_ngram:
            _C.no_repeat_ngram_ban(logp, hyps, t, no_repeat_ngram, eos)
            if banned >= 0:                       # EOS stays where nothing else is left
                _forbid_eos(logp, eos)
                banned = -1
        last_step[:nb] = limits[sentences] == t + 1
        if rules["renormalize"] and banned >= 0:  # generate bans EOS before it renormalises
            _forbid_eos(logp, eos)
            banned = -1
        if rules["forced_eos"]:                   # generate's ForcedEOS after the log_softmax
            forced = np.repeat(last_step[:nb].astype(bool), K)
            logp[forced] = -np.inf
            logp[forced, eos] = 0.0
        if rules["renormalize"]:
            _C.log_softmax(logp, logp)
        _C.beam_select(logp, scores[:nb], n_finished[:nb], banned, eos,
                       last_step[:nb], parents[:n], tokens[:n], new_scores[:nb], done[:nb],
                       fin_rows[:nb], fin_tokens[:nb], fin_scores[:nb], fin_count[:nb],
                       early_stopping=early is True)
        for slot in np.flatnonzero(fin_count[:nb]).tolist():
            hypotheses = finished[sentences[slot]]
            for row, token, score in zip(fin_rows[slot, :fin_count[slot]].tolist(),
                                         fin_tokens[slot, :fin_count[slot]].tolist(),
                                         fin_scores[slot, :fin_count[slot]]):
                hypothesis = hyps[row, :t].tolist() + ([] if token == eos else [token])
                hypotheses.append((score / norm(t + 1), hypothesis))
                if early is not True:
                    kept[sentences[slot]] = sorted(kept[sentences[slot]] + [score / norm(t + 1)], reverse=True)[:K]
        if early is not True:                     # generate's early-stopping heuristic (decoder.h)
            for slot in range(nb):
                best_kept = kept[sentences[slot]]
                if done[slot] or len(best_kept) < K:
                    continue
                length = limits[sentences[slot]] if early == "never" and length_penalty > 0 else t + 1
                if not new_scores[slot, 0] / norm(length) > best_kept[-1]:
                    done[slot] = 1
        if done[:nb].all():
            break
        if done[:nb].any():                       # drop the finished sentences' rows
            live = np.flatnonzero(done[:nb] == 0)
            keep = (live[:, None] * K + np.arange(K)).ravel()
            chosen = parents[keep]
            cache.reorder(chosen, t, keep)
            ids = tokens[keep]
            m = len(live)
            scores[:m], n_finished[:m] = new_scores[live], n_finished[live]
            sentences = sentences[live]
        else:
            chosen = parents[:n]
            cache.reorder(chosen, t)
            ids = tokens[:n]
            scores[:nb] = new_scores[:nb]
        m = len(ids)
        np.take(hyps[:, :t], chosen, axis=0, out=spare[:m, :t])
        spare[:m, t] = ids
        hyps, spare = spare, hyps
        yield
    if n_best > 1:              # a stable sort: among equal scores the first finished, as max() takes
        return [[h for _, h in sorted(f, key=lambda item: item[0], reverse=True)[:n_best]] or [[]] for f in finished]
    return [max(f, key=lambda item: item[0])[1] if f else [] for f in finished]


def _length_penalty(length, alpha, form="gnmt"):
    """GNMT's length normalisation ((5 + |Y|) / 6) ** alpha (Wu et al. 2016), or generate's
    |Y| ** alpha (form "generate")."""
    return float(length) ** alpha if form == "generate" else ((5.0 + length) / 6.0) ** alpha
