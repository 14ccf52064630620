"""One owner of the models: a thread that decodes the sentences of every waiting request together.

Handlers parse and validate; they hand the scheduler a request's texts and wait on a future
(STYLE.md, rule 14: one owner of the model; CTranslate2's BufferedTranslationWrapper keeps one
background thread for its buffer the same way). A text is split into pieces the way `translate`
splits it (pieces that fit the model's positions; an empty text is "" at once), and the pieces of
all requests wait in one queue. The thread decodes them in one of two ways:

- "step" (the default): iteration-level batching (transformer/streaming.py, csrc/stream.h). The
  waiting pieces join the running batch between two decoder steps as a wave (encoded together),
  and each piece leaves it, and is answered, at its own last step: a one-sentence request that
  arrives during a long batch starts at the next step and is answered when it is done, not when
  the batch is. At most `batch_size` sentences and batch_size x 4 decoder rows (sentences x beam,
  as translate_texts bounds a batch) are in flight; a wave holds at most `batch_tokens` source
  tokens (rows x longest x beam). With a memory budget (`memory`, serve/capacity.py), a wave is
  admitted only into what is left of it, or waits for another wave to finish (_no_room).
- "batch": batching between batches. The thread takes the oldest piece's group (model and
  options) and from it the oldest pieces that fit one batch (the same bounds), decodes that batch
  to its end, answers it, and takes the next: pieces that arrive meanwhile wait for it.

With batch_size 1 both decode one sentence at a time (what the peers' servers do; the bench's
"unbatched"). A piece's translation does not depend on what it was batched with, nor on the step
it joined at: the engine's batched greedy and beam search are row-independent
(tests/test_streaming.py; tests/test_serve.py checks every answer against the offline translation
of its own sentence). The queue is bounded in pieces: a request that would pass `max_queue` is
refused (QueueFull), never held in unbounded memory; one of more pieces than the queue holds at all is
refused as such (TooMany), since retrying it cannot help. A request whose client went away (cancel) has
its waiting pieces dropped, and its pieces in the running batch leave it at the next step. stop()
refuses new requests, finishes everything accepted, and ends the thread.

No client can stop the thread. A request's future may be cancelled at any instant, from the event
loop, even between the thread's look at it and its answer: an answer to a future nobody waits for
is dropped, never an error (InvalidStateError ended the thread once, and every later request
waited forever). A request that failed or was cancelled has its other pieces dropped, not decoded
for nobody. A failure of ours fails the requests it touched and the thread goes on; `health()`
says whether the thread lives and since when its current step runs.

Admission takes turns across requests (round robin by request, then by arrival): a one-sentence
request that arrives during a request of hundreds of sentences takes the next free row, not the
last one. A group with alternatives (n-best: the stream keeps one hypothesis a sentence) is
decoded in batches by beam search in Python, one batch at a time, and that batch a few steps at a
time (ServedModel.alternatives_steps): between two runs of the streams it takes a slice of steps
that ends once it has run as long as a stream's run (MIN_INTERVAL) while anything else waits, so a
request of 255 alternatives over many sentences holds up the others for a step or so at a time,
not for a whole batch of 256-beam sentences decoded to their ends. Its answers are those of the
same batch decoded at once (the same steps), and so each sentence's is its offline
beam_search(n_best=...) alone.
"""
import collections
import concurrent.futures
import itertools
import logging
import threading
import time

from ..cgroups import size_text
from ..streaming import NoRoom, plan_wave, starting_bytes, workspace_bytes
from ..train import text_pieces

BATCHING = ("step", "batch")
# A stream returns to the thread at least this often (steps), so a stop or a cancel is seen.
MAX_STEPS = 64
# ... and at most every MIN_INTERVAL seconds (in whole steps, from the stream's last seconds a
# step) while sentences finish or requests arrive: those that finish or arrive within it are
# answered or admitted together. Each return costs the thread's Python work, which competes with
# the HTTP side for the interpreter while requests keep arriving, and each step of waiting delays
# an answer or an admission. Measured on the tiny model's server at 64 clients (Zen 4, family 25
# model 17, 2 threads, int8, beam 4; a step about 2 ms), against batching between batches in the
# same run: returning after every step gave 0.80-0.88x its throughput and a short request among
# long ones its answer in 0.38-0.47x the p50; every 10 ms (5 steps) 0.86x, and the short requests'
# p50 1.18x, no better than batching's; every 20 ms 0.90-0.97x. A few milliseconds keep the
# latency. A base step (about 40 ms) is longer than the interval: it returns after every step.
MIN_INTERVAL = 0.004
LOG = logging.getLogger("transformer.serve")


