"""Iteration-level batching: sentences join a running decoding batch between two decoder steps and
leave it when they finish (Orca, Yu et al., OSDI 2022), the loop in C (csrc/stream.h).

A DecodingStream holds waves. add() starts one (or one per thread, when its rows are enough to
split): its sentences are encoded together, and from the next run() on their decoder steps go
with the other live waves'. Each step multiplies the rows of all waves by every weight at once
(with several threads: each thread the rows of its own waves, without meeting the others until
run() returns), while each wave's rows attend over their own caches and encoder output at their
own position. run() returns once a sentence has finished (or the caller flags a new arrival, or
after max_steps), with the finished sentences' tokens: a short sentence that arrives during a
long batch starts at the next step and leaves at its own end, instead of waiting for the batch.

A sentence's tokens are those greedy_decode or beam_search give it, alone or in any batch: the
same kernels in the same order on each row, no kernel mixes rows, and the encoder computes each
row apart (decoding.rows_apart). tests/test_streaming.py checks them against those calls for
waves that join at every step.

One thread drives a stream (the server's scheduler): it is not safe to call from two at once.
"""
import time

import numpy as np

from . import _C
from .cgroups import size_text
from .data import collate
from .decoding import (DecoderCache, _encode_once, _prepared, beam_args, greedy_args, step_groups)
from .decoding.checks import row_bytes
from .decoding.tuning import cache_dtype
from .precision import check_precision


class NoRoom(MemoryError):
    """add(room=...) refused a wave whose workspaces would pass the room given: nothing was
    allocated. need: the bytes it would take."""

    def __init__(self, message, need):
        super().__init__(message)
        self.need = need


def encoder_bytes(cfg, sentences, src_len):
    """Bytes the model's own workspace may grow to for encoding `sentences` sources of `src_len`
    positions (layers.Workspace keeps the largest shapes it has seen; at inference the encoder's
    layers share one layer's buffers): d_ff + 13 x d_model + heads x src_len + 8 floats a token,
    whatever the number of layers (the embedding's output, a layer's activations, attention
    weights and temporaries, the final norm's output; tests/test_streaming.py), and a quarter
    more for the workspace's growth step."""
    per_token = cfg.d_ff + 13 * cfg.d_model + cfg.n_heads * src_len + 8
    return 5 * sentences * src_len * per_token        # 4 bytes a float, x 1.25


def wave_bytes(cfg, sentences, beam, src_len, steps, precision):
    """Bytes a wave's workspace holds at most: each decoder row's (decoding.checks.row_bytes) and
    each sentence's cached encoder keys and values at every decoder layer."""
    cache = np.dtype(cache_dtype(precision)).itemsize
    return sentences * beam * row_bytes(cfg, steps, precision) \
        + sentences * src_len * 2 * cfg.n_decoder_layers * cfg.d_model * cache


def plan_wave(model, precision, pieces, beam, max_len, no_repeat_ngram):
    """The checked arguments of a wave of `pieces` (source id lists) decoded at `beam` (1: greedy)
    with the model's generation settings, and the bytes it will hold (wave_bytes), last."""
    max_len, rules = model._generation_rules(max_len, None, None)
    src = collate([(ids, [], []) for ids in pieces], range(len(pieces)), model.cfg.pad_id)[0]
    if beam > 1:
        options = model._beam_options(beam, None, None, None)
        src, K, limits, min_len, ngram, rules = beam_args(
            model, src, options["beam_size"], max_len, options["length_penalty"], 0, no_repeat_ngram,
            precision, rules["forced_eos"], rules["banned"], options["renormalize"],
            options["length_form"], options["early_stopping"])
        length_penalty = options["length_penalty"]
    else:
        src, limits, min_len, ngram, rules = greedy_args(model, src, max_len, 0, no_repeat_ngram,
                                                         rules["forced_eos"], rules["banned"])
        K, length_penalty = 1, 0.0
    nbytes = wave_bytes(model.cfg, src.shape[0], K, src.shape[1], int(limits.max()), precision)
    return src, K, limits, min_len, ngram, rules, length_penalty, nbytes


