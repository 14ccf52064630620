"""The HTTP side: LibreTranslate's API, our native endpoint, health and metrics, on aiohttp.

Handlers parse, validate and wait; the Scheduler owns the models. Endpoints:

    POST /translate      LibreTranslate's: fields from JSON, or the query string and a form
                         (fields.py); q (a string or a list of strings), source (any standard code
                         of a language, or "auto"), target, format ("text" or "html"), alternatives,
                         api_key. Each text is cut into sentences (documents.py), every sentence
                         translated alone in the shared batches, and joined back. Answers
                         {"translatedText": ...} (a string or a list, as q was), with
                         "detectedLanguage" for source "auto" and "alternatives" when asked.
    POST /detect         [{"confidence", "language"}], best first, among the served sources
    GET  /languages      [{"code", "name", "targets"}]: every served language (pairs.py)
    GET  /frontend/settings  LibreTranslate's: charLimit, keyRequired, the default languages, and
                         filesTranslation with supportedFilesFormat
    POST /translate_file LibreTranslate's: a multipart form of file, source, target, api_key; the
                         file's text (formats.py) translated as /translate's, in the same batches and
                         under the same limits a minute. Answers {"translatedFileUrl": ...}
    GET  /download_file/NAME  the translated file, until it expires (files.py); another name is 404
    POST /v1/translate   ours: q, source/target or model, beam, max_len, no_repeat_ngram, scores
                         (log-probabilities), attention (each sentence's cross-attention matrix)
    GET  /health         {"status": "ok", "models": [...], "queue": n, "api_keys": bool}
    GET  /metrics        Prometheus' text format
    GET  /               a page: translate, and see each output word's cross-attention over the
                         source (static/: no CDN, it works offline)

Errors take LibreTranslate's form, {"error": "..."}, naming the field: 400 for a bad request, 403
for a missing or wrong API key, 408 for a body slower than --body-timeout, 413 for a body over the
limit, 421 for a Host a loopback server does not answer to (access.py), 429 (with Retry-After) when
the queue is full or a limit a minute is passed (limits.py), 413 for a sentence whose decoding alone
passes the memory the decoding may hold (capacity.py), and for texts of more pieces than the whole
queue holds, 503 while the server stops (stopping.py: a request read after SIGTERM) and, with
Retry-After, when a batch's caches would pass the memory the process may fill, 500 for a bug of
ours: its body says only that, with an id, and the log has the traceback under that id. Whatever a
client sends is a 4xx, never a 500; a client that closes its connection while its body is read is
counted as 499, not logged as ours.
"""
import asyncio
import concurrent.futures
import errno
import inspect
import logging
import os
import sqlite3
import time
import uuid

from aiohttp import web

from ..languages import alpha2, english_name
from .documents import Budget, TooMuch, of_html, of_text
from .access import Access
from .connections import Guard
from .fields import BadRequest, Limits, alternatives_of, format_of, read_fields, read_upload, shown, texts_of
from .files import Files
from .formats import FORMATS, FormatError, extension, read as read_file
from .keys import Keys
from .limits import RateLimits, Refused
from .markup import MarkupError
from .office import Busy
from .pairs import Pairs
from .scheduler import QueueFull, ShuttingDown, TooLarge, TooMany, TooWide
from .stopping import STOPPING, Stopping

__all__ = ["GUARD", "BadRequest", "Limits", "Server"]

