"""Every parameter in one flat float32 buffer, every gradient in another (DESIGN, Data layout).

`parameter_specs(cfg)` is the weight-name contract: PyTorch's state_dict names and shapes of the
reference network (transformer/torch_compat.py), in its order. `Parameters` lays them out in one
contiguous buffer (each tensor starting on a 64-byte boundary), hands out named views into it and
into the gradient buffer of the same size, and initialises them the way PyTorch does (the embeddings as the paper's code: parameter_specs).
"""
import math

import numpy as np

from . import _C

__all__ = ["parameter_specs", "tied_names", "Parameters"]

_ALIGN = 16  # floats: every tensor starts on a 64-byte boundary (the gaps stay zero forever)


def _attention_specs(prefix, d):
    return [(f"{prefix}.in_proj_weight", (3 * d, d), "xavier"),
            (f"{prefix}.in_proj_bias", (3 * d,), "zeros"),
            (f"{prefix}.out_proj.weight", (d, d), "xavier"),
            (f"{prefix}.out_proj.bias", (d,), "zeros")]


def _feed_forward_specs(prefix, d, d_ff):
    return [(f"{prefix}.linear1.weight", (d_ff, d), "xavier"),
            (f"{prefix}.linear1.bias", (d_ff,), "fan_in"),
            (f"{prefix}.linear2.weight", (d, d_ff), "xavier"),
            (f"{prefix}.linear2.bias", (d,), "fan_in")]


def _norm_specs(name, d, norm):
    if norm == "scale":        # ScaleNorm: one scalar, g (config.py)
        return [(f"{name}.weight", (1,), "scale_norm")]
    return [(f"{name}.weight", (d,), "ones"), (f"{name}.bias", (d,), "zeros")]


def tied_names(cfg):
    """{name: the name whose tensor it is} for the matrices cfg.tie_embeddings ties: the tied
    names have no storage of their own (PyTorch's `generator.weight = tgt_embed.weight`)."""
    if cfg.tie_embeddings == "target":
        return {"generator.weight": "tgt_embed.weight"}
    if cfg.tie_embeddings == "all":
        return {"tgt_embed.weight": "src_embed.weight", "generator.weight": "src_embed.weight"}
    return {}


def parameter_specs(cfg):
    """[(name, shape, init)] in PyTorch state_dict order, tied names left out (tied_names).
    init is one of 'embedding', 'xavier', 'zeros', 'ones', 'fan_in' (U(+-1/sqrt(fan_in)),
    fan_in = the layer's input size), 'generator_bias', 'scale_norm' (sqrt(d_model): ScaleNorm's g,
    as Nguyen & Salazar start it)."""
    d, d_ff = cfg.d_model, cfg.d_ff
    # Embeddings start at N(0, 1/d_model), the paper's own code's (tensor2tensor) and fairseq's
    # choice, not nn.Embedding's N(0, 1): times sqrt(d_model) they enter at unit scale, as the
    # positional encodings do. At N(0, 1) they enter at sqrt(d_model) (16 for `small`) and swamp
    # every sublayer's update of the residual stream: on the Bible corpus, `small`, 1019 steps of
    # the default plan, dev BLEU 15.0 against 2.6 (dev loss 2.90 against 3.92). A table that is
    # also the output projection needs it anyway, or the first logits are sqrt(d) too large.
    specs = [("src_embed.weight", (cfg.src_vocab_size, d), "embedding"),
             ("tgt_embed.weight", (cfg.tgt_vocab_size, d), "embedding")]
    for i in range(cfg.n_encoder_layers):
        p = f"transformer.encoder.layers.{i}"
        specs += _attention_specs(f"{p}.self_attn", d)
        specs += _feed_forward_specs(p, d, d_ff)
        specs += _norm_specs(f"{p}.norm1", d, cfg.norm) + _norm_specs(f"{p}.norm2", d, cfg.norm)
    if cfg.final_norm:
        specs += _norm_specs("transformer.encoder.norm", d, cfg.norm)
    for i in range(cfg.n_decoder_layers):
        p = f"transformer.decoder.layers.{i}"
        specs += _attention_specs(f"{p}.self_attn", d)
        specs += _attention_specs(f"{p}.multihead_attn", d)
        specs += _feed_forward_specs(p, d, d_ff)
        specs += (_norm_specs(f"{p}.norm1", d, cfg.norm) + _norm_specs(f"{p}.norm2", d, cfg.norm)
                  + _norm_specs(f"{p}.norm3", d, cfg.norm))
    if cfg.final_norm:
        specs += _norm_specs("transformer.decoder.norm", d, cfg.norm)
    specs += [("generator.weight", (cfg.tgt_vocab_size, d), "fan_in"),
              ("generator.bias", (cfg.tgt_vocab_size,), "generator_bias")]
    tied = tied_names(cfg)
    return [spec for spec in specs if spec[0] not in tied]


def _aligned_zeros(n):
    """float32 zeros [n] starting on a 64-byte boundary."""
    raw = np.zeros(n + _ALIGN, dtype=np.float32)
    start = (-raw.ctypes.data % 64) // 4
    return raw[start:start + n]