def starting_bytes(model, plans, prepared):
    """What starting the waves of `plans` (plan_wave) adds besides their own bytes: what encoding
    the widest may add to the model's workspace (shared by every wave, kept at its largest: the
    caller counts it once it holds it), and when `prepared` (their PreparedWeights, or None) holds
    nothing yet, the weights they will prepare for their precision, at most 4 bytes a parameter."""
    grown = max(encoder_bytes(model.cfg, plan[0].shape[0], plan[0].shape[1]) for plan in plans)
    first = 0 if prepared is not None and prepared.nbytes() else 4 * model.num_parameters()
    return max(grown - model.ws.nbytes(), 0) + first


class Wave:
    """Sentences added together: their decoding loop (a DecoderLoop of the C side) and the tags
    the caller gave them."""

    def __init__(self, loop, cache, workspace, tags, nbytes=0):
        self.loop, self.cache, self.workspace, self.tags = loop, cache, workspace, tags
        self.delivered = np.zeros(len(tags), bool)
        self.nbytes = nbytes            # wave_bytes: what it was admitted as

    @property
    def live(self):
        return self.loop.live

    @property
    def sentences_left(self):
        """Its sentences still decoding."""
        return self.loop.rows // self.loop.K

    def cancel(self, index):
        """Sentence `index` leaves at the next step; it is never returned."""
        self.loop.cancelled[index] = 1


def step_widths(cfg):
    """The floats a decoder row takes in each of a stream's step buffers (besides its mean and rstd)."""
    D, F, V = cfg.d_model, cfg.d_ff, cfg.tgt_vocab_size
    return dict(x=D, h=D, tmp=D, ctx=D, query=D, qkv=3 * D, ff_pre=F, ff_act=F, logits=V)


def stream_row_bytes(cfg):
    """Bytes of a stream's step buffers for each of its rows, held from its first wave on."""
    return 4 * (sum(step_widths(cfg).values()) + 2)


