"""What a run tells its user: a line at a time on stderr (only rank 0 under mpirun), the model in
one line, metrics rounded for printing."""
import sys

from .. import _C


# Under mpirun, only rank 0 talks: the command line sets this on the others (commands/train.py).
SILENT = False


def say(message, stream=None):
    if not SILENT:
        print(message, file=stream or sys.stderr, flush=True)


def describe(model):
    cfg = model.cfg
    return (f"model: d_model {cfg.d_model}, {cfg.n_heads} heads, d_ff {cfg.d_ff}, "
            f"{cfg.n_encoder_layers}+{cfg.n_decoder_layers} layers{', pre-LN' if cfg.norm_first else ''}"
            f"{', ScaleNorm' if cfg.norm == 'scale' else ''}{', FixNorm' if cfg.fix_norm else ''}, "
            f"{model.num_parameters():,} parameters; "
            f"threads {_C.get_num_threads()} ({_C.isa()})")


def rounded(metrics):
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in metrics.items()}
