"""Model hyper-parameters (the paper's Table 3 names) and the size presets of DESIGN."""
from dataclasses import asdict, dataclass, fields

__all__ = ["ModelConfig", "PRESETS"]


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
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)):
            raise TypeError(f"dropout must be a float, got {type(self.dropout).__name__}")
        self.dropout = float(self.dropout)
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.activation not in ("relu", "gelu"):
            raise ValueError(f"activation must be 'relu' or 'gelu', got {self.activation!r}")
        if not isinstance(self.norm_first, bool):
            raise TypeError(f"norm_first must be a bool, got {type(self.norm_first).__name__}")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if not _is_int(value):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            limit = min(self.src_vocab_size, self.tgt_vocab_size)
            if not 0 <= value < limit:
                raise ValueError(f"{name} must be in [0, {limit}) (both vocabularies), got {value}")
        if len({self.pad_id, self.bos_id, self.eos_id}) != 3:
            raise ValueError(f"pad_id, bos_id and eos_id must be distinct, got "
                             f"{self.pad_id}, {self.bos_id}, {self.eos_id}")

    @property
    def d_head(self):
        return self.d_model // self.n_heads

    def to_dict(self):
        return asdict(self)

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
    "small": dict(d_model=256, n_heads=4, d_ff=1024, n_encoder_layers=3, n_decoder_layers=3),
    "base": dict(d_model=512, n_heads=8, d_ff=2048, n_encoder_layers=6, n_decoder_layers=6),
}
