"""What several commands share: flag types that check their values as argparse reads them, the
help texts and flag groups of more than one command, and the check of an output file."""
import argparse
import importlib.util
import math
import os

from ..config import BPE_SAMPLE_PAIRS, TRAIN_DEFAULTS
from ..data import HEADER_CHOICES
from ..errors import FlagError

HEADER_HELP = ("whether line 1 of --data names the columns: yes, no (it is a pair), or auto (default: yes "
               "when a column is given by name, or when every field of line 1 is a short identifier such "
               "as eng or spa; the summary printed at the start says when line 1 was read as the header)")
DECODE_PRECISION_HELP = ("fp32 (default; int8 for a model written by `transformer quantize`); bf16: linear "
                         "maps on bfloat16 operands with float32 sums; int8: linear maps on int8 weights (one "
                         "scale per output row) and int8 activations (one scale per row), int32 sums")
DATA_HELP = ("the corpus: tab-separated pairs (.tsv, plain or gzip), SOURCE,TARGET for two aligned text files "
             "(OPUS's format, one sentence a line), or tatoeba:SRC-TGT (downloaded once); several are one corpus")


def _check_output(flag, path, needs=None):
    """Refuse, before any work, an output file that cannot be written (or drawn)."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FlagError(f"{flag} {path}: there is no folder {folder} to write it in")
    if os.path.isdir(path):
        raise FlagError(f"{flag} {path}: a folder, not a file")
    if needs and importlib.util.find_spec(needs) is None:
        raise FlagError(f"{flag} needs {needs} (pip install {needs})")


def _integer(text, minimum):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def _positive_int(text):
    return _integer(text, 1)


def _non_negative_int(text):
    return _integer(text, 0)


def _at_least_two(text):
    return _integer(text, 2)


def _vocab_size(text):
    from ..tokenizer import MAX_VOCAB_SIZE, SPECIAL_TOKENS

    value = _integer(text, len(SPECIAL_TOKENS) + 1)      # the reserved ids and one learned entry
    if value > MAX_VOCAB_SIZE:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_VOCAB_SIZE}, got {value}")
    return value


def _real(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _positive_float(text):
    value = _real(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _non_negative_float(text):
    value = _real(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _language_code(text):
    from ..languages import normalise

    tag = normalise(text)
    if tag is None:
        raise argparse.ArgumentTypeError(f"must be a language code such as en, spa or pt-BR, got {text!r}")
    return tag


def _fraction(text):
    value = _real(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def _curriculum(text):
    """--curriculum: a whole number of steps (>= 1), or a fraction (0 < f < 1) of the planned steps."""
    value = _real(text)
    if 0 < value < 1:
        return value
    if value >= 1 and value == int(value):
        return int(value)
    raise argparse.ArgumentTypeError(f"must be a whole number of steps (>= 1) or a fraction of the planned "
                                     f"steps (between 0 and 1), got {text}")


def _corpus_flags(parser, data_help):
    parser.add_argument("--data", nargs="+", action="extend", metavar="PATH", help=data_help)
    parser.add_argument("--src-file", metavar="FILE", help="the source side of two aligned text files")
    parser.add_argument("--tgt-file", metavar="FILE", help="the target side of two aligned text files")
    parser.add_argument("--src-col", help="source column of tab-separated files: header name or 0-based index "
                        "(default 0)")
    parser.add_argument("--tgt-col", help="target column of tab-separated files: header name or 0-based index "
                        "(default 1)")
    parser.add_argument("--header", choices=list(HEADER_CHOICES), help=HEADER_HELP)


def _vocabulary_flags(parser):
    parser.add_argument("--vocab-size", type=_vocab_size,
                        help="with --data: BPE vocabulary size per language (default: one per 16 words of the "
                             "training text, per language on average, rounded down to a multiple of 500, "
                             "between 1000 and 4000)")
    parser.add_argument("--bpe-sample", type=_positive_int, metavar="PAIRS",
                        help="with --data: learn BPE from at most this many training pairs, those of smallest "
                             f"hash when there are more (default {BPE_SAMPLE_PAIRS:,}: every pair of a "
                             "smaller corpus)")


def _split_flags(parser):
    parser.add_argument("--dev-fraction", type=_fraction,
                        help=f"with --data: share held out for evaluation (default {TRAIN_DEFAULTS['dev_fraction']})")
    parser.add_argument("--dev-max", type=_positive_int,
                        help=f"with --data: at most this many held out (default {TRAIN_DEFAULTS['dev_max']})")
