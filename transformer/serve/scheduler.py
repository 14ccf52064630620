"""One owner of the models: a thread that decodes the sentences of every waiting request together.

Handlers parse and validate; they hand the scheduler a request's texts and wait on a future
(STYLE.md, rule 14: one owner of the model; CTranslate2's BufferedTranslationWrapper keeps one
background thread for its buffer the same way). The scheduler thread:

1. takes every piece waiting in the queue (a text is split the way `translate` splits it: into
   pieces that fit the model's positions; an empty text is "" at once);
2. picks the group (model, decoding options) of the oldest piece waiting, and from that group the
   oldest pieces that fit one batch (at most `batch_tokens` source tokens counted as rows x
   longest, at most `batch_size` sentences, fewer with wide beams, as translate_texts does),
   sorted by length;
3. decodes that batch, hands each piece its translation, resolves every request whose pieces are
   all done, and goes back to 1, so pieces that arrived meanwhile join the next batch.

A piece's translation does not depend on what it was batched with: the engine's batched greedy
and beam search are row-independent (tests/test_serve.py checks every answer against the offline
translation of its own sentence). The queue is bounded in pieces: a request that would pass
`max_queue` is refused (QueueFull), never held in unbounded memory. A request whose client went
away (cancel) has its waiting pieces dropped before they are decoded. stop() refuses new
requests, finishes everything accepted, and ends the thread.
"""
import collections
import concurrent.futures
import itertools
import threading
import time

from ..train import text_pieces


class QueueFull(RuntimeError):
    """The queue holds max_queue pieces: the request is refused (HTTP 429 with Retry-After)."""


class ShuttingDown(RuntimeError):
    """The server is stopping: new requests are refused (HTTP 503)."""


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


class _Piece:
    __slots__ = ("request", "index", "ids", "group", "order")

    def __init__(self, request, index, ids, group, order):
        self.request, self.index, self.ids, self.group, self.order = request, index, ids, group, order


class Scheduler:
    """Decodes the waiting requests' pieces in shared batches on one thread.

    models: {name: ServedModel}. batch_tokens / batch_size bound a batch; max_queue bounds the
    pieces waiting. metrics: a serve.metrics.Metrics (or None)."""

    def __init__(self, models, batch_tokens=4096, batch_size=64, max_queue=4096, metrics=None):
        self.models = models
        self.batch_tokens, self.batch_size, self.max_queue = batch_tokens, batch_size, max_queue
        self.metrics = metrics
        self._waiting = collections.deque()
        self._pending = []              # taken from the queue, not yet decoded (oldest first)
        self._condition = threading.Condition()
        self._stopping = False
        self._order = itertools.count()
        self._thread = threading.Thread(target=self._run, name="transformer-scheduler", daemon=True)
        self._thread.start()

    # -- the handlers' side ------------------------------------------------------------------------
    def submit(self, model_name, texts, options, join=None):
        """A concurrent.futures.Future of the translations of `texts` (list of str), in order.
        options: the decoding options (a hashable tuple of (key, value) pairs: ServedModel.options).
        join(parts): a text's result from its pieces' (default: their texts joined by spaces, as
        translate_texts joins them; an empty text has no pieces)."""
        join = join or " ".join
        served = self.models[model_name]
        future = concurrent.futures.Future()
        pieces, owners = [], []
        for index, text in enumerate(texts):
            for part in text_pieces(served.model, served.src_tokenizer, text):
                pieces.append(part)
                owners.append(index)
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
            self._condition.notify()
        return future

    def cancel(self, future):
        """The client went away: its pieces not yet decoded are dropped."""
        with self._condition:
            for piece in itertools.chain(self._waiting, self._pending):
                if piece.request.future is future:
                    piece.request.cancelled = True

    def queue_length(self):
        with self._condition:
            return len(self._waiting) + len(self._pending)

    def stop(self, timeout=None):
        """Refuse new requests, finish the accepted ones, end the thread."""
        with self._condition:
            self._stopping = True
            self._condition.notify()
        self._thread.join(timeout)

    # -- the scheduler's thread --------------------------------------------------------------------
    def _run(self):
        while True:
            with self._condition:
                while not self._waiting and not self._pending and not self._stopping:
                    self._condition.wait()
                self._pending.extend(self._waiting)
                self._waiting.clear()
                self._pending = [p for p in self._pending if not p.request.cancelled]
                if not self._pending:
                    if self._stopping:
                        return
                    continue
                batch = self._next_batch()
            self._decode(batch)

    def _next_batch(self):
        """The oldest piece's group's oldest pieces that fit one batch, taken out of pending."""
        group = self._pending[0].group
        beam = dict(group[1]).get("beam", 1)
        limit = self.batch_size if beam <= 4 else max(1, self.batch_size * 4 // beam)
        batch, longest = [], 0
        for piece in self._pending:
            if piece.group != group:
                continue
            longest_if_added = max(longest, len(piece.ids))
            if batch and (len(batch) >= limit or longest_if_added * (len(batch) + 1) * max(beam, 1) > self.batch_tokens):
                break
            batch.append(piece)
            longest = longest_if_added
        chosen = set(id(p) for p in batch)
        self._pending = [p for p in self._pending if id(p) not in chosen]
        return batch

    def _decode(self, batch):
        served = self.models[batch[0].group[0]]
        options = dict(batch[0].group[1])
        batch.sort(key=lambda piece: len(piece.ids))
        started = time.monotonic()
        try:
            translations = served.decode([piece.ids for piece in batch], **options)
        except Exception as exc:        # a bug or a refused option: every request of the batch hears it
            for piece in batch:
                if not piece.request.future.done():
                    piece.request.future.set_exception(exc)
            return
        if self.metrics is not None:
            self.metrics.batch(len(batch), time.monotonic() - started)
        for piece, text in zip(batch, translations):
            request = piece.request
            request.results[piece.index] = text
            request.left -= 1
            if request.left == 0 and not request.future.done():
                joined = [[] for _ in range(request.texts)]
                for owner, part in zip(request.owners, request.results):
                    joined[owner].append(part)
                request.future.set_result([request.join(parts) for parts in joined])
        if self.metrics is not None:
            self.metrics.queued(self.queue_length())