RETRY_AFTER_S = 1
FILE_THREADS = 2        # threads that read and write uploaded files (Server.file_threads)
FILE_JOBS = 16          # uploads in flight at once, past it 503: each holds up to --max-file-size
FILE_READ_S = 10.0      # seconds reading one upload may take on a file thread, past it 413 (documents.Budget)
OFF_LOOP_CHARS = 16384  # a request's texts past it are cut into subwords off the loop (some 25 ms of it)
# a file's characters at most: the queue's pieces at the model's positions, at 4 characters a
# subword (what English BPE averages, space included); past it 413 as it is read. The subwords of
# a 64 MiB sentence took two minutes and a gigabyte
CHARS_PER_SUBWORD = 4
# what /metrics counts for a request whose client closed its connection before the body came
# (nginx's 499): no answer reaches it, and it is not a 500 of ours
CLIENT_GONE = 499
LOG = logging.getLogger("transformer.serve")
STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")   # the page and its assets
FRONTEND_TIMEOUT_MS = 500           # LibreTranslate's default frontendTimeout
GUARD = web.AppKey("guard", Guard)


def _error(message, status, headers=None):
    return web.json_response({"error": message}, status=status, headers=headers)


def _internal_error(request):
    """The id of a failure of ours, its traceback logged under it: the answer says only that it
    happened and the id (an exception's text can hold paths, a model's internals, the request)."""
    error_id = uuid.uuid4().hex[:12]
    LOG.error("internal error, id %s, answering %s %s", error_id, request.method, request.path, exc_info=True)
    return error_id


def _endpoint(request):
    """The route a request matched, as /metrics labels it: its pattern ("/static/{filename}"), or
    "other" for every path no route has (a label a client could choose would grow /metrics, and
    the server's memory, with every path it makes up)."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "other"


def _join_details(parts):
    """A sentence's native result from its pieces' details (ServedModel._details)."""
    return {"translatedText": " ".join(part["text"] for part in parts), "sentences": parts}


def _join_alternatives(parts):
    """A sentence's hypotheses from its pieces' (each a list, best first): the k-th of each piece
    joined, a piece with fewer giving its best."""
    if not parts:
        return [""]
    return [" ".join(piece[k] if k < len(piece) else piece[0] for piece in parts)
            for k in range(max(len(piece) for piece in parts))]


def _unique(texts, main, n):
    """LibreTranslate's filter_unique: the texts other than the main one and "", once each, at most n."""
    seen, out = {main, ""}, []
    for text in texts:
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out[:n]


async def _off_loop_if_large(texts, work, executor=None):
    """work() on a thread (executor, else the loop's default) when the texts hold more than
    OFF_LOOP_CHARS characters, else here: cutting a megabyte into sentences or subwords held the
    loop, and every other request, for a second or more."""
    if sum(map(len, texts)) > OFF_LOOP_CHARS:
        return await asyncio.get_running_loop().run_in_executor(executor, work)
    return work()