class QueueFull(RuntimeError):
    """The queue holds max_queue pieces: the request is refused (HTTP 429 with Retry-After)."""


class TooMany(ValueError):
    """A request of more pieces than the queue holds even when empty (HTTP 413: retrying cannot help)."""


class ShuttingDown(RuntimeError):
    """The server is stopping: new requests are refused (HTTP 503)."""


class TooWide(ValueError):
    """A beam wider than the decoder rows the server holds (HTTP 400, naming the limit)."""


class TooLarge(MemoryError):
    """A sentence whose decoding alone would pass the memory the server's waves may fill (HTTP 413)."""


def _width(options):
    """The beam a group decodes with: its beam, and at least alternatives + 1 (models.py)."""
    chosen = dict(options)
    return max(chosen.get("beam", 1), chosen.get("alternatives", 0) + 1)


def _streams(options):
    """Whether a stream decodes a group: not one with alternatives (the stream keeps only each
    sentence's best hypothesis), which is decoded in batches a slice of steps at a time between the
    stream's runs."""
    return "alternatives" not in dict(options)


class _Request:
    """A request's texts: its pieces' translations as they come, and the future of the whole."""

    def __init__(self, owners, texts, future, join):
        self.owners = owners                    # piece index -> text index
        self.texts, self.join = texts, join
        self.results = [None] * len(owners)
        self.left = len(owners)
        self.future = future
        self.cancelled = False
        self.arrived = time.monotonic()


class _Alternatives:
    """The n-best batch decoding now: its pieces, its steps (a generator, None until its first
    slice), and the bytes its workspace may hold while it decodes (wave_bytes, once admitted)."""

    def __init__(self, pieces):
        self.pieces, self.steps, self.nbytes = pieces, None, 0


class _Piece:
    __slots__ = ("request", "index", "ids", "group", "order", "wave", "slot")

    def __init__(self, request, index, ids, group, order):
        self.request, self.index, self.ids, self.group, self.order = request, index, ids, group, order
        self.wave = self.slot = None            # "step": where it decodes once admitted


def max_rows(models, batch_size):
    """The decoder rows in flight at most: batch_size sentences of 4 beams, as translate_texts bounds
    a batch, and never fewer than the widest default beam (one sentence of it)."""
    return max([batch_size * 4] + [served.defaults["beam"] for served in models.values()])


