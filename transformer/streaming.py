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
from .data import collate
from .decoding import (DecoderCache, _encode_once, _prepared, beam_args, greedy_args, step_groups)
from .precision import check_precision


class Wave:
    """Sentences added together: their decoding loop (a DecoderLoop of the C side) and the tags
    the caller gave them."""

    def __init__(self, loop, cache, workspace, tags):
        self.loop, self.cache, self.workspace, self.tags = loop, cache, workspace, tags
        self.delivered = np.zeros(len(tags), bool)

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

    def add(self, pieces, tags, beam=1, max_len=None, no_repeat_ngram=0):
        """Start decoding `pieces` (source id lists); tags[i] comes back with piece i's tokens.
        beam 1: greedy decoding; else beam search of `beam` beams, with the model's generation
        settings as beam_search takes them; max_len and no_repeat_ngram as there. Returns the
        waves: one, or one per thread when the pieces are enough to split a step's rows across
        threads (step_groups; a wave is stepped whole by one thread, csrc/stream.h), the pieces
        dealt to them in turn, as decoder_greedy deals sentences to its blocks."""
        if len(tags) != len(pieces) or not pieces:
            raise ValueError(f"pieces and tags must be as many, at least one: got {len(pieces)} and {len(tags)}")
        need = len(pieces) * max(1, beam)
        if self.rows_in_use() + need > self.rows:
            raise ValueError(f"a wave of {need} rows does not fit: {self.rows_in_use()} of {self.rows} in use")
        parts = min(len(pieces), step_groups(self.model.cfg, self.precision, _C.get_num_threads(), need))
        return [self._add([pieces[i] for i in range(k, len(pieces), parts)],
                          [tags[i] for i in range(k, len(pieces), parts)], beam, max_len, no_repeat_ngram)
                for k in range(parts)]

    def _add(self, pieces, tags, beam, max_len, no_repeat_ngram):
        model = self.model
        max_len, rules = model._generation_rules(max_len, None, None)
        src = collate([(ids, [], []) for ids in pieces], range(len(pieces)), model.cfg.pad_id)[0]
        if beam > 1:
            options = model._beam_options(beam, None, None, None)
            src, K, limits, min_len, ngram, rules = beam_args(
                model, src, options["beam_size"], max_len, options["length_penalty"], 0, no_repeat_ngram,
                self.precision, rules["forced_eos"], rules["banned"], options["renormalize"],
                options["length_form"], options["early_stopping"])
            length_penalty = options["length_penalty"]
        else:
            src, limits, min_len, ngram, rules = greedy_args(model, src, max_len, 0, no_repeat_ngram,
                                                             rules["forced_eos"], rules["banned"])
            K, length_penalty = 1, 0.0
        workspace = self._spare_workspaces.pop() if self._spare_workspaces else {}
        workspace["prepared"] = self._prepared
        shared, src_pad = _encode_once(model, src, self.precision, workspace)
        cache = DecoderCache(model, shared, src_pad, K, int(limits.max()), workspace=workspace)
        cfg = model.cfg
        extra = {} if K == 1 else dict(length_penalty=float(length_penalty), renormalize=rules["renormalize"],
                                       length_form=rules["length_form"], early_stopping=rules["early_stopping"])
        loop = cache._native.wave(limits, K, min_len=min_len, ngram=ngram, bos=cfg.bos_id, eos=cfg.eos_id,
                                  pad=cfg.pad_id, banned=rules["banned"], forced_eos=rules["forced_eos"], **extra)
        wave = Wave(loop, cache, workspace, list(tags))
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

    def _keep_spare(self, workspace):
        size = _nbytes(workspace)
        self._biggest_workspace = max(self._biggest_workspace, size)
        if sum(map(_nbytes, self._spare_workspaces)) + size <= 2 * self._biggest_workspace:
            self._spare_workspaces.append(workspace)


def _nbytes(workspace):
    return sum(a.nbytes for a in workspace.values() if isinstance(a, np.ndarray))
