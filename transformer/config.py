"""Model hyper-parameters (the paper's Table 3 names) and the size presets of DESIGN."""
from dataclasses import asdict, dataclass, fields
from typing import Optional

__all__ = ["ModelConfig", "PRESETS"]

ACTIVATIONS = ("relu", "gelu", "silu")
POSITIONS = ("interleaved", "split")
TIE_EMBEDDINGS = ("none", "target", "all")
NORMS = ("layer", "scale")
DROPOUT_SITES = ("residual", "attention", "activation", "word")
OPTIONAL_RATES = ("attention_dropout", "activation_dropout")   # None: follow `dropout`
UNSET_WHEN_DEFAULT = {"attention_dropout": None, "activation_dropout": None, "word_dropout": 0.0,
                      "norm": "layer", "fix_norm": False}

# Training on data (transformer.train) with no --dropout: a budget that sees the training pairs
# fewer times than this trains without dropout (regularising data the model has barely seen only
# slows it down: on the Bible corpus, 954 steps = 1.6 passes, dev BLEU 1.42 without dropout against
# 0.92 with 0.1; 1764 steps = 3.7 passes, 23.7 / 26.0 BLEU greedy / beam 4 without dropout against
# 18.9 / 22.7 with 0.1; `tiny`, 10 minutes on 2 Zen 3 cores, 6.0-6.5 passes: 24.8 / 27.6 against
# 23.2 / 25.1, where the threshold was 5 and the run took 0.1), else 0.1. The dev loss's lead
# without dropout shrank from 0.10 at 4.0-4.3 passes to 0.02 at 6.0-6.5 (benchmarks/notes/
# 2026-11-28-dropout-batch-size.md), so the threshold is 8, which also covers tiny's ten minutes on
# the faster Zen 2 (7.4). Above it, twenty minutes of tiny on Zen 3 (a 12-pass plan): without
# dropout the dev loss rose after ~7 passes and the run ended 1.7 / 0.9 BLEU below 0.1's.
DROPOUT_FREE_PASSES = 8.0
# ... and a budget that sees them at least HEAVY_DROPOUT_PASSES times (a small corpus: Tatoeba's
# 2,690 English-Hindi pairs are seen ~100 times in 10 minutes, and the model learns them by heart
# after ~200 steps) trains with HEAVY_DROPOUT (measured there, 10 minutes: greedy BLEU 9.1 /
# chrF 26.7 against 6.6 / 23.6 with 0.1). Not from 20 passes, as it was: on the Bible, thirty
# minutes of `tiny` (37 passes; Xeon family 6 model 207, bf16) gave held-out BLEU 32.5 / 34.6 with
# 0.1 (greedy / beam 4), and with 0.3 it trailed at every evaluation (dev BLEU 24.0 against 31.9 at
# step 10,000 of 17,300, where it was stopped); `medium-4-2` at 22 passes with 0.3 ended at 27.7,
# below ten minutes of `tiny` (28.7)
# (benchmarks/notes/2026-12-02-thirty-minutes.md). Between 37 and Tatoeba's ~100 it is unmeasured.
HEAVY_DROPOUT_PASSES = 50.0
HEAVY_DROPOUT = 0.3


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class ModelConfig:
    """Sizes of the encoder-decoder of "Attention Is All You Need" (defaults: the base model)."""

    src_vocab_size: int = 8000
    tgt_vocab_size: int = 8000
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1
    activation: str = "relu"
    norm_first: bool = False
    max_len: int = 512
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    # The options a MarianMT (OPUS-MT) model needs; the defaults are the paper's / DESIGN's network.
    positions: str = "interleaved"     # PE columns: sin, cos, sin, ... ("split": all sines, then
                                       # all cosines, Marian's layout)
    scale_embedding: bool = True       # embeddings * sqrt(d_model) (False: as they are)
    tie_embeddings: str = "none"       # "target": the output projection is tgt_embed.weight;
                                       # "all": one matrix for source, target and output
    final_norm: bool = True            # nn.Transformer's final encoder and decoder LayerNorm
    # Dropout by site (training only; inference never reads them). `dropout` is the rate of the
    # embeddings and of each sublayer's output before its residual add; these two override it at
    # the attention weights and at the feed-forward hidden activation (None: `dropout`'s rate, as
    # torch.nn.Transformer has one rate everywhere).
    attention_dropout: Optional[float] = None
    activation_dropout: Optional[float] = None
    # Source word dropout (Marian's --dropout-src): a source token's word embedding (before the
    # sqrt(d_model) scale and the positions are added) is zeroed with this probability, the kept
    # ones scaled by 1 / (1 - p); the whole row, every feature, together. Source side only.
    word_dropout: float = 0.0
    # The normalisation (issue 57's recipe lever from "Transformers without Tears", Nguyen & Salazar
    # 2019). norm "layer": LayerNorm (the paper's, nn.LayerNorm); "scale": ScaleNorm, g * x / ||x||
    # (the row's L2 norm clamped below at 1e-5), one learned scalar g per norm, started at
    # sqrt(d_model), in every place a LayerNorm would be (its placement still norm_first's).
    # fix_norm: FixNorm (Nguyen & Chiang 2018), every embedding table and the output projection's
    # weight read with each row at unit length (W / max(||W_row||, 1e-12), F.normalize's), so a
    # logit is the output bias plus |h| times a cosine. Both are written to a config only when set.
    norm: str = "layer"
    fix_norm: bool = False

    def __post_init__(self):
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff",
                     "n_encoder_layers", "n_decoder_layers", "max_len"):
            value = getattr(self, name)
            if not _is_int(value):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        for name in ("dropout", "attention_dropout", "activation_dropout", "word_dropout"):
            value = getattr(self, name)
            if value is None and name in OPTIONAL_RATES:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a float{' or None' if name in OPTIONAL_RATES else ''}, "
                                f"got {type(value).__name__}")
            value = float(value)
            if not 0.0 <= value < 1.0:      # (nan fails this too)
                raise ValueError(f"{name} must be in [0, 1), got {value}")
            setattr(self, name, value)
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        for name in ("norm_first", "scale_embedding", "final_norm", "fix_norm"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {type(getattr(self, name)).__name__}")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {self.positions!r}")
        if self.tie_embeddings not in TIE_EMBEDDINGS:
            raise ValueError(f"tie_embeddings must be one of {TIE_EMBEDDINGS}, got {self.tie_embeddings!r}")
        if self.tie_embeddings == "all" and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(f"tie_embeddings='all' needs one vocabulary, got src_vocab_size "
                             f"{self.src_vocab_size} and tgt_vocab_size {self.tgt_vocab_size}")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not _is_int(value):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            limit = min(self.src_vocab_size, self.tgt_vocab_size)
            if not 0 <= value < limit:
                raise ValueError(f"{name} must be in [0, {limit}) (both vocabularies), got {value}")
        # bos_id may be pad_id: MarianMT starts decoding from the pad token
        if self.eos_id in (self.pad_id, self.bos_id):
            raise ValueError(f"eos_id must differ from pad_id and bos_id, got pad_id {self.pad_id}, "
                             f"bos_id {self.bos_id}, eos_id {self.eos_id}")

    @property
    def d_head(self):
        return self.d_model // self.n_heads

    def dropout_at(self, site):
        """The dropout rate of a site: "residual" (embeddings and sublayer outputs: `dropout`),
        "attention" (the attention weights), "activation" (the feed-forward hidden activation),
        each of the last two `dropout` unless set, or "word" (source words: `word_dropout`)."""
        if site == "residual":
            return self.dropout
        if site == "word":
            return self.word_dropout
        own = {"attention": self.attention_dropout, "activation": self.activation_dropout}[site]
        return self.dropout if own is None else own

    def trains_with_dropout(self):
        """Whether a training pass draws any dropout mask (some site's rate above 0)."""
        return any(self.dropout_at(site) > 0.0 for site in DROPOUT_SITES)

    def to_dict(self):
        """The fields as a dict; the training-only dropout options and the normalisation options
        only when set (not their defaults), so a config that uses none of them is written as before
        they existed and engines of earlier versions, which refuse fields they do not know, still
        load it."""
        d = asdict(self)
        for name, default in UNSET_WHEN_DEFAULT.items():
            if d[name] == default:
                del d[name]
        return d

    @classmethod
    def from_dict(cls, d):
        if not isinstance(d, dict):
            raise TypeError(f"config must be a dict, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"config has unknown fields: {unknown}")
        return cls(**d)

    def replace(self, **changes):
        d = self.to_dict()
        d.update(changes)
        return ModelConfig.from_dict(d)


# Target and source share the sizes; vocabularies are set by the data (DESIGN, Command line).
PRESETS = {
    "tiny": dict(d_model=128, n_heads=4, d_ff=512, n_encoder_layers=2, n_decoder_layers=2),
    # a deeper encoder than decoder (4 + 2): between tiny and small in cost, and faster to decode than
    # a balanced model of its cost; one of the shapes a run on data may size itself to (training/sizing.py)
    "medium-4-2": dict(d_model=192, n_heads=4, d_ff=768, n_encoder_layers=4, n_decoder_layers=2),
    "small": dict(d_model=256, n_heads=4, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3),
    "base": dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6),
}


