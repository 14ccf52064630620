"""The HTTP side: LibreTranslate's API, our native endpoint, health and metrics, on aiohttp.

Handlers parse, validate and wait; the Scheduler owns the models. Endpoints:

    POST /translate      LibreTranslate's: JSON or form; q (a string or a list of strings), source
                         (a code or "auto"), target, format ("text"), api_key. Answers
                         {"translatedText": ...} (a string or a list, as q was), and for source
                         "auto" {"detectedLanguage": {"language": ..., "confidence": 100.0}}.
    GET  /languages      [{"code", "name", "targets"}]
    POST /v1/translate   ours: q, source/target or model, beam, max_len, no_repeat_ngram, scores
                         (log-probabilities), attention (each sentence's cross-attention matrix)
    GET  /health         {"status": "ok", "models": [...], "queue": n, "api_keys": bool}
    GET  /metrics        Prometheus' text format
    GET  /               a page: translate, and see each output word's cross-attention over the
                         source (static/: no CDN, it works offline)

Errors take LibreTranslate's form, {"error": "..."}, naming the field: 400 for a bad request, 403
for a missing or wrong API key, 413 for a body over the limit, 429 (with Retry-After) when the
queue is full, 503 while the server stops, 500 for a failure of ours.
"""
import asyncio
import json
import os
import time

from aiohttp import web

from .models import LANGUAGE_NAMES
from .scheduler import QueueFull, ShuttingDown, TooWide

RETRY_AFTER_S = 1
STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")   # the page and its assets


class BadRequest(ValueError):
    """A request the server will not take: HTTP `status` with LibreTranslate's {"error": ...}."""

    def __init__(self, message, status=400, headers=None):
        super().__init__(message)
        self.status, self.headers = status, headers


def _error(message, status, headers=None):
    return web.json_response({"error": message}, status=status, headers=headers)


def _join_details(parts):
    """A text's native result from its pieces' details (ServedModel._details)."""
    return {"translatedText": " ".join(part["text"] for part in parts), "sentences": parts}


class Limits:
    """What one request may hold (each refused with the limit named)."""

    def __init__(self, char_limit=5000, max_texts=64, max_body=1 << 20):
        self.char_limit, self.max_texts, self.max_body = char_limit, max_texts, max_body


