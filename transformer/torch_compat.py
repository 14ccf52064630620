"""The PyTorch reference network of DESIGN.md and weight movers in both directions.

torch is imported lazily, here only: the package itself never needs it.
"""
import numpy as np

__all__ = ["build_torch_model", "to_torch", "from_torch", "torch_loss", "torch_state_dict_numpy",
           "positional_table"]

_CLASS = None


def positional_table(max_len, d_model, layout="interleaved"):
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(...), float64 rounded once;
    layout "split" (MarianMT's): PE[pos, i] = sin(...), PE[pos, d/2 + i] = cos(...)."""
    pos = np.arange(max_len, dtype=np.float64)[:, None]
    div = np.power(10000.0, np.arange(0, d_model, 2, dtype=np.float64) / d_model)
    pe = np.zeros((max_len, d_model), dtype=np.float64)
    if layout == "split":
        half = (d_model + 1) // 2
        pe[:, :half] = np.sin(pos / div)
        pe[:, half:] = np.cos(pos / div)[:, : d_model // 2]
    else:
        pe[:, 0::2] = np.sin(pos / div)
        pe[:, 1::2] = np.cos(pos / div)[:, : d_model // 2]
    return pe.astype(np.float32)


def _reference_class():
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import math
    import warnings

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class ScaleNorm(nn.Module):
        """x * (g / max(||x||, 1e-5)) per row, g one parameter started at sqrt(d) (Nguyen &
        Salazar 2019; `weight`, as our state_dict names it)."""

        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.full((1,), math.sqrt(d)))
            self.eps = 1e-5

        def forward(self, x):
            return x * (self.weight / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp(min=self.eps))

    class TorchSeq2SeqTransformer(nn.Module):
        """DESIGN's reference: embeddings * sqrt(d) + PE, dropout, nn.Transformer, generator;
        and the config's MarianMT options (activation silu, positions split, no embedding scale,
        tied embeddings, no final norms, decoding started from the pad token)."""

        def __init__(self, cfg):
            super().__init__()
            self.cfg = cfg
            # padding_idx: no lookup trains the pad row (MarianMT's embeddings)
            self.src_embed = nn.Embedding(cfg.src_vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
            self.tgt_embed = nn.Embedding(cfg.tgt_vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
            activation = F.silu if cfg.activation == "silu" else cfg.activation
            with warnings.catch_warnings():  # "enable_nested_tensor is True, but ..." is noise here
                warnings.simplefilter("ignore", UserWarning)
                self.transformer = nn.Transformer(
                    cfg.d_model, cfg.n_heads, cfg.n_encoder_layers, cfg.n_decoder_layers, cfg.d_ff,
                    cfg.dropout, activation, batch_first=True, norm_first=cfg.norm_first)
            # the config's rates by site (nn.Transformer takes one): the attention weights' and the
            # feed-forward hidden activation's
            for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
                for attn in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                    if attn is not None:
                        attn.dropout = cfg.dropout_at("attention")
                layer.dropout.p = cfg.dropout_at("activation")
            if not cfg.final_norm:
                self.transformer.encoder.norm = None
                self.transformer.decoder.norm = None
            if cfg.norm == "scale":      # every LayerNorm a ScaleNorm (transformer/norms.py)
                d = cfg.d_model
                for layer in [*self.transformer.encoder.layers, *self.transformer.decoder.layers]:
                    for name in ("norm1", "norm2", "norm3"):
                        if hasattr(layer, name):
                            setattr(layer, name, ScaleNorm(d))
                    # nn.TransformerEncoderLayer's fast path (eval, no grad) runs LayerNorm's
                    # kernel on norm1/norm2's tensors: never take it here
                    layer.activation_relu_or_gelu = False
                self.transformer.encoder.use_nested_tensor = False
                for stack in (self.transformer.encoder, self.transformer.decoder):
                    if stack.norm is not None:
                        stack.norm = ScaleNorm(d)
            self.generator = nn.Linear(cfg.d_model, cfg.tgt_vocab_size)
            if cfg.tie_embeddings == "all":
                self.tgt_embed.weight = self.src_embed.weight
            if cfg.tie_embeddings != "none":
                self.generator.weight = self.tgt_embed.weight
            self.dropout = nn.Dropout(cfg.dropout)
            self.word_keep = None
            # not persistent: state_dict() holds exactly the parameters, as ours does
            table = positional_table(cfg.max_len, cfg.d_model, cfg.positions)
            self.register_buffer("pe", torch.from_numpy(table), persistent=False)
            self.scale = math.sqrt(cfg.d_model) if cfg.scale_embedding else 1.0

        def forward(self, src, tgt_in):
            S, T = src.shape[1], tgt_in.shape[1]
            pad = self.cfg.pad_id
            words = F.embedding(src, self._table(self.src_embed.weight), padding_idx=pad)
            if self.training and self.cfg.word_dropout > 0.0:   # a source word's whole embedding
                p = self.cfg.word_dropout
                keep = self.word_keep      # bool [B, S] set by a caller (tests: our engine's mask)
                if keep is None:
                    keep = torch.rand(words.shape[:-1], device=words.device) >= p
                words = words * (keep.unsqueeze(-1).to(words.dtype) / (1.0 - p))
            x = self.dropout(words * self.scale + self.pe[:S])
            targets = F.embedding(tgt_in, self._table(self.tgt_embed.weight), padding_idx=pad)
            y = self.dropout(targets * self.scale + self.pe[:T])
            causal = torch.triu(torch.ones(T, T, dtype=torch.bool, device=src.device), diagonal=1)
            src_pad = src == pad
            tgt_pad = tgt_in == pad
            if self.cfg.bos_id == pad:     # the first position is the start token, not padding
                tgt_pad[:, 0] = False
            h = self.transformer(x, y, tgt_mask=causal, src_key_padding_mask=src_pad,
                                 tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad)
            return F.linear(h, self._table(self.generator.weight), self.generator.bias)

        def _table(self, weight):
            """What reads an embedding table or the output weight: its rows at unit length with
            FixNorm (cfg.fix_norm), else the table."""
            return F.normalize(weight, dim=-1, eps=1e-12) if self.cfg.fix_norm else weight

        def loss(self, src, tgt_in, tgt_out, label_smoothing=0.0):
            logits = self.forward(src, tgt_in)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1),
                                   ignore_index=self.cfg.pad_id, label_smoothing=label_smoothing)

    _CLASS = TorchSeq2SeqTransformer
    return _CLASS


def build_torch_model(cfg, seed=None):
    """The PyTorch reference network for `cfg` (a ModelConfig), initialised by PyTorch
    (torch.manual_seed(seed) first when seed is given)."""
    import torch
    if seed is not None:
        torch.manual_seed(seed)
    return _reference_class()(cfg)


def torch_state_dict_numpy(torch_model):
    """{name: float32 ndarray copy} of a torch model's state_dict."""
    return {k: v.detach().cpu().numpy().astype(np.float32, copy=True)
            for k, v in torch_model.state_dict().items()}


def to_torch(model, torch_model=None):
    """A PyTorch reference network holding `model`'s weights (built when torch_model is None)."""
    import torch
    if torch_model is None:
        torch_model = build_torch_model(model.cfg)
    sd = {k: torch.from_numpy(v) for k, v in model.state_dict().items()}
    torch_model.load_state_dict(sd, strict=True)
    return torch_model


def from_torch(torch_model, cfg=None, seed=0):
    """A Seq2SeqTransformer holding a torch reference model's weights."""
    from .model import Seq2SeqTransformer
    if cfg is None:
        cfg = torch_model.cfg
    model = Seq2SeqTransformer(cfg, seed=seed)
    names = set(model.params.data)
    model.load_state_dict({k: v for k, v in torch_state_dict_numpy(torch_model).items() if k in names})
    return model


def torch_loss(torch_model, src, tgt_in, tgt_out, label_smoothing=0.0):
    """F.cross_entropy(..., ignore_index=pad_id, label_smoothing) of the reference model, a torch
    scalar (call .backward() on it); ids may be numpy arrays."""
    import torch

    def t(x):
        return torch.as_tensor(np.asarray(x, dtype=np.int64))
    return torch_model.loss(t(src), t(tgt_in), t(tgt_out), label_smoothing)