class DecodingStream:
    """Waves of one model at one precision, stepped together.

    rows: the most decoder rows a step takes (sentences for greedy, sentences x beam for beam
    search) over all live waves; add() refuses a wave that would pass it."""

    def __init__(self, model, precision="fp32", rows=256):
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows must be an int >= 1, got {rows!r}")
        self.model, self.precision, self.rows = model, check_precision(precision), rows
        cfg = model.cfg
        # the weights as the steps read them, prepared once for every wave (prepared.py)
        self._prepared = _prepared(model, {})
        # each live wave's own workspace (caches, encoder keys and values); a finished wave's is
        # kept for the next, as decoding calls keep theirs (fresh memory: a page fault per 4 KiB),
        # while the spares hold no more than twice the biggest wave's (each keeps its largest
        # arrays: many spares grown by big waves would hold many times the stream's rows)
        self._spare_workspaces = []
        self._biggest_workspace = 0
        buffers = {name: np.empty((rows, width), np.float32) for name, width in step_widths(cfg).items()}
        buffers.update(mean=np.empty(rows, np.float32), rstd=np.empty(rows, np.float32))
        self._stream = _C.DecoderStream(buffers, rows)
        self.waves = []
        self.step_seconds = None        # the last run's seconds a step
        # set to 1 by another thread when it has a wave to add: run() returns after its step (once
        # min_steps are done)
        self.arrived = np.zeros(1, np.int32)

    def rows_in_use(self):
        """The rows the live waves take at their next step."""
        return sum(wave.loop.rows for wave in self.waves)

    def held(self):
        """Bytes its waves were admitted as (wave_bytes), its spare workspaces' and its prepared
        weights' (converted for its precision by its first waves); not its step buffers."""
        return sum(wave.nbytes for wave in self.waves) + sum(map(workspace_bytes, self._spare_workspaces)) \
            + self._prepared.nbytes()

    def add(self, pieces, tags, beam=1, max_len=None, no_repeat_ngram=0, room=None):
        """Start decoding `pieces` (source id lists); tags[i] comes back with piece i's tokens.
        beam 1: greedy decoding; else beam search of `beam` beams, with the model's generation
        settings as beam_search takes them; max_len and no_repeat_ngram as there. Returns the
        waves: one, or one per thread when the pieces are enough to split a step's rows across
        threads (step_groups; a wave is stepped whole by one thread, csrc/stream.h), the pieces
        dealt to them in turn, as decoder_greedy deals sentences to its blocks.

        room: None, or the bytes the new waves may take (wave_bytes; what encoding them may add to
        the model's workspace, encoder_bytes; for the stream's first, its prepared weights, at most
        4 bytes a parameter) besides what the stream holds (held) and the model's workspace: the
        spare workspaces are let go to make room, and a wave past it raises NoRoom before anything
        is allocated or encoded."""
        if len(tags) != len(pieces) or not pieces:
            raise ValueError(f"pieces and tags must be as many, at least one: got {len(pieces)} and {len(tags)}")
        need = len(pieces) * max(1, beam)
        if self.rows_in_use() + need > self.rows:
            raise ValueError(f"a wave of {need} rows does not fit: {self.rows_in_use()} of {self.rows} in use")
        parts = min(len(pieces), step_groups(self.model.cfg, self.precision, _C.get_num_threads(), need))
        plans = [plan_wave(self.model, self.precision, [pieces[i] for i in range(k, len(pieces), parts)], beam,
                           max_len, no_repeat_ngram) for k in range(parts)]
        if room is not None:
            nbytes = sum(plan[-1] for plan in plans) + starting_bytes(self.model, plans, self._prepared)
            spares = sum(map(workspace_bytes, self._spare_workspaces))
            if nbytes > room + spares:
                raise NoRoom(f"{len(pieces)} sentence{'' if len(pieces) == 1 else 's'} at beam {beam} would take "
                             f"{size_text(nbytes)} for their decoding, more than the "
                             f"{size_text(max(room + spares, 0))} left", nbytes)
            if nbytes > room:
                self.let_spares_go()
        return [self._start(plan, [tags[i] for i in range(k, len(pieces), parts)]) for k, plan in enumerate(plans)]

    def _start(self, plan, tags):
        """A wave of a plan (plan_wave): encoded, its caches made, live from the next run()."""
        model = self.model
        src, K, limits, min_len, ngram, rules, length_penalty, nbytes = plan
        workspace = self._spare_workspaces.pop() if self._spare_workspaces else {}
        workspace["prepared"] = self._prepared
        shared, src_pad = _encode_once(model, src, self.precision, workspace)
        cache = DecoderCache(model, shared, src_pad, K, int(limits.max()), workspace=workspace)
        cfg = model.cfg
        extra = {} if K == 1 else dict(length_penalty=float(length_penalty), renormalize=rules["renormalize"],
                                       length_form=rules["length_form"], early_stopping=rules["early_stopping"])
        loop = cache._native.wave(limits, K, min_len=min_len, ngram=ngram, bos=cfg.bos_id, eos=cfg.eos_id,
                                  pad=cfg.pad_id, banned=rules["banned"], forced_eos=rules["forced_eos"], **extra)
        wave = Wave(loop, cache, workspace, list(tags), nbytes)
        self.waves.append(wave)
        return wave

    def run(self, max_steps=64, min_steps=1):
        """Steps every live wave together until, after at least min_steps steps, a sentence has
        finished or `arrived` is set, or until max_steps steps; returns [(tag, tokens)] of the
        sentences finished since the last run (tokens None for those cancelled), and drops the
        waves that are done."""
        if any(wave.live for wave in self.waves):
            groups = step_groups(self.model.cfg, self.precision, _C.get_num_threads(), self.rows_in_use())
            started = time.perf_counter()
            steps = self._stream.run([wave.loop for wave in self.waves], max_steps, self.arrived, groups, min_steps)
            if steps:
                self.step_seconds = (time.perf_counter() - started) / steps
        finished = []
        for wave in self.waves:
            new = np.flatnonzero(wave.loop.finished[:len(wave.tags)].astype(bool) & ~wave.delivered)
            for index in new.tolist():
                wave.delivered[index] = True
                cancelled = wave.loop.cancelled[index]
                finished.append((wave.tags[index], None if cancelled else wave.loop.result(index)))
        for wave in [w for w in self.waves if not w.live]:
            self.waves.remove(wave)
            self._keep_spare(wave.workspace)
        return finished

    def let_spares_go(self):
        """Drop the workspaces kept for later waves; True if there were any."""
        had = bool(self._spare_workspaces)
        self._spare_workspaces.clear()
        return had

    def _keep_spare(self, workspace):
        size = workspace_bytes(workspace)
        self._biggest_workspace = max(self._biggest_workspace, size)
        if sum(map(workspace_bytes, self._spare_workspaces)) + size <= 2 * self._biggest_workspace:
            self._spare_workspaces.append(workspace)


def workspace_bytes(workspace):
    """The bytes of a decoding workspace's arrays (its PreparedWeights not counted)."""
    return sum(a.nbytes for a in workspace.values() if isinstance(a, np.ndarray))
