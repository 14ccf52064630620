"""The arguments of a decoding call checked, before any work: token ids, length limits, the
rules of a model's generation settings, and the memory its caches would need."""
import math

import numpy as np

from .. import cgroups
from .tuning import cache_dtype


# The length limit when a call passes max_len=None: per sentence, MAX_LEN_A * (its source's
# non-pad tokens) + MAX_LEN_B, clamped to the model's max_len; fairseq's --max-len-a/--max-len-b
# and Marian's --max-length-factor bound the output the same way, so a model that never emits EOS
# (untrained, or stuck repeating itself) stops at a length that fits its input.
MAX_LEN_A = 2
MAX_LEN_B = 10


def _check_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")


def _check_decode_args(model, src, max_len, min_len, no_repeat_ngram):
    """src as int64 ids; each sentence's length limit (int64 [B]); min_len; no_repeat_ngram.

    An int max_len is one limit for every sentence, clamped to the model's max_len, and min_len
    must be in [0, that limit]. max_len None gives each sentence its own limit (MAX_LEN_A,
    MAX_LEN_B above); min_len must then be in [0, the model's max_len], and a sentence whose limit
    is shorter stops at its limit (min_len is clamped to it)."""
    cfg = model.cfg
    src = model.check_ids(src, "src", cfg.src_vocab_size)
    if max_len is not None:
        _check_int(max_len, "max_len")
    _check_int(min_len, "min_len")
    _check_int(no_repeat_ngram, "no_repeat_ngram")
    # Positions beyond the model's max_len have no positional encoding: generation stops there.
    if max_len is None:
        source_lengths = (src != cfg.pad_id).sum(axis=1)
        limits = np.minimum(MAX_LEN_A * source_lengths + MAX_LEN_B, cfg.max_len).astype(np.int64)
        if not 0 <= min_len <= cfg.max_len:
            raise ValueError(f"min_len must be in [0, the model's max_len={cfg.max_len}], got {min_len}")
    else:
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        max_len = min(int(max_len), cfg.max_len)
        if not 0 <= min_len <= max_len:
            raise ValueError(f"min_len must be in [0, max_len={max_len}], got {min_len}")
        limits = np.full(src.shape[0], max_len, np.int64)
    if no_repeat_ngram < 0:
        raise ValueError(f"no_repeat_ngram must be >= 0 (0: off), got {no_repeat_ngram}")
    # an n-gram longer than the model's positions occurs in no output, once or twice: such an n bans
    # nothing, as cfg.max_len + 2 bans nothing, and that one fits the C loop's integers (2 ** 63 did not)
    return src, limits, int(min_len), int(min(no_repeat_ngram, cfg.max_len + 2))


def row_bytes(cfg, steps, precision="fp32"):
    """Bytes a decoder row of up to `steps` steps holds: its keys and values cached at every layer;
    its logits and step buffers; its origin and hypothesis tables."""
    cache = np.dtype(cache_dtype(precision)).itemsize
    return cache * 2 * cfg.n_decoder_layers * steps * cfg.d_model \
        + 4 * (cfg.tgt_vocab_size + 8 * cfg.d_model + 2 * cfg.d_ff) + 8 * 4 * steps


def _check_memory(cfg, rows, steps, what, precision="fp32"):
    """MemoryError naming `what` when a decoding loop of `rows` rows and `steps` steps needs more
    memory for its caches and step buffers than this process may fill, the machine's or, tighter,
    its cgroup's limit (a container's --memory): numpy would reserve them all the same (the system
    promises memory it has not got), and the process would then fill them until the machine swaps
    or kills it (a --beam of 100000 ran for minutes, growing); under a cgroup's limit the kernel
    kills it at the limit."""
    total, source = cgroups.usable_memory()
    if total is None:
        return
    need = rows * row_bytes(cfg, steps, precision)
    if need > total:
        raise MemoryError(f"{what}: {rows:,} decoder rows of up to {steps} steps need {cgroups.size_text(need)} "
                          f"for their caches, more than {cgroups.room_text(total, source)}")


def _check_bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _check_rules(model, forced_eos, banned, **flags):
    """The generation settings' rules of a decoding call, checked: {"forced_eos": bool,
    "banned": tuple of token ids, and each of `flags` as a bool}."""
    rules = {"forced_eos": _check_bool(forced_eos, "forced_eos")}
    if not isinstance(banned, (tuple, list)):
        raise TypeError(f"banned must be a tuple of token ids, got {type(banned).__name__}")
    V = model.cfg.tgt_vocab_size
    for token in banned:
        if isinstance(token, bool) or not isinstance(token, (int, np.integer)) or not 0 <= token < V:
            raise ValueError(f"banned must hold token ids in [0, {V}), got {token!r}")
    rules["banned"] = tuple(int(t) for t in banned)
    for name, value in flags.items():
        rules[name] = _check_bool(value, name)
    return rules


def greedy_args(model, src, max_len, min_len, no_repeat_ngram, forced_eos, banned):
    """greedy_decode's arguments checked: (src, limits, min_len, no_repeat_ngram, rules)."""
    src, limits, min_len, no_repeat_ngram = _check_decode_args(model, src, max_len, min_len, no_repeat_ngram)
    return src, limits, min_len, no_repeat_ngram, _check_rules(model, forced_eos, banned)


def beam_args(model, src, beam_size, max_len, length_penalty, min_len, no_repeat_ngram, precision, forced_eos,
              banned, renormalize, length_form, early_stopping):
    """beam_search's arguments checked: (src, beam_size, limits, min_len, no_repeat_ngram, rules).
    What a stream's wave (streaming.py) checks too."""
    if isinstance(beam_size, bool) or not isinstance(beam_size, (int, np.integer)) or beam_size < 1:
        raise ValueError(f"beam_size must be an int >= 1, got {beam_size!r}")
    # generate's len ** a may take a < 0 (shorter preferred); GNMT's alpha is >= 0
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) \
            or not math.isfinite(length_penalty) or (length_penalty < 0 and length_form != "generate"):
        raise ValueError(f"length_penalty must be a finite number >= 0, got {length_penalty!r}")
    src, limits, min_len, no_repeat_ngram = _check_decode_args(model, src, max_len, min_len, no_repeat_ngram)
    rules = _check_rules(model, forced_eos, banned, renormalize=renormalize)
    if length_form not in ("gnmt", "generate"):
        raise ValueError(f"length_form must be 'gnmt' or 'generate', got {length_form!r}")
    if not isinstance(early_stopping, (bool, np.bool_, str)) or early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {early_stopping!r}")
    rules.update(length_form=length_form,
                 early_stopping=early_stopping if isinstance(early_stopping, str) else bool(early_stopping))
    _check_memory(model.cfg, src.shape[0] * int(beam_size), int(limits.max()),
                  f"beam_size {beam_size} for {src.shape[0]} sentence{'' if src.shape[0] == 1 else 's'}", precision)
    return src, int(beam_size), limits, min_len, no_repeat_ngram, rules
