"""Whether a training step fits the memory this process may fill, before the run starts.

Decoding refuses a beam whose caches pass that memory (decoding/checks.py); training did not, and a
`--batch-tokens` far past the machine grew until it swapped, or until a container's limit had the
kernel kill it, an epoch in. Here a run is refused at its start, naming --batch-tokens, when a step
on the largest batch of its first pass needs more than the machine's memory or, tighter, its
cgroup's limit (cgroups.usable_memory).

What a step needs is a floor, so that nothing is refused that would fit: 16 bytes a parameter
(weights, gradients, Adam's two moments) and 4 more for each further sentence shard's gradients
(shards.py); and 16 x d_model floats a layer for each padded token on that layer's side, where
steps measured 22-27. Measured as the growth of peak resident memory over two steps
(benchmarks/step_memory.py), the floor was 0.39-0.77 of it in nine shapes from tiny to base,
vocabularies of 4,000 to 32,000 (the least: the largest vocabulary, whose output pass the floor
leaves out), fp32 and bf16, 1 and 2 threads. So a run it passes may still not fit, and one whose
floor is past a third of the memory is told so; a run it refuses cannot fit.
"""
import math

import numpy as np

from .. import cgroups
from ..params import parameter_specs, tied_names
from ..shards import shard_count
from .report import say

__all__ = ["parameter_count", "step_floor", "largest_step", "check_step_memory"]

FLOATS_PER_LAYER_TOKEN = 16      # x d_model: the floor's activations (the runs measured 22-27)
BYTES_PER_PARAMETER = 16         # weights, gradients, Adam's m and v, fp32
WARN_SHARE = 1 / 3               # the floor was at least 0.39 of every step measured: past a third, say so


def parameter_count(cfg):
    """The parameters of a model of `cfg` (a tied matrix once), without making it."""
    tied = tied_names(cfg)
    return sum(math.prod(shape) for name, shape, _ in parameter_specs(cfg) if name not in tied)


def step_floor(cfg, parameters, rows, src_width, tgt_width):
    """Bytes a training step of a model of `cfg` with `parameters` needs at least, on a batch of
    `rows` sentences padded to `src_width` source and `tgt_width` target positions."""
    tokens = rows * (cfg.n_encoder_layers * src_width + cfg.n_decoder_layers * tgt_width)
    shards = shard_count(cfg, rows, rows * tgt_width)
    return (BYTES_PER_PARAMETER + 4 * (shards - 1)) * parameters \
        + 4 * FLOATS_PER_LAYER_TOKEN * cfg.d_model * tokens


def largest_step(cfg, data, world_size=1):
    """(bytes, rows, src_width, tgt_width, counted) of the batch of data's first pass (a
    TrainingSet's epoch 0) whose step needs the most, as one of `world_size` ranks runs it (every
    world_size-th row); `counted`: its tokens as --batch-tokens counts them (the whole batch's).
    The widths are the plain segmentations': BPE-dropout's are longer, so the floor still holds."""
    epoch = data.batches(0)
    pairs = data.rows[epoch.order]                      # int32 throughout: a corpus may hold millions
    src = data.corpus.lengths("src")[pairs]
    tgt = data.corpus.lengths("tgt")[pairs]
    tgt += 1                                            # BOS + y, y + EOS
    starts = epoch.bounds[:-1]
    sentences = np.diff(epoch.bounds)
    rows = -(-sentences // world_size)                  # a rank's share: every size-th row
    src_width, tgt_width = np.maximum.reduceat(src, starts), np.maximum.reduceat(tgt, starts)
    tokens = rows * (cfg.n_encoder_layers * src_width + cfg.n_decoder_layers * tgt_width)
    k = int(np.argmax(tokens))
    need = step_floor(cfg, parameter_count(cfg), int(rows[k]), int(src_width[k]), int(tgt_width[k]))
    # what --batch-tokens counts of it: sentences x the longest, max(source, 1 + target)
    counted = int(sentences[k]) * max(int(src_width[k]), int(tgt_width[k]))
    return need, int(rows[k]), int(src_width[k]), int(tgt_width[k]), counted


def check_step_memory(cfg, data, batch_tokens, world_size=1, sharing=1, warn=True):
    """MemoryError naming --batch-tokens when a step on the largest batch of the first pass needs
    more than this process may fill (cgroups.usable_memory); with `warn`, a warning when it needs
    more than a third of it. Under mpirun, `sharing` ranks (this one among them) run on this
    machine, each on its part of the batch, and share that memory."""
    total, source = cgroups.usable_memory()
    if total is None or not len(data):
        return
    room = cgroups.room_text(total, source)
    if sharing > 1:
        total //= sharing
        room = f"this rank's share of {room}, which {sharing} ranks share"
    need, rows, src_width, tgt_width, counted = largest_step(cfg, data, world_size)
    if need <= total:
        if warn and need > WARN_SHARE * total:
            say(f"warning: a training step on the first pass's largest batch needs at least "
                f"{cgroups.size_text(need)}, more than a third of {room}, and steps have measured up to "
                f"2.6 times that floor; if the run is killed, a smaller --batch-tokens ({batch_tokens} now) may fit")
        return
    fixed = step_floor(cfg, parameter_count(cfg), rows, 0, 0)
    if fixed >= total:
        hint = "the model alone needs more: a smaller --preset or size flags"
    else:
        # the activations grow with the batch's tokens; a smaller cap packs batches that much smaller
        most = int(counted * (total - fixed) / (need - fixed))
        hint = f"a --batch-tokens past about {most:,} cannot fit"
    per_rank = f" (this rank's part: one sentence in {world_size})" if world_size > 1 else ""
    raise MemoryError(f"--batch-tokens {batch_tokens}: the first pass's largest batch{per_rank}, {rows:,} "
                      f"sentences padded to {src_width} source and {tgt_width} target positions, needs at "
                      f"least {cgroups.size_text(need)} for a training step of this model, more than {room}; "
                      f"{hint}")