class Parameters:
    """The flat parameter and gradient buffers of one model, with named views into both."""

    def __init__(self, cfg, seed=0):
        self.specs = parameter_specs(cfg)
        self.tied = tied_names(cfg)   # views of their own are in data/grad only under the owner
        offsets, total = [], 0
        for _, shape, _ in self.specs:
            offsets.append(total)
            size = int(np.prod(shape))
            total += -(-size // _ALIGN) * _ALIGN
        self.size = total
        self.flat = _aligned_zeros(total)
        self.flat_grad = _aligned_zeros(total)
        self.data, self.grad, self.shapes = {}, {}, {}
        self.offsets = {}      # name -> index of its first float in the flat buffers
        for (name, shape, _), start in zip(self.specs, offsets):
            self.offsets[name] = start
            size = int(np.prod(shape))
            self.data[name] = self.flat[start:start + size].reshape(shape)
            self.grad[name] = self.flat_grad[start:start + size].reshape(shape)
            self.shapes[name] = tuple(shape)
        self.d_model = cfg.d_model
        # True from zero_grad() until a training pass adds into the gradients (DataParallel then
        # need not keep what the buffer held); writes through the views do not clear it
        self.grad_is_zero = True
        self.frozen = None      # a token while the weights are read-only (freeze), else None
        self.initialize(seed)

    def with_own_gradients(self):
        """Another Parameters over these very weights (the same flat buffer and views) with a
        gradient buffer of its own, zeroed: a sentence shard's replica (shards.py) adds its
        gradient there, and the step sums the shards' buffers in a fixed order."""
        other = object.__new__(Parameters)
        other.__dict__.update(self.__dict__)
        other.flat_grad = _aligned_zeros(self.size)
        other.grad = {name: other.flat_grad[start:start + int(np.prod(self.shapes[name]))].reshape(self.shapes[name])
                      for name, start in self.offsets.items()}
        other.grad_is_zero = True
        return other

    def freeze(self):
        """Make the weights read-only, the flat buffer and every named view, until unfreeze(), and
        return a token that stands for them meanwhile: decoding then trusts the matrices it
        converted under that token without reading every float32 weight again on each call
        (prepared.py). Only for weights nobody else holds a writable view of, as in the command
        line's translate and evaluate, which load the model and never hand it out: a view taken
        before freeze() keeps its own flags, and a write through it would not be seen."""
        self.flat.flags.writeable = False
        for view in self.data.values():
            view.flags.writeable = False
        self.frozen = object()
        return self.frozen

    def unfreeze(self):
        """Writable weights again; decoding checks every matrix's fingerprint from the next call."""
        self.frozen = None
        self.flat.flags.writeable = True
        for view in self.data.values():
            view.flags.writeable = True

    def tensor(self, name):
        """The parameter view called `name`, a tied name included (tied_names)."""
        return self.data[self.tied.get(name, name)]

    def gradient(self, name):
        """The gradient view called `name`, a tied name included: the sum over every use."""
        return self.grad[self.tied.get(name, name)]

    @property
    def names(self):
        return [name for name, _, _ in self.specs]

    def count(self):
        """Number of parameters (without the alignment gaps)."""
        return sum(int(np.prod(s)) for s in self.shapes.values())

    def initialize(self, seed):
        """PyTorch's initialisation (nn.Transformer._reset_parameters and the modules' defaults),
        drawn from numpy's Generator seeded by `seed` (not PyTorch's stream)."""
        rng = np.random.default_rng(seed)
        for name, shape, init in self.specs:
            view = self.data[name]
            if init == "embedding":                   # N(0, 1/d_model) (parameter_specs)
                view[...] = rng.standard_normal(shape, dtype=np.float32) * np.float32(self.d_model ** -0.5)
            elif init == "xavier":                    # xavier_uniform_ on every weight with dim > 1
                fan_out, fan_in = shape
                bound = math.sqrt(6.0 / (fan_in + fan_out))
                view[...] = rng.uniform(-bound, bound, shape).astype(np.float32)
            elif init == "fan_in":                    # nn.Linear's default bias / generator weight
                fan_in = self._fan_in(name)
                bound = 1.0 / math.sqrt(fan_in)
                view[...] = rng.uniform(-bound, bound, shape).astype(np.float32)
            elif init == "generator_bias":
                bound = 1.0 / math.sqrt(self.d_model)
                view[...] = rng.uniform(-bound, bound, shape).astype(np.float32)
            elif init == "zeros":
                view[...] = 0.0
            elif init == "ones":
                view[...] = 1.0
            elif init == "scale_norm":
                view[...] = np.float32(math.sqrt(self.d_model))
            else:  # pragma: no cover - the spec list above is closed
                raise AssertionError(init)

    def _fan_in(self, name):
        if name.endswith(".bias"):
            return self.shapes[name[:-len("bias")] + "weight"][1]
        return self.shapes[name][1]

    def zero_grad(self):
        _C.zero_(self.flat_grad)   # threads share the memset (225 MB for the base model)
        self.grad_is_zero = True