class Scheduler:
    """Decodes the waiting requests' pieces in shared batches on one thread.

    models: {name: ServedModel}. batching: "step" or "batch" (module docstring). batch_tokens /
    batch_size bound a batch; max_queue bounds the pieces waiting. metrics: a serve.metrics.Metrics
    (or None)."""

    def __init__(self, models, batch_tokens=4096, batch_size=64, max_queue=4096, metrics=None, batching="step",
                 stuck_after=60.0, memory=None):
        if batching not in BATCHING:
            raise ValueError(f"batching must be one of {', '.join(BATCHING)}, got {batching!r}")
        self.models, self.batching = models, batching
        self.batch_tokens, self.batch_size, self.max_queue = batch_tokens, batch_size, max_queue
        self.max_rows = max_rows(models, batch_size)
        # "step": the bytes every stream's waves may hold at once (streaming.wave_bytes), or None:
        # a wave past what is left waits for a wave to finish, a sentence past it all is refused
        self.memory = memory
        self.memory_waits = 0           # times a wave was put back to wait for memory
        self.metrics = metrics
        self._waiting = collections.deque()
        self._pending = []              # taken from the queue, not yet decoded (oldest first)
        self._decoding = set()          # "step": pieces admitted to a stream, not yet finished
        self._streams = {}              # "step": (model name, precision) -> DecodingStream
        self._condition = threading.Condition()
        self._stopping = False
        self._order = itertools.count()
        self.stuck_after = stuck_after  # seconds one decoding step or batch may take before health() says stuck
        self._busy_since = None         # when the step or batch now decoding began (None: between them)
        self.failures = 0               # failures of ours the thread survived
        self._holding = []              # pieces taken out of pending, not yet in a stream or answered
        self._alternatives = None       # "step": the n-best batch decoding a slice at a time (_Alternatives)
        self._alternatives_workspaces = {}  # model name -> the buffers its n-best batches reuse
        run = self._run_steps if batching == "step" else self._run_batches
        self._thread = threading.Thread(target=run, name="transformer-scheduler", daemon=True)
        self._thread.start()

    # -- the handlers' side ------------------------------------------------------------------------
    def pieces(self, model_name, texts):
        """(pieces, owners): the source ids of `texts` cut to the model's positions, and the text
        each piece is of; TooMany past the whole queue, said as soon as it is. It reads only the
        model's tokenizer: a handler may call it off the loop for a large request (the subwords of
        a megabyte take a second and a half) and give them to submit."""
        served = self.models[model_name]
        pieces, owners = [], []
        for index, text in enumerate(texts):
            for part in text_pieces(served.model, served.src_tokenizer, text):
                pieces.append(part)
                owners.append(index)
            if len(pieces) > self.max_queue:
                raise TooMany(f"the texts make {'at least ' if index + 1 < len(texts) else ''}{len(pieces)} "
                              "pieces (sentences cut to the model's positions); the queue takes at most "
                              f"{self.max_queue} (--max-queue)")
        return pieces, owners

    def submit(self, model_name, texts, options, join=None, pieces=None):
        """A concurrent.futures.Future of the translations of `texts` (list of str), in order.
        options: the decoding options (a hashable tuple of (key, value) pairs: ServedModel.options).
        join(parts): a text's result from its pieces' (default: their texts joined by spaces, as
        translate_texts joins them; an empty text has no pieces). pieces: what
        self.pieces(model_name, texts) gave, if the caller made them."""
        join = join or " ".join
        chosen = dict(options)
        beam = _width(options)
        if beam > self.max_rows:
            said = "alternatives + 1" if beam > chosen.get("beam", 1) else "beam"
            raise TooWide(f"{said} must be at most {self.max_rows} (the decoder rows the server holds: "
                          f"--batch-size x 4), got {beam}")
        future = concurrent.futures.Future()
        pieces, owners = pieces or self.pieces(model_name, texts)
        request = _Request(owners, len(texts), future, join)
        if not pieces:
            future.set_result([join([]) for _ in texts])
            return future
        group = (model_name, options)
        with self._condition:
            if self._stopping:
                raise ShuttingDown("the server is stopping")
            queued = len(self._waiting) + len(self._pending)
            if queued + len(pieces) > self.max_queue:
                raise QueueFull(f"the queue holds {queued} sentences and takes at most {self.max_queue}")
            for index, ids in enumerate(pieces):
                self._waiting.append(_Piece(request, index, ids, group, next(self._order)))
            if self.metrics is not None:
                self.metrics.queued(len(self._waiting) + len(self._pending))
            for stream in self._streams.values():   # a running stream returns after its step
                stream.arrived[0] = 1
            self._condition.notify()
        return future

    def cancel(self, future):
        """The client went away: its pieces not yet decoded are dropped, those decoding leave."""
        with self._condition:
            batch = self._alternatives      # read once: the thread may end it meanwhile
            alternatives = batch.pieces if batch is not None else ()
            for piece in itertools.chain(self._waiting, self._pending, self._decoding, alternatives):
                if piece.request.future is future:
                    piece.request.cancelled = True

    def queue_length(self):
        with self._condition:
            return len(self._waiting) + len(self._pending)

    def health(self):
        """(ok, what): whether the thread lives and is not stuck in one step or batch for more than
        stuck_after seconds, and a dict saying so (GET /health)."""
        alive = self._thread.is_alive()
        busy_since = self._busy_since
        busy = 0.0 if busy_since is None else time.monotonic() - busy_since
        stuck = busy > self.stuck_after
        return alive and not stuck, {"alive": alive, "step_seconds": round(busy, 3), "stuck": stuck,
                                     "stuck_after_s": self.stuck_after, "failures": self.failures}

    def stop(self, timeout=None):
        """Refuse new requests, finish the accepted ones, end the thread."""
        with self._condition:
            self._stopping = True
            self._condition.notify()
        self._thread.join(timeout)

    # -- the scheduler's thread --------------------------------------------------------------------
    def _take_waiting(self):
        """Under the lock: the waiting pieces join the pending ones, those nobody waits for go, and
        pending is put in turns: each request's first piece, then each one's second..."""
        if not self._waiting and all(not _gone(p) for p in self._pending):
            return
        self._pending.extend(self._waiting)
        self._waiting.clear()
        by_request = {}
        for piece in self._pending:
            if not _gone(piece):
                by_request.setdefault(id(piece.request), []).append(piece)
        queues = list(by_request.values())
        self._pending = [piece for turn in itertools.zip_longest(*queues) for piece in turn if piece is not None]

    def _fitting(self, group, sentences, rows, tokens=None):
        """The first pending pieces (in turns across requests) of `group` that fit `sentences`
        sentences, `rows` decoder rows and batch_tokens source tokens (rows x longest x beam),
        taken out of pending."""
        beam = _width(group[1])
        sentences = min(sentences, rows // beam)
        batch, longest = [], 0
        for piece in self._pending:
            if piece.group != group:
                continue
            longest_if_added = max(longest, len(piece.ids))
            if len(batch) >= sentences or (batch and longest_if_added * (len(batch) + 1) * beam > self.batch_tokens):
                break
            batch.append(piece)
            longest = longest_if_added
        chosen = set(id(p) for p in batch)
        self._pending = [p for p in self._pending if id(p) not in chosen]
        return batch

    def _answer(self, piece, result):
        request = piece.request
        request.results[piece.index] = result
        request.left -= 1
        if request.left == 0 and not request.future.done():
            joined = [[] for _ in range(request.texts)]
            for owner, part in zip(request.owners, request.results):
                joined[owner].append(part)
            try:
                answer = [request.join(parts) for parts in joined]
            except Exception as exc:    # a bug in joining: this request hears it, the thread goes on
                _settle(request, exc=exc)
                return
            _settle(request, answer)

    @staticmethod
    def _fail(pieces, exc):
        for piece in pieces:
            _settle(piece.request, exc=exc)

    def _survive(self, exc):
        """A failure of ours outside any one request's decoding (admitting, starting a stream): every
        request taken from the queue hears it, the state is cleared, and the thread goes on."""
        self.failures += 1
        LOG.error("the scheduler failed; the requests it held are answered with the error", exc_info=exc)
        with self._condition:
            touched = list(self._pending) + list(self._decoding) + self._holding
            if self._alternatives is not None:
                touched += self._alternatives.pieces
                self._close_alternatives()
            self._pending, self._decoding, self._holding = [], set(), []
        self._fail(touched, exc)
        for stream in self._streams.values():
            stream.waves.clear()

    # "batch": one batch decoded to its end at a time
    def _run_batches(self):
        while True:
            try:
                if self._batch_turn():
                    return
            except Exception as exc:
                self._survive(exc)

    def _batch_turn(self):
        """One batch taken and decoded; True once stopped with nothing left."""
        with self._condition:
            while not self._waiting and not self._pending and not self._stopping:
                self._condition.wait()
            self._take_waiting()
            if not self._pending:
                return self._stopping
            batch = self._holding = self._fitting(self._pending[0].group, self.batch_size, self.max_rows)
        self._decode(batch)
        self._holding = []
        return False

    def _decode(self, batch):
        batch = [piece for piece in batch if not _gone(piece)]
        if not batch:
            return
        served = self.models[batch[0].group[0]]
        options = dict(batch[0].group[1])
        batch.sort(key=lambda piece: len(piece.ids))
        started = self._busy_since = time.monotonic()
        try:
            translations = served.decode([piece.ids for piece in batch], **options)
        except Exception as exc:        # a bug or a refused option: every request of the batch hears it
            self._fail(batch, exc)
            return
        finally:
            self._busy_since = None
        if self.metrics is not None:
            self.metrics.batch(len(batch), time.monotonic() - started)
        for piece, text in zip(batch, translations):
            self._answer(piece, text)
        if self.metrics is not None:
            self.metrics.queued(self.queue_length())

    # "step": iteration-level batching
    def _run_steps(self):
        turn = itertools.count()
        while True:
            try:
                if self._step_turn(turn):
                    return
            except Exception as exc:
                self._survive(exc)

    def _step_turn(self, turn):
        """Admit what fits, run one stream for a few steps, and the n-best batch for a slice of
        steps; True once stopped with nothing left."""
        with self._condition:
            while (not self._waiting and not self._pending and not self._decoding and self._alternatives is None
                   and not self._stopping):
                self._condition.wait()
            for stream in self._streams.values():
                stream.arrived[0] = 0
            self._take_waiting()
            for piece in self._decoding:
                if _gone(piece):
                    piece.wave.cancel(piece.slot)
            if self._alternatives is not None and all(_gone(p) for p in self._alternatives.pieces):
                self._close_alternatives()      # nobody waits for any of it: not decoded for nobody
            if not self._pending and not self._decoding and self._alternatives is None:
                return self._stopping
            if self._alternatives is None:
                first = next((p for p in self._pending if not _streams(p.group[1])), None)
                if first is not None:
                    self._alternatives = _Alternatives(self._fitting(first.group, self.batch_size, self.max_rows))
            waves = self._admit()
            self._holding = [piece for _, _, pieces in waves for piece in pieces]
        for stream, group, pieces in waves:
            self._start(stream, group, pieces)
        self._holding = []
        live = [s for s in self._streams.values() if s.waves]
        if not live:
            with self._condition:   # nothing decodes: no piece can be left waiting on a wave
                self._decoding.clear()
        else:
            self._run_stream(live[next(turn) % len(live)])   # streams of several models or precisions take turns
        if self._alternatives is not None:
            self._alternatives_slice(self._alternatives)
        return False

    def _alternatives_slice(self, batch):
        """A slice of the n-best batch's steps: until it ends, or for MAX_STEPS steps, or once it
        has run MIN_INTERVAL while anything else waits (a stream's sentences, a new request) or
        nobody waits for it; its sentences answered when it ends."""
        if batch.steps is None:
            batch.pieces.sort(key=lambda piece: len(piece.ids))
            if not self._admit_alternatives(batch):
                return
            name, options = batch.pieces[0].group
            batch.steps = self.models[name].alternatives_steps(
                [piece.ids for piece in batch.pieces], workspace=self._alternatives_workspaces.setdefault(name, {}),
                **dict(options))
        started = self._busy_since = time.monotonic()
        try:
            for step in range(1, MAX_STEPS + 1):
                next(batch.steps)
                if step == MAX_STEPS or (time.monotonic() - started >= MIN_INTERVAL and
                                         (self._others_wait() or all(_gone(p) for p in batch.pieces))):
                    return              # the turn admits what waits, or drops what nobody waits for
        except StopIteration as end:
            translations = end.value
        except Exception as exc:        # a bug or a refused option: every request of the batch hears it
            self._alternatives = None
            self._fail(batch.pieces, exc)
            return
        finally:
            self._busy_since = None
            if self.metrics is not None:
                self.metrics.batch(len(batch.pieces), time.monotonic() - started)
        self._alternatives = None
        for piece, text in zip(batch.pieces, translations):
            self._answer(piece, text)
        if self.metrics is not None:
            self.metrics.queued(self.queue_length())

    def _admit_alternatives(self, batch):
        """Whether the n-best batch may start now, with a memory budget: as a stream's wave
        (_no_room), while waves decode a batch past the memory left waits at the head of the
        queue; with none, spare workspaces are let go, then the batch is cut in halves (the
        longer half waits); a sentence alone past all of it is refused (TooLarge)."""
        if self.memory is None:
            return True
        while True:
            try:
                wave, start = self._alternatives_bytes(batch.pieces)
            except Exception as exc:        # a refused option: its requests hear it
                self._alternatives = None
                self._fail(batch.pieces, exc)
                return False
            if wave + start <= self.memory - self.held():
                batch.nbytes = wave
                return True
            if any(s.waves for s in self._streams.values()):
                self.memory_waits += 1
                self._alternatives = None
                with self._condition:
                    self._pending[:0] = batch.pieces
                return False
            if any([s.let_spares_go() for s in self._streams.values()]) or self._let_alternatives_go(batch):
                continue
            if len(batch.pieces) == 1:
                self._alternatives = None
                self._fail(batch.pieces, self._too_large(batch.pieces[0], wave + start))
                return False
            half = len(batch.pieces) // 2
            with self._condition:
                self._pending[:0] = batch.pieces[half:]
            batch.pieces = batch.pieces[:half]

    def _alternatives_bytes(self, pieces):
        """(its wave's bytes, what starting it adds: streaming.starting_bytes) for an n-best batch
        of `pieces`, past what the workspace it reuses holds."""
        name, options = pieces[0].group
        chosen = dict(options)
        model = self.models[name].model
        workspace = self._alternatives_workspaces.get(name, {})
        plan = plan_wave(model, chosen["precision"], [p.ids for p in pieces], _width(options), chosen["max_len"],
                         chosen["no_repeat_ngram"])
        return plan[-1], starting_bytes(model, [plan], workspace.get("prepared")) - \
            min(workspace_bytes(workspace), plan[-1])

    def _let_alternatives_go(self, batch=None):
        """Drop the workspaces n-best batches keep for the next (not `batch`'s); True if any."""
        keep = None if batch is None else batch.pieces[0].group[0]
        gone = [name for name in self._alternatives_workspaces if name != keep]
        for name in gone:
            del self._alternatives_workspaces[name]
        return bool(gone)

    def _others_wait(self):
        """Whether anything but the n-best batch waits for the thread (read without the lock: a
        request that arrives just after is seen at the next step)."""
        return bool(self._waiting or self._pending or any(stream.waves for stream in self._streams.values()))

    def _close_alternatives(self):
        if self._alternatives.steps is not None:
            self._alternatives.steps.close()
        self._alternatives = None

    def _run_stream(self, stream):
        """A few steps of `stream`, and the sentences that finished answered."""
        started = self._busy_since = time.monotonic()
        rows = stream.rows_in_use()
        try:
            per_step = stream.step_seconds
            finished = stream.run(MAX_STEPS, max(1, min(MAX_STEPS, round(MIN_INTERVAL / per_step)))
                                  if per_step else 1)
        except Exception as exc:    # a bug: every sentence in the stream hears it
            self._fail([p for p in self._decoding if p.wave in stream.waves], exc)
            self._drop(stream)
            return
        finally:
            self._busy_since = None
        if self.metrics is not None:
            self.metrics.batch(rows, time.monotonic() - started)
        for piece, tokens in finished:
            self._finish(piece, tokens)
        if self.metrics is not None:
            self.metrics.queued(self.queue_length())

    def _stream(self, model_name, precision):
        from ..streaming import DecodingStream
        key = (model_name, precision)
        if key not in self._streams:
            self._streams[key] = DecodingStream(self.models[model_name].model, precision, rows=self.max_rows)
        return self._streams[key]

    def _admit(self):
        """Under the lock: the pending pieces that fit the streams' room now, as waves
        [(stream, group, pieces)], oldest first; taken out of pending."""
        waves = []
        room = {}                   # stream -> [sentences, rows] left
        while self._pending:
            for piece in self._pending:
                name, options = piece.group
                if not _streams(options):
                    continue
                stream = self._stream(name, dict(options)["precision"])
                if stream not in room:
                    in_flight = sum(w.sentences_left for w in stream.waves)
                    room[stream] = [self.batch_size - in_flight, stream.rows - stream.rows_in_use()]
                sentences, rows = room[stream]
                beam = dict(options)["beam"]
                if sentences >= 1 and rows >= beam:
                    break
            else:
                break               # nothing pending fits now
            pieces = self._fitting(piece.group, sentences, rows)
            room[stream][0] -= len(pieces)
            room[stream][1] -= len(pieces) * beam
            waves.append((stream, piece.group, pieces))
        return waves

    def _start(self, stream, group, pieces):
        options = dict(group[1])
        room = None if self.memory is None else self.memory - self.held()
        try:
            waves = stream.add([p.ids for p in pieces], pieces, beam=options["beam"], max_len=options["max_len"],
                               no_repeat_ngram=options["no_repeat_ngram"], room=room)
        except NoRoom as exc:
            self._no_room(stream, group, pieces, exc)
            return
        except Exception as exc:        # a refused option: its requests hear it
            self._fail(pieces, exc)
            return
        with self._condition:
            for wave in waves:
                for slot, piece in enumerate(wave.tags):
                    piece.wave, piece.slot = wave, slot
                    self._decoding.add(piece)

    def held(self):
        """Bytes the decoding holds beyond the step buffers: every stream's (DecodingStream.held);
        the n-best batches' workspaces (the live batch's at least what it was admitted as) and
        prepared weights; and each model's own workspace, which encoding grew."""
        models = {id(s.model): s.model for s in self._streams.values()}
        batch = self._alternatives
        live = None if batch is None or batch.steps is None else batch.pieces[0].group[0]
        alternatives = 0
        for name, workspace in self._alternatives_workspaces.items():
            models[id(self.models[name].model)] = self.models[name].model
            arrays = workspace_bytes(workspace)
            alternatives += max(arrays, batch.nbytes) if name == live else arrays
            if "prepared" in workspace:
                alternatives += workspace["prepared"].nbytes()
        return sum(s.held() for s in self._streams.values()) + alternatives + \
            sum(m.ws.nbytes() for m in models.values())

    def _no_room(self, stream, group, pieces, exc):
        """A wave past the memory left (--batch-size's rows, at their lengths): while other waves
        or an n-best batch decode, its pieces wait at the head of the queue for one to finish; with
        none, the other streams' spare workspaces and the n-best batches' are let go, then it is
        tried in halves; a sentence alone past all of it is refused (TooLarge)."""
        if any(s.waves for s in self._streams.values()) or \
                (self._alternatives is not None and self._alternatives.steps is not None):
            self.memory_waits += 1
            with self._condition:
                self._pending[:0] = pieces
            return
        # other models' or precisions' spare workspaces go first (a list: every one is let go),
        # and those the n-best batches keep
        if any([s.let_spares_go() for s in self._streams.values() if s is not stream]) or \
                self._let_alternatives_go():
            self._start(stream, group, pieces)
            return
        if len(pieces) > 1:
            half = len(pieces) // 2
            self._start(stream, group, pieces[:half])
            self._start(stream, group, pieces[half:])
            return
        self._fail(pieces, self._too_large(pieces[0], exc.need))

    def _too_large(self, piece, need):
        return TooLarge(f"a sentence of {len(piece.ids)} tokens at beam {_width(piece.group[1])} needs "
                        f"{size_text(need)} for its decoding, more than the {size_text(self.memory)} the "
                        f"server's decoding may hold")

    def _finish(self, piece, tokens):
        with self._condition:
            self._decoding.discard(piece)
        if tokens is None or _gone(piece):     # left the batch, or nobody waits for it: not decoded
            return
        served = self.models[piece.group[0]]
        options = dict(piece.group[1])
        try:
            result = served.outputs([piece.ids], [tokens], options["precision"], options.get("scores", False),
                                    options.get("attention", False))[0]
        except Exception as exc:
            self._fail([piece], exc)
            return
        self._answer(piece, result)

    def _drop(self, stream):
        with self._condition:
            self._decoding = {p for p in self._decoding if p.wave not in stream.waves}
        stream.waves.clear()


def _gone(piece):
    """Whether nobody waits for the piece's request: its client went away (cancel), its future was
    cancelled from the event loop, or another of its pieces failed."""
    return piece.request.cancelled or piece.request.future.done()


def _settle(request, result=None, exc=None):
    """The request's future answered, unless it is already done: cancelled from the event loop at
    any instant, even between a look at done() and this call (no lock is shared with asyncio), or
    failed by another piece. Its other pieces are dropped from then on (_gone)."""
    request.cancelled = request.cancelled or exc is not None
    try:
        if exc is not None:
            request.future.set_exception(exc)
        else:
            request.future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass                            # nobody waits for it: the answer goes nowhere
