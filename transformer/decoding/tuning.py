"""What decoding chooses by the model's size, the precision and the threads: the output
projection's precision in int8 decoding, how a step's rows are split across threads, and what the
key/value caches hold. The settings here may be changed at run time (tests, benchmarks), through
transformer.decoding as well (__init__.py)."""
import numpy as np


# The output projection's precision in int8 decoding. Measured on a Bible model (small, 1800 steps,
# 500 held-out sentences, Zen 3): int8 / bf16 / fp32 projection give greedy BLEU 2.60 / 2.61 / 2.63
# (fp32 decoding 2.64) with 62% / 69% / 68% of sentences identical to fp32's, beam 4 3.66 / 3.61 /
# 3.70 (fp32 3.67) with 58% / 67% / 67%. The projection picks the word: int8 changes 6-9% more
# sentences, bf16 none more than float32 does, so it is bf16 (its operands rounded, float32 sums; an
# int8 file stores it as float32), which halves what it reads where the CPU has bf16 products
# (Zen 4, family 25 model 17, base int8, 1 thread: greedy 1574 -> 1640 tokens/s, beam 4 662 -> 712;
# an int8 projection would give 1878 and 792) and costs nothing elsewhere -- unless it holds more
# weights than all decoder layers together (OPUS-MT: 58101 x 512 against 6 layers' 22 M): then it
# is most of what a step reads, float32 would leave int8 decoding barely faster than fp32
# (measured: 1.13x at OPUS-MT's size), and it is quantized like the rest, as CTranslate2 does.
# None: that rule (int8_generator); "fp32", "bf16" or "int8": that precision for every model.
INT8_GENERATOR = None


def int8_generator(cfg):
    """The output projection's precision in int8 decoding of a model of config `cfg`."""
    if INT8_GENERATOR is not None:
        return INT8_GENERATOR
    d = cfg.d_model
    layers = cfg.n_decoder_layers * (6 * d * d + 2 * d * cfg.d_ff)   # what a decoder step multiplies by
    return "int8" if cfg.tgt_vocab_size * d > layers else "bf16"


# Decoding splits a step's rows across threads (csrc/decoder.h): each thread runs the whole step
# on its own block of rows and reads every weight, against one team meeting per kernel (whose
# small products mostly run on one thread) when kernels are split instead. A step of n rows on
# T threads runs in min(T, n // r) blocks (at least 1) of at least r rows, where r is
#  - MIN_GROUP_ROWS when the weights a step reads are at most GROUP_WEIGHT_BYTES. Measured at 2
#    threads (Zen 3, steps/s, split rows against split kernels): tiny greedy (4 MB of weights)
#    1.25x fp32, 1.31x int8; small (15 MB) 1.07x at B=32, 1.24x at B=8. On a 16-core Xeon
#    (family 6 model 207) tiny is fastest at 4 rows a block (greedy B=32, 16 threads: 96k
#    tokens/s in 8 blocks, 89k in 16);
#  - below GROUP_THREADS threads, for weights up to twice that (base int8: 38 MB),
#    MIN_GROUP_ROWS_FEW, and for larger ones (base fp32: 104 MB) never: with few rows a block each
#    kernel splits better and one copy of the weights streams (Zen 3, 2 threads, base greedy B=8:
#    split rows 0.93x fp32, 1.00x int8; the Xeon: 0.80x, 0.93x), while blocks of 16 rows amortise
#    the reading of int8 weights (the Xeon, beam 4, 32 rows: 1.01-1.30x int8; fp32 0.79-1.06x);
#  - for larger weights, MIN_GROUP_ROWS_MANY from GROUP_THREADS threads on: a team of 4 or more
#    meeting ~70 times a step costs more than every thread reading all weights. The Xeon, base,
#    tokens/s, split kernels against split rows: int8 greedy (B=8) 2034 / 2430 at 4 threads,
#    1881 / 2675 at 8, 2068 / 2611 at 16; int8 beam 4 1195 / 1577, 1152 / 2038, 555 / 1970; fp32
#    greedy 1455 / 1282 (the one loss), 1464 / 1568, 1450 / 1540; fp32 beam 4 849 / 1124,
#    912 / 1151, 447 / 1085. Split kernels at 16 threads were slower than at 2 (2199 int8
#    greedy, 1248 fp32); split rows never are. Not beyond GROUP_MANY_BYTES (4 x 32 MiB): a
#    MarianMT step at fp32 reads 207 MB (its 58101-word projection alone 119 MB), which every
#    thread would stream from memory; unmeasured there, so its kernels stay split.
# DECODE_GROUPS: None (that rule) or a fixed count (tests, benchmarks; still at most n // 4).
GROUP_WEIGHT_BYTES = 32 << 20
GROUP_MANY_BYTES = 4 * GROUP_WEIGHT_BYTES
GROUP_THREADS = 4
MIN_GROUP_ROWS = 4
MIN_GROUP_ROWS_FEW = 16
MIN_GROUP_ROWS_MANY = 2
DECODE_GROUPS = None
# Greedy and beam search run their whole loop in C (DecoderStep.greedy, .beam: each block of
# sentences from its first step to its last on one thread); True: the step-by-step loops below,
# with the step in C (tests: the reference of the loops in C).
_PYTHON_LOOPS = False