# Without --vocab-size, the BPE vocabulary (per language) is one entry per VOCAB_WORDS_PER_ENTRY
# words of training text (the two sides' mean), rounded down to a multiple of 500, within
# [MIN_VOCAB, MAX_VOCAB]. 4000 is the Bible's best measured (29,024 pairs: 8000 learned less in 10
# minutes); Tatoeba's 2,580 English-Hindi pairs (17k words a side) get 1000, which in 10 minutes of
# `small` gave dev BLEU 13.7 / chrF 29.0 at step 1000 against 9.9 / 27.5 with 4000
# (benchmarks/notes/2026-11-25-ten-minutes-defaults.md).
VOCAB_WORDS_PER_ENTRY = 16
MIN_VOCAB, MAX_VOCAB = 1000, 4000
# BPE is learned on at most this many training pairs (lines a side); above it, on a hash sample
# (corpus/preparation.py). Learning costs about 26 us a pair (both sides) against 58 us to encode
# it (AMD EPYC Zen 4, family 25 model 17, 2 cores; 4000 merges), so learning on every pair of a
# large corpus would add almost half to its preparation. 200,000 pairs take 5.5 s; the 4000 merges
# learned from them share 98% of their entries with those learned from a million (Bible pairs,
# docs/data.md). A larger --vocab-size may want more: --bpe-sample. Every corpus of up to
# 200,000 pairs (Tatoeba's 2,690, the Bible's 29,524) learns from all of its training pairs, as before.
BPE_SAMPLE_PAIRS = 200_000