class Server:
    """The aiohttp application around a Scheduler."""

    def __init__(self, scheduler, limits, metrics, api_keys=None):
        self.scheduler, self.limits, self.metrics = scheduler, limits, metrics
        self.api_keys = api_keys             # a set of valid keys, or None: no key needed
        self.models = scheduler.models

    def app(self):
        app = web.Application(client_max_size=self.limits.max_body, middlewares=[self._errors])
        app.add_routes([web.post("/translate", self.translate), web.get("/languages", self.languages),
                        web.post("/v1/translate", self.native), web.get("/health", self.health),
                        web.get("/metrics", self.metrics_text), web.get("/", self.page)])
        app.router.add_static("/static/", STATIC, show_index=False, follow_symlinks=False)
        return app

    @web.middleware
    async def _errors(self, request, handler):
        """Every failure in LibreTranslate's error form, and counted."""
        started = time.monotonic()
        try:
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
        except Exception as exc:         # a failure of ours: told, not hidden, and the server goes on
            response = _error(f"internal error: {type(exc).__name__}: {exc}", 500)
        self.metrics.request(request.path, response.status, time.monotonic() - started,
                             getattr(response, "sentences", 0))
        return response

    # -- reading a request ---------------------------------------------------------------------------
    async def _fields(self, request, json_only=False):
        """The request's fields: a JSON object, or (LibreTranslate's clients send both) a form."""
        kind = request.content_type
        if kind == "application/json" or json_only:
            try:
                body = await request.read()
                data = json.loads(body.decode("utf-8"))
            except UnicodeDecodeError:
                raise BadRequest("the request body is not valid UTF-8") from None
            except ValueError as exc:
                raise BadRequest(f"the request body is not valid JSON ({exc})") from None
            if not isinstance(data, dict):
                raise BadRequest("the request body must be a JSON object")
            return data
        if kind in ("application/x-www-form-urlencoded", "multipart/form-data"):
            try:
                form = await request.post()
            except UnicodeDecodeError:
                raise BadRequest("the form is not valid UTF-8") from None
            data = {}
            for key in form:
                values = form.getall(key)
                data[key] = values if key == "q" and len(values) > 1 else values[0]
            return data
        raise BadRequest(f"unsupported Content-Type {kind!r}: send application/json or a form")

    def _check_key(self, fields):
        if self.api_keys is None:
            return
        key = fields.get("api_key")
        if not isinstance(key, str) or key not in self.api_keys:
            raise BadRequest("Invalid API key" if key else "an API key is needed (api_key)", 403)

    def _texts(self, fields):
        """(texts, was_list) from the field q, within the limits."""
        if "q" not in fields:
            raise BadRequest("missing field q (the text to translate)")
        q = fields["q"]
        was_list = isinstance(q, list)
        texts = q if was_list else [q]
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                where = f"q[{i}]" if was_list else "q"
                raise BadRequest(f"{where} must be a string, got {type(text).__name__}")
        if len(texts) > self.limits.max_texts:
            raise BadRequest(f"q holds {len(texts)} texts; at most {self.limits.max_texts} a request (--max-texts)")
        chars = sum(len(text) for text in texts)
        if self.limits.char_limit and chars > self.limits.char_limit:
            raise BadRequest(f"q holds {chars} characters; at most {self.limits.char_limit} a request (--char-limit)")
        for i, text in enumerate(texts):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(f"q{f'[{i}]' if was_list else ''} is not valid Unicode") from None
        return texts, was_list

    def _model(self, fields):
        """(model name, detected source or None) from source/target (or our `model`)."""
        name = fields.get("model")
        if name is not None:
            if name not in self.models:
                raise BadRequest(f"model {name!r} is not served (served: {', '.join(self.models)})")
            return name, None
        source, target = fields.get("source"), fields.get("target")
        for field, value in (("source", source), ("target", target)):
            if not isinstance(value, str) or not value:
                raise BadRequest(f"missing field {field} (a language code"
                                 f"{' or auto' if field == 'source' else ''})")
        detected = None
        if source == "auto":
            sources = sorted({m.source for m in self.models.values()})
            if len(sources) != 1:
                raise BadRequest(f"source auto: this server serves {len(sources)} source languages "
                                 f"({', '.join(sources)}) and detects none; give the source's code")
            source = detected = sources[0]
        for name, served in self.models.items():
            if served.source == source and served.target == target:
                return name, detected
        pairs = ", ".join(f"{m.source}->{m.target}" for m in self.models.values())
        raise BadRequest(f"no model translates {source} to {target} (served: {pairs})")

    async def _translate(self, name, texts, options, join=None):
        """The translations of texts by the scheduler; a client that goes away cancels its part."""
        try:
            future = self.scheduler.submit(name, texts, options, join=join)
        except QueueFull as exc:
            raise BadRequest(f"too many requests waiting: {exc}; retry later", 429,
                             {"Retry-After": str(RETRY_AFTER_S)}) from None
        except ShuttingDown:
            raise BadRequest("the server is stopping", 503) from None
        except TooWide as exc:
            raise BadRequest(str(exc)) from None
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self.scheduler.cancel(future)
            raise

    # -- the endpoints ---------------------------------------------------------------------------------
    async def translate(self, request):
        fields = await self._fields(request)
        self._check_key(fields)
        texts, was_list = self._texts(fields)
        fmt = fields.get("format", "text")
        if fmt != "text":
            raise BadRequest(f"format {fmt!r} is not supported: only text")
        alternatives = fields.get("alternatives", 0)
        if alternatives not in (0, "0", None):
            raise BadRequest("alternatives are not supported (only one translation a text)")
        name, detected = self._model(fields)
        lines = [text.split("\n") for text in texts]      # one line a sentence, as translate reads them
        flat = [line for group in lines for line in group]
        translated = await self._translate(name, flat, self.models[name].options())
        out, position = [], 0
        for group in lines:
            out.append("\n".join(translated[position:position + len(group)]))
            position += len(group)
        body = {"translatedText": out if was_list else out[0]}
        if detected is not None:
            body["detectedLanguage"] = ({"language": detected, "confidence": 100.0} if not was_list else
                                        [{"language": detected, "confidence": 100.0} for _ in out])
        response = web.json_response(body)
        response.sentences = len(flat)
        return response

    async def native(self, request):
        fields = await self._fields(request, json_only=True)
        self._check_key(fields)
        texts, was_list = self._texts(fields)
        name, _ = self._model(fields)
        overrides = {}
        for field, minimum in (("beam", 1), ("max_len", 1), ("no_repeat_ngram", 0)):
            value = fields.get(field)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise BadRequest(f"{field} must be an integer >= {minimum}, got {value!r}")
            overrides[field] = value
        served = self.models[name]
        if overrides.get("max_len", 0) > served.model.cfg.max_len:
            raise BadRequest(f"max_len {overrides['max_len']}: the model has {served.model.cfg.max_len} positions")
        extras = {}
        for field in ("scores", "attention"):
            value = fields.get(field, False)
            if not isinstance(value, bool):
                raise BadRequest(f"{field} must be true or false, got {value!r}")
            extras[field] = value
        options = served.options(**overrides, **extras)
        join = _join_details if extras["scores"] or extras["attention"] else None
        results = await self._translate(name, texts, options, join=join)
        if join is None:
            results = [{"translatedText": text} for text in results]
        body = {"model": name, "source": served.source, "target": served.target,
                "options": {k: v for k, v in options if k not in ("scores", "attention")},
                "translations": results if was_list else results[:1]}
        response = web.json_response(body)
        response.sentences = len(texts)
        return response

    async def languages(self, request):
        targets = {}
        for served in self.models.values():
            targets.setdefault(served.source, set()).add(served.target)
        return web.json_response([{"code": code, "name": LANGUAGE_NAMES.get(code, code), "targets": sorted(t)}
                                  for code, t in sorted(targets.items())])

    async def page(self, request):
        return web.FileResponse(os.path.join(STATIC, "index.html"))

    async def health(self, request):
        return web.json_response({"status": "ok", "queue": self.scheduler.queue_length(),
                                  "api_keys": self.api_keys is not None,
                                  "models": [{"name": name, "source": m.source, "target": m.target,
                                              "directory": m.directory, **m.defaults}
                                             for name, m in self.models.items()]})

    async def metrics_text(self, request):
        return web.Response(text=self.metrics.text(), content_type="text/plain", charset="utf-8",
                            headers={"X-Prometheus-Format": "0.0.4"})