class Server:
    """The aiohttp application around a Scheduler. detector: a Detector of the served sources."""

    def __init__(self, scheduler, limits, metrics, api_keys=None, detector=None, access=None, rates=None):
        from .detect import Detector

        self.scheduler, self.limits, self.metrics = scheduler, limits, metrics
        # the valid keys (a Keys, or a set of them), or None: no key needed (any is ignored)
        self.keys = Keys(plain=api_keys) if isinstance(api_keys, (set, frozenset, list, tuple)) else api_keys
        self.api_keys = self.keys is not None
        self.access = access or Access()
        self.rates = rates or RateLimits()     # the limits a minute, in --req-limit-storage's store
        self.models = scheduler.models
        self.detector = detector or Detector({m.source for m in self.models.values()})
        self.pairs = Pairs(self.models, self.detector)
        self._defaults = {name: served.options() for name, served in self.models.items()}   # each model's options
        self._splitting = {name: alpha2(served.source) for name, served in self.models.items()}   # its rules' language
        self.stopping = Stopping()           # set by listen() on SIGTERM
        self.guard = Guard(limits.max_connections, limits.header_timeout)   # listen() puts it in front
        self.guard.busy = lambda handler: handler in self.stopping.busy
        self.files = Files(limits.file_expiry)   # the translated files, until downloaded or expired
        # files are read and written on threads of their own: a slow one (reading may take up to
        # FILE_READ_S) waits for these, not the loop's default threads, which detect
        # languages for every request with source "auto" (six of them once did)
        self.file_threads = concurrent.futures.ThreadPoolExecutor(FILE_THREADS, thread_name_prefix="transformer-files")
        self.file_jobs = 0                   # uploads being read, translated or written

    def app(self):
        bounds = {"client_max_size": self.limits.max_body}
        if "client_max_fields" in inspect.signature(web.Application).parameters:
            # a form's fields are bounded by --max-body alone: aiohttp's own bound on their number
            # (1000 since 3.13) answers a 4 KB form of 1,000 q fields "413 larger than the limit"
            bounds["client_max_fields"] = self.limits.max_body
        app = web.Application(**bounds, middlewares=[self._errors])
        app.add_routes([web.post("/translate", self.translate), web.post("/detect", self.detect),
                        web.get("/languages", self.languages), web.get("/frontend/settings", self.settings),
                        web.post("/v1/translate", self.native), web.get("/health", self.health),
                        web.get("/metrics", self.metrics_text), web.get("/", self.page),
                        web.post("/translate_file", self.translate_file),
                        web.get("/download_file/{name}", self.download_file)])
        app.router.add_static("/static/", STATIC, show_index=False, follow_symlinks=False)
        app[STOPPING] = self.stopping
        app[GUARD] = self.guard

        async def remove_files(app):
            self.files.close()
            self.file_threads.shutdown(wait=False)
            self.rates.close()
        app.on_cleanup.append(remove_files)
        return app

    @web.middleware
    async def _errors(self, request, handler):
        """Every failure in LibreTranslate's error form, and counted. Once the server stops, a request
        not begun is refused and every answer closes its connection (stopping.py)."""
        started = time.monotonic()
        self.stopping.enter(request.protocol)
        self.guard.begun(request.protocol)
        cors = self.access.cors_headers(request.headers.get("Origin"))
        try:
            if self.stopping.since is not None:
                raise BadRequest("the server is stopping", 503)
            host = request.headers.get("Host")
            if not self.access.host_allowed(host):
                raise BadRequest(f"Host {shown(host)} is not a name this server answers to (--allowed-hosts; "
                                 "bound to loopback, it answers localhost, 127.0.0.1 and ::1: DNS rebinding)", 421)
            if request.method == "OPTIONS" and cors:      # a browser's preflight, for an allowed origin
                response = web.Response(status=204)
            else:
                response = await handler(request)
        except BadRequest as exc:
            response = _error(str(exc), exc.status, exc.headers)
        except web.HTTPRequestEntityTooLarge:
            response = _error(f"the request body is larger than the limit of {self.limits.max_body} bytes "
                              "(--max-body)", 413)
        except web.HTTPException as exc:
            if exc.status >= 400:
                response = _error(exc.reason, exc.status)
            else:
                raise
        except asyncio.CancelledError:
            raise
        except ConnectionResetError:    # the client went away while its body was read: nobody to answer
            response = _error("the client closed the connection", CLIENT_GONE)
        except Exception as exc:
            if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG and request.path.startswith("/static/"):
                response = _error("no such file", 404)      # a static path no file system holds
            else:                       # a bug of ours: the server goes on, the log has what happened
                response = _error(f"internal error, id {_internal_error(request)}", 500)
        finally:
            self.stopping.leave(request.protocol)
        if request.content_length:      # what of its body has not come yet is its body, not a request
            self.guard.answered(request.protocol, request.content_length - request.content.total_bytes)
        if self.stopping.since is not None:
            response.force_close()       # Connection: close: the client sends nothing more here
        response.headers.update(cors)
        self.metrics.request(_endpoint(request), response.status, time.monotonic() - started,
                             getattr(response, "sentences", 0))
        return response

    # -- reading a request ---------------------------------------------------------------------------
    async def _fields(self, request, json_only=False):
        """(the request's fields, its key as _key gives it)."""
        fields = await read_fields(request, self.limits, json_only)
        return fields, self._key(request, fields.get("api_key"), "translate")

    def _key(self, request, key, route):
        """(key, its KeyLimits) of the request's valid key, or None when keys are not asked for or
        it gave none and `route` (--require-key-for) needs none, or its Origin is
        --require-api-key-origin's. A key from the api_key field, the query string or
        `Authorization: Bearer KEY`. 403 for a key that is not valid or missing."""
        if self.keys is None:
            return None             # no keys: an api_key is ignored (deep-translator always sends one)
        if key is None or key == "":
            try:
                key = request.query.get("api_key")
            except UnicodeDecodeError:
                raise BadRequest("the query string is not valid UTF-8") from None
        if not key:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            key = token.strip() if scheme.lower() == "bearer" else None
        if key:
            limits = self.keys.lookup(key) if isinstance(key, str) else None
            if limits is None:
                raise BadRequest("Invalid API key", 403)
            return key, limits
        if self.access.needs_key(route, request.headers.get("Origin")):
            raise BadRequest("an API key is needed (api_key)", 403)
        return None

    def _char_limit(self, key):
        """Characters a request at most: the key's own char_limit, else --char-limit."""
        return key[1].char_limit if key and key[1].char_limit else self.limits.char_limit

    async def _charge(self, request, key, characters):
        """Count the request against its key's or its address's limits a minute (limits.py), in
        the store --req-limit-storage names."""
        try:
            if key is not None:
                limits = key[1]
                await self.rates.charge_on_loop(
                    ("key", key[0]), characters,
                    self.limits.req_limit if limits.req_limit is None else limits.req_limit,
                    self.limits.chars_per_minute if limits.chars_per_minute is None else limits.chars_per_minute,
                    "this API key's limit")
            else:
                await self.rates.charge_on_loop(("address", request.remote), characters, self.limits.req_limit,
                                                self.limits.chars_per_minute,
                                                "this address: --req-limit, --chars-per-minute")
        except Refused as exc:
            raise BadRequest(str(exc), 429, {"Retry-After": str(exc.retry_after)}) from None
        except sqlite3.Error as exc:    # the shared file locked past its busy timeout, or the disk full
            LOG.warning("--req-limit-storage: %s", exc)
            raise BadRequest("the request counters (--req-limit-storage) cannot be reached now; retry later",
                             503, {"Retry-After": str(RETRY_AFTER_S)}) from None

    async def _routes(self, fields, texts):
        """[(model name, detectedLanguage or None)] per text (pairs.py); detection off the loop."""
        if fields.get("source") == "auto" and "model" not in fields:
            return await asyncio.to_thread(self.pairs.route, fields, texts, self.detector.detect)
        return self.pairs.route(fields, texts, None)

    async def _translate(self, name, texts, options, join=None, executor=None):
        """The translations of texts by the scheduler; a client that goes away cancels its part.
        Large texts are cut into subwords off the loop (executor: where)."""
        try:
            pieces = await _off_loop_if_large(texts, lambda: self.scheduler.pieces(name, texts), executor)
            future = self.scheduler.submit(name, texts, options, join=join, pieces=pieces)
        except QueueFull as exc:
            raise BadRequest(f"too many requests waiting: {exc}; retry later", 429,
                             {"Retry-After": str(RETRY_AFTER_S)}) from None
        except ShuttingDown:
            raise BadRequest("the server is stopping", 503) from None
        except TooWide as exc:
            raise BadRequest(str(exc)) from None
        except TooMany as exc:          # past the whole queue: a retry would be refused the same way
            raise BadRequest(f"{exc}; send fewer or shorter texts", 413) from None
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self.scheduler.cancel(future)
            raise
        except TooLarge as exc:         # one sentence past all the memory the decoding may hold
            raise BadRequest(f"{exc}; send shorter texts, or a smaller beam", 413) from None
        except MemoryError as exc:      # a batch's caches past the memory (decoding/checks.py): not a bug
            raise BadRequest(f"the server's memory cannot hold this decoding now ({' '.join(str(exc).split())}); "
                             "retry later, or send fewer or shorter texts", 503,
                             {"Retry-After": str(RETRY_AFTER_S)}) from None

    def _document(self, text, fmt, name, where="q"):
        """A text's Document, split by the rules of its model's source language. where: the
        field the text came from, named if its markup cannot be read."""
        language = self._splitting[name]
        if fmt != "html":
            return of_text(text, language)
        try:
            return of_html(text, language)
        except MarkupError as exc:
            raise BadRequest(f"{where} is not HTML the server can read ({exc})") from None

    async def _documents(self, routes, documents, options, join=None, executor=None):
        """Each document's sentences' translations, in order: the sentences of every document a
        model translates go to the scheduler as one request. options(name): its decoding options;
        executor: where large texts are cut into subwords (_translate)."""
        first = routes[0][0]
        if all(name == first for name, _ in routes):          # one model (the usual case): one request
            jobs = {first: range(len(documents))}
        else:
            jobs = {}
            for i, (name, _) in enumerate(routes):
                jobs.setdefault(name, []).append(i)
        flat = {name: [s for i in chosen for s in documents[i].sentences] for name, chosen in jobs.items()}
        flat = {name: sentences for name, sentences in flat.items() if sentences}
        if len(flat) <= 1:
            done = {name: await self._translate(name, sentences, options(name), join, executor)
                    for name, sentences in flat.items()}
        else:
            tasks = {name: asyncio.ensure_future(self._translate(name, sentences, options(name), join, executor))
                     for name, sentences in flat.items()}
            try:
                await asyncio.gather(*tasks.values())
            finally:                    # one refused or failed: the others leave the scheduler
                for task in tasks.values():
                    task.cancel()
            done = {name: task.result() for name, task in tasks.items()}
        results = [None] * len(documents)
        for name, chosen in jobs.items():
            translated, position = done.get(name, ()), 0
            for i in chosen:
                count = len(documents[i].sentences)
                results[i] = translated[position:position + count]
                position += count
        return results

    # -- the endpoints ---------------------------------------------------------------------------------
    async def translate(self, request):
        fields, key = await self._fields(request)
        texts, was_list = texts_of(fields, self.limits, self._char_limit(key))
        fmt = format_of(fields)
        alternatives = alternatives_of(fields)
        decoded = alternatives if fmt == "text" else 0       # LibreTranslate gives none for html
        await self._charge(request, key, sum(len(text) for text in texts))
        routes = await self._routes(fields, texts)
        where = (lambda i: f"q[{i}]") if was_list else (lambda i: "q")
        documents = await _off_loop_if_large(texts, lambda: [self._document(text, fmt, name, where(i))
                                                             for i, (text, (name, _)) in enumerate(zip(texts, routes))])
        options = (lambda name: self.models[name].options(alternatives=decoded)) if decoded else self._defaults.get
        results = await self._documents(routes, documents, options, join=_join_alternatives if decoded else None)
        out, others = [], []
        for document, sentences in zip(documents, results):
            if decoded:
                main = document.render([hypotheses[0] for hypotheses in sentences])
                candidates = (document.render([h[k] if k < len(h) else h[0] for h in sentences])
                              for k in range(1, decoded + 1))
                others.append(_unique(candidates, main, decoded))
            else:
                main = document.render(sentences)
                others.append([])
            out.append(main)
        body = {"translatedText": out if was_list else out[0]}
        if fields.get("source") == "auto":
            detected = [found for _, found in routes]
            body["detectedLanguage"] = detected if was_list else detected[0]
        if alternatives:
            body["alternatives"] = others if was_list else others[0]
        response = web.json_response(body)
        response.sentences = sum(len(document.sentences) for document in documents)
        return response

    async def native(self, request):
        fields, key = await self._fields(request, json_only=True)
        texts, was_list = texts_of(fields, self.limits, self._char_limit(key))
        await self._charge(request, key, sum(len(text) for text in texts))
        routes = await self._routes(fields, texts)
        name = routes[0][0]
        overrides = {}
        for field, minimum in (("beam", 1), ("max_len", 1), ("no_repeat_ngram", 0)):
            value = fields.get(field)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise BadRequest(f"{field} must be an integer >= {minimum}, got {shown(value)}")
            overrides[field] = value
        served = self.models[name]
        if overrides.get("max_len", 0) > served.model.cfg.max_len:
            raise BadRequest(f"max_len {overrides['max_len']}: the model has {served.model.cfg.max_len} positions")
        extras = {}
        for field in ("scores", "attention"):
            value = fields.get(field, False)
            if not isinstance(value, bool):
                raise BadRequest(f"{field} must be true or false, got {shown(value)}")
            extras[field] = value
        options = served.options(**overrides, **extras)
        detailed = extras["scores"] or extras["attention"]
        documents = await _off_loop_if_large(texts, lambda: [self._document(text, "text", name) for text in texts])
        results = await self._documents([(name, None)] * len(texts), documents, lambda _: options,
                                        join=_join_details if detailed else None)
        translations = []
        for document, sentences in zip(documents, results):
            if not detailed:
                translations.append({"translatedText": document.render(sentences)})
                continue
            parts = [dict(part, source=source) for source, sentence in zip(document.sentences, sentences)
                     for part in sentence["sentences"]]
            translations.append({"translatedText": document.render([s["translatedText"] for s in sentences]),
                                 "sentences": parts})
        body = {"model": name, "source": served.source, "target": served.target,
                "options": {k: v for k, v in options if k not in ("scores", "attention")},
                "translations": translations if was_list else translations[:1]}
        response = web.json_response(body)
        response.sentences = sum(len(document.sentences) for document in documents)
        return response

    async def detect(self, request):
        fields, key = await self._fields(request)
        q = fields.get("q")
        if isinstance(q, list) and all(isinstance(text, str) for text in q):
            q = "\n".join(q)
        if not q:
            raise BadRequest("missing field q (the text whose language to detect)")
        if not isinstance(q, str):
            raise BadRequest(f"q must be a string or a list of strings, got {type(q).__name__}")
        if not q.strip():
            raise BadRequest("q holds only whitespace: no text whose language to detect")
        char_limit = self._char_limit(key)
        if char_limit and len(q) > char_limit:
            raise BadRequest(f"q holds {len(q)} characters; at most {char_limit} a request (--char-limit)")
        await self._charge(request, key, len(q))
        return web.json_response(await asyncio.to_thread(self.detector.detect, q))

    async def languages(self, request):
        return web.json_response(self.pairs.listing())

    async def settings(self, request):
        """LibreTranslate's /frontend/settings: what its own page and clients read."""
        sources = sorted(self.pairs.targets)
        source = ({"code": "auto", "name": "Auto Detect"} if len(sources) > 1 else
                  {"code": sources[0], "name": english_name(sources[0])})
        target = self.pairs.targets[sources[0]][0]
        # LibreTranslate's page shows a key field when this is true: not to the key origin's page
        keys = self.api_keys and self.access.needs_key("translate", request.headers.get("Origin"))
        return web.json_response({
            "charLimit": self.limits.char_limit or -1, "frontendTimeout": FRONTEND_TIMEOUT_MS,
            "apiKeys": self.api_keys, "keyRequired": keys, "suggestions": False, "filesTranslation": True,
            "supportedFilesFormat": list(FORMATS),
            "language": {"source": source, "target": {"code": target, "name": english_name(target)}}})

    async def translate_file(self, request):
        """LibreTranslate's /translate_file: the file's sentences translated as /translate's (one
        request to the scheduler), its layout kept (formats.py), stored for /download_file."""
        fields, (uploaded, data) = await read_upload(request, self.limits)
        key = self._key(request, fields.get("api_key"), "translate")
        for field in ("source", "target"):
            if not fields.get(field):
                raise BadRequest(f"Invalid request: missing {field} parameter")
        try:
            ext = extension(uploaded)
        except FormatError as exc:
            raise BadRequest(f"Invalid request: {exc}") from None
        sample = data[:4096].decode("utf-8", "ignore")      # source "auto" detects on the file's start
        name, detected = (await self._routes(fields, [sample]))[0]
        if self.file_jobs >= FILE_JOBS:
            raise BadRequest(f"the server is translating {self.file_jobs} files, as many as it takes at once; "
                             "retry later", 503, {"Retry-After": str(RETRY_AFTER_S)})
        self.file_jobs += 1
        try:
            return await self._translate_file(request, fields, key, uploaded, data, ext, name, detected)
        finally:
            self.file_jobs -= 1

    async def _translate_file(self, request, fields, key, uploaded, data, ext, name, detected):
        loop = asyncio.get_running_loop()
        queue = self.scheduler.max_queue
        budget = Budget(queue, queue * self.models[name].model.cfg.max_len * CHARS_PER_SUBWORD, FILE_READ_S)
        try:
            document = await loop.run_in_executor(self.file_threads, read_file, data, uploaded, self._splitting[name],
                                                  budget)
        except FormatError as exc:
            raise BadRequest(f"file: {exc}") from None
        except TooMuch as exc:
            raise BadRequest(f"file: {exc}", 413) from None
        except Busy as exc:             # other archives hold the unpacked bytes the server allows
            raise BadRequest(f"file: {exc}; retry later", 503, {"Retry-After": str(RETRY_AFTER_S)}) from None
        try:
            await self._charge(request, key, sum(len(sentence) for sentence in document.sentences))
            translated = (await self._documents([(name, detected)], [document], self._defaults.get,
                                                executor=self.file_threads))[0]
            rendered = await loop.run_in_executor(self.file_threads, document.render, translated)   # off the loop
        finally:
            if hasattr(document, "release"):    # an archive's unpacked members (office.py)
                document.release()
        stored = self.files.put(rendered, uploaded, self.models[name].target, ext)
        response = web.json_response({"translatedFileUrl": f"{request.scheme}://{request.host}/download_file/{stored}"})
        response.sentences = len(document.sentences)
        return response

    async def download_file(self, request):
        path = self.files.get(request.match_info["name"])
        if path is None:
            raise BadRequest("no such file: not a name this server gave, or expired (--file-expiry)", 404)
        return web.FileResponse(path, headers={"Content-Disposition": "attachment"})

    async def page(self, request):
        return web.FileResponse(os.path.join(STATIC, "index.html"))

    async def health(self, request):
        """200 {"status": "ok", ...} while the scheduler's thread lives and no step or batch has run
        longer than its stuck_after; else 503 with the status saying which. Where the models come
        from (their directories) is not told: the banner and the log have it."""
        ok, scheduler = self.scheduler.health()
        status = "ok" if ok else ("the scheduler stopped" if not scheduler["alive"] else
                                  f"a decoding step has run {scheduler['step_seconds']:g} s")
        body = {"status": status, "api_keys": self.api_keys,
                "models": [{"name": name, "source": m.source, "target": m.target, **m.defaults}
                           for name, m in self.models.items()]}
        # the details (queue, scheduler) with a key when --require-key-for health; the status alone
        # (and the models the page lists, which /languages tells anyway) without
        key = self._key(request, None, None)          # never needed here; a wrong one is still 403
        if self.keys is None or not self.access.needs_key("health", request.headers.get("Origin")) or key:
            body.update(queue=self.scheduler.queue_length(), scheduler=scheduler)
        return web.json_response(body, status=200 if ok else 503)

    async def metrics_text(self, request):
        self._key(request, None, "metrics")
        return web.Response(text=self.metrics.text(), content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})