# train's defaults for the flags whose parser default is None, so that a flag given can be told from
# one left out (a resumed run refuses one that contradicts its checkpoint; a flag the run would not
# read is refused): training.flags.apply_defaults fills them in.
# Batches of 2048 tokens and BPE vocabularies of 4000 learn more in a CPU budget than the paper's
# 25k-token batches and 37k vocabulary (or our earlier 4096 / 8000): on the Bible corpus, 10 minutes
# of `small` gave dev BLEU 0.92 against 0.34 (benchmarks/notes/2026-11-25-ten-minutes-defaults.md). The vocabulary
# is smaller for a small corpus (training.data.choose_vocab_size), so it has no default here.
# The model a new run on data builds (transformer.training.flags, where each is measured), unless a
# flag says otherwise: pre-LN, ScaleNorm with FixNorm. `transformer bench --what train` builds it
# too, so that the bench times the layers training runs.
DATA_RUN_MODEL = {"norm_first": True, "norm": "scale", "fix_norm": True}
TRAIN_DEFAULTS = {"preset": "tiny", "src_col": "0", "tgt_col": "1", "header": "auto", "seed": 0, "batch_size": 64,
                  "batch_tokens": 2048, "lr_scale": 1.0, "label_smoothing": 0.1, "clip_norm": 1.0,
                  "max_sentence_tokens": 128, "dev_fraction": 0.05, "dev_max": 500,
                  "eval_limit": 200, "bpe_sample": BPE_SAMPLE_PAIRS}