def _step_weight_bytes(cfg, precision):
    d = cfg.d_model
    layers = cfg.n_decoder_layers * (6 * d * d + 2 * d * cfg.d_ff)
    generator = cfg.tgt_vocab_size * d
    # bf16 counted as float32, as the grouping thresholds were measured (read as pairs, half of
    # that, at avx2 and avx512_bf16 and above; as floats at avx512 without avx512_bf16)
    size = {"fp32": 4, "bf16": 4, "int8": 1}
    return layers * size[precision] + generator * size[
        int8_generator(cfg) if precision == "int8" else precision]


def min_group_rows(cfg, precision, threads):
    """The fewest rows of a block when a step's rows are split across `threads` threads, or None
    when they are not split."""
    step_bytes = _step_weight_bytes(cfg, precision)
    if step_bytes <= GROUP_WEIGHT_BYTES:
        return MIN_GROUP_ROWS
    if threads >= GROUP_THREADS:
        return MIN_GROUP_ROWS_MANY if step_bytes <= GROUP_MANY_BYTES else None
    return MIN_GROUP_ROWS_FEW if step_bytes <= 2 * GROUP_WEIGHT_BYTES else None


def step_groups(cfg, precision, threads, rows):
    """Blocks of rows a decoding step of `rows` rows of a model of config `cfg` is split into,
    one per thread (1: the step's kernels split their own work instead)."""
    if DECODE_GROUPS is not None:
        return max(1, min(DECODE_GROUPS, rows // MIN_GROUP_ROWS))
    least = min_group_rows(cfg, precision, threads)
    return 1 if least is None else max(1, min(threads, rows // least))


def cache_dtype(precision):
    """What decoding's key/value caches hold: float32 at fp32; bf16 (uint16: rounded to nearest,
    ties to even, attention.h) at bf16 and int8, whose caches then read half the bytes. A step's
    attention reads every cached key and value of its sentence (a base step of 8 sentences: 12.6 MB
    of cross-attention at 64 source positions, in float32), and int8 products made those reads
    its biggest cost after the weights. Measured, int8, the decode bench's models, float32 against
    bf16 caches alternated in one process, two sessions of 5-20 rounds (AMD EPYC Zen 3, family 25
    model 1), the median of the rounds' ratios: greedy 1.13-1.16x at one thread and 1.13-1.15x at
    two (base), 1.12-1.16x / 1.03-1.07x (tiny); beam 4, whose beams share their sentence's
    cross-attention, 1.00-1.15x / 1.02x (base), 1.03-1.10x (tiny, one thread). The full
    forward pass of those precisions rounds the decoder's keys and values the same way
    (layers.py), so it scores what decoding computes."""
    return np.float32 if precision == "fp32" else np.uint16
