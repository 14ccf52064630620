"""Optimisation (section 5.3): Adam over the model's one flat buffer, the paper's learning-rate
schedule, and gradient clipping by global norm."""
import math

import numpy as np

from . import _C
from .params import _aligned_zeros

__all__ = ["Adam", "noam_lr", "budget_lr", "clip_grad_norm"]


def _number(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


class Adam:
    """torch.optim.Adam (decoupled=False: weight decay added to the gradient) or AdamW
    (decoupled=True), one fused kernel call over every parameter at once."""

    def __init__(self, model, lr=1e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0, decoupled=False):
        if not hasattr(model, "params") or not hasattr(model.params, "flat"):
            raise TypeError(f"model must be a Seq2SeqTransformer, got {type(model).__name__}")
        self.model = model
        self.lr = _number(lr, "lr")
        if self.lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair of floats, got {betas!r}")
        b1, b2 = _number(betas[0], "betas[0]"), _number(betas[1], "betas[1]")
        for name, b in (("betas[0]", b1), ("betas[1]", b2)):
            if not 0.0 <= b < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {b}")
        self.betas = (b1, b2)
        self.eps = _number(eps, "eps")
        if self.eps < 0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        self.weight_decay = _number(weight_decay, "weight_decay")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        self.decoupled = bool(decoupled)
        size = model.params.flat.size
        self.exp_avg = _aligned_zeros(size)      # 64-byte aligned, like the parameters
        self.exp_avg_sq = _aligned_zeros(size)
        self.step_count = 0

    def step(self, lr=None):
        """One update of every parameter from the gradient buffer; lr overrides self.lr (a
        schedule such as noam_lr passes it each step)."""
        lr = self.lr if lr is None else _number(lr, "lr")
        self.step_count += 1
        p = self.model.params
        _C.adam_step(p.flat, p.flat_grad, self.exp_avg, self.exp_avg_sq, self.step_count, lr,
                     self.betas[0], self.betas[1], self.eps, self.weight_decay, self.decoupled)

    def zero_grad(self):
        self.model.zero_grad()

    def state_dict(self):
        return {"exp_avg": self.exp_avg.copy(), "exp_avg_sq": self.exp_avg_sq.copy(),
                "step": int(self.step_count), "lr": self.lr, "betas": list(self.betas),
                "eps": self.eps, "weight_decay": self.weight_decay, "decoupled": self.decoupled}

    def load_state_dict(self, sd):
        if not isinstance(sd, dict):
            raise TypeError(f"state_dict must be a dict, got {type(sd).__name__}")
        for key in ("exp_avg", "exp_avg_sq", "step"):
            if key not in sd:
                raise ValueError(f"optimizer state_dict is missing {key!r}")
        arrays = {}
        for key in ("exp_avg", "exp_avg_sq"):
            v = sd[key]
            if not isinstance(v, np.ndarray):
                raise TypeError(f"{key} must be a numpy.ndarray, got {type(v).__name__}")
            if v.shape != self.exp_avg.shape:
                raise ValueError(f"{key} has shape {v.shape}, expected {self.exp_avg.shape}")
            arrays[key] = v
        step = sd["step"]
        if isinstance(step, np.ndarray) and step.size == 1:
            step = int(step.reshape(-1)[0])
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        np.copyto(self.exp_avg, arrays["exp_avg"], casting="unsafe")
        np.copyto(self.exp_avg_sq, arrays["exp_avg_sq"], casting="unsafe")
        self.step_count = int(step)
        for key in ("lr", "eps", "weight_decay"):
            if key in sd:
                setattr(self, key, _number(sd[key], key))
        if "betas" in sd:
            self.betas = tuple(_number(b, "betas") for b in sd["betas"])
        if "decoupled" in sd:
            self.decoupled = bool(sd["decoupled"])


def noam_lr(step, d_model=512, warmup=4000):
    """The paper's schedule (equation 3): d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)."""
    for name, value in (("step", step), ("d_model", d_model), ("warmup", warmup)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


def budget_lr(step, peak, warmup, total, final=0.1):
    """A schedule that fits a known budget of `total` steps: linear warm-up from 0 to `peak` over
    `warmup` steps, then linear decay to `final * peak` at step `total`, held there after it (a run
    bounded by minutes may take a few more steps than were estimated). Linear decay over the
    budget beats an inverse-square-root tail when the step count is known (Li et al., "Budgeted
    training", 2020); the small floor keeps late steps useful."""
    for name, value in (("step", step), ("warmup", warmup), ("total", total)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    peak, final = _number(peak, "peak"), _number(final, "final")
    if peak < 0 or not 0.0 <= final <= 1.0:
        raise ValueError(f"need peak >= 0 and 0 <= final <= 1, got peak={peak}, final={final}")
    if total < warmup:
        raise ValueError(f"total ({total}) must be >= warmup ({warmup})")
    if step <= warmup:
        return peak * step / warmup
    if total == warmup:
        return peak * final
    progress = min(1.0, (step - warmup) / (total - warmup))
    return peak * (1.0 - (1.0 - final) * progress)


def clip_grad_norm(model, max_norm):
    """Scale every gradient by min(1, max_norm / (norm + 1e-6)) where norm is the global L2 norm
    of all gradients (torch.nn.utils.clip_grad_norm_); returns the norm before clipping."""
    max_norm = _number(max_norm, "max_norm")
    if max_norm <= 0:
        raise ValueError(f"max_norm must be > 0, got {max_norm}")
    grad = model.params.flat_grad
    norm = math.sqrt(_C.sum_squares(grad))
    coef = max_norm / (norm + 1e-6)
    if coef < 1.0:
        _C.scale_(grad, coef)
    return norm
