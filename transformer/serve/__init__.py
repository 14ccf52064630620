"""`transformer serve`: a translation server that batches across requests and speaks the
LibreTranslate API (aiohttp, the [serve] extra).

    models.py     the models served: loaded once, frozen, with their languages and defaults
    scheduler.py  the one thread that owns them: every waiting request's sentences in one running batch,
                  joining and leaving it between decoder steps (transformer/streaming.py)
    app.py        the HTTP side: LibreTranslate's endpoints, ours, health, metrics, errors
    fields.py     a request's fields, from JSON, a form or the query string, within the limits
    connections.py  connections open at once, and how long a request's headers may take
    limits.py     requests and characters a minute, per client and per key (429, Retry-After), counted
                  in memory or in an SQLite file the servers of one host share (--req-limit-storage)
    keys.py       API keys: a file of them, or LibreTranslate's SQLite key database with limits
    access.py     which routes need a key, CORS origins, the Host names a loopback server answers
    pairs.py      which model answers a source and target (any standard code; "auto")
    detect.py     which served source language a text is in (py3langid)
    documents.py  a text as sentences to translate and what is kept around them (sentencex)
    formats.py    files (.txt, .srt, .vtt, .html) as documents, their layout kept
    office.py     .docx, .pptx, .odt and .epub: paragraphs translated in place in the archive (zipfile, expat)
    files.py      the translated files waiting for GET /download_file, in a temporary folder
    markup.py     HTML's text runs, the markup kept as it is
    metrics.py    counters in Prometheus' text format
    stopping.py   SIGTERM: every connection the kernel completed answered, none reset, then exit 0
"""
import os
import re
import sys

from ..checkpoint import read_languages
from ..languages import normalise
from .models import ServedModel

__all__ = ["ServedModel", "build", "listen", "load_models", "parse_model_spec", "run"]


def _aiohttp():
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise ImportError("transformer serve needs aiohttp: pip install \"transformer-cpu[serve]\"") from None


def parse_model_spec(spec):
    """--model's value: DIR, or NAME=DIR (NAME: any name; SRC-TGT language codes name the pair)."""
    name, sep, directory = spec.partition("=")
    if not sep:
        return None, spec
    if not re.match(r"^[A-Za-z0-9_.-]+$", name):
        raise ValueError(f"--model {spec}: the name before = takes letters, digits, _ . and - only")
    return name, directory


def _pair_of_name(name):
    """(source, target) normalised tags when a --model name is SRC-TGT language codes ("en-de",
    "eng-spa": en, es)."""
    if name is None:
        return None
    parts = name.split("-")
    tags = tuple(normalise(part) for part in parts)
    if len(tags) == 2 and None not in tags:
        return tags
    return None


def load_models(specs, beam=None, precision=None, max_len=None, no_repeat_ngram=0, load=None):
    """{name: ServedModel} of --model values. load(directory) -> (model, src_tok, tgt_tok) frozen."""
    models = {}
    for spec in specs:
        name, directory = parse_model_spec(spec)
        model, src_tok, tgt_tok = load(directory)
        pair = read_languages(directory) or _pair_of_name(name)
        if pair is None:
            raise ValueError(f"--model {spec}: the model's languages are unknown (no languages.json in it): give "
                             "them as --model SRC-TGT=DIR (e.g. en-de=DIR), or train with --src-lang / --tgt-lang")
        name = name or f"{pair[0]}-{pair[1]}"
        if name in models:
            raise ValueError(f"--model {spec}: a second model named {name!r} (name them: --model NAME=DIR)")
        if any((m.source, m.target) == pair for m in models.values()):
            raise ValueError(f"--model {spec}: another model already translates {pair[0]} to {pair[1]}")
        if max_len is not None and max_len > model.cfg.max_len:
            raise ValueError(f"--max-len {max_len}: the model in {directory} has {model.cfg.max_len} positions")
        models[name] = ServedModel(name, os.path.abspath(directory), model, src_tok, tgt_tok, *pair, beam=beam,
                                   precision=precision, max_len=max_len, no_repeat_ngram=no_repeat_ngram)
    return models


def build(models, batch_tokens=4096, batch_size=64, max_queue=4096, char_limit=5000, max_texts=64,
          max_body=1 << 20, api_keys=None, batching="step", limits=None, access=None, stuck_after=60.0,
          rates=None, memory="auto"):
    """(aiohttp application, scheduler) serving `models`. limits: a fields.Limits (in place of
    char_limit, max_texts, max_body); access: an access.Access (keys needed, CORS, Host names);
    api_keys: a set of keys or a keys.Keys; rates: a limits.RateLimits (default: in memory).
    memory: the bytes the decoding's caches may hold at once ("auto": capacity.decoding_budget,
    what the process may fill less what it holds; None: no bound)."""
    _aiohttp()
    from .app import Limits, Server
    from .capacity import decoding_budget
    from .detect import Detector
    from .metrics import Metrics
    from .scheduler import Scheduler, max_rows

    metrics = Metrics()
    if memory == "auto":
        memory = decoding_budget(models, max_rows(models, batch_size), batching)
    scheduler = Scheduler(models, batch_tokens=batch_tokens, batch_size=batch_size, max_queue=max_queue,
                          metrics=metrics, batching=batching, stuck_after=stuck_after, memory=memory)
    detector = Detector({served.source for served in models.values()})
    if len(detector.languages) > 1:     # source "auto" detects: its model loads now, not in a request
        detector.warm()
    limits = limits or Limits(char_limit, max_texts, max_body)
    server = Server(scheduler, limits, metrics, api_keys, detector, access, rates)
    return server.app(), scheduler


def _guards(app, args, api_keys, access, rates):
    """The banner's line of limits and access, as they apply (the connection cap after the
    descriptor limit)."""
    from .app import GUARD

    per_minute = ", ".join(f"{n} {what}" for n, what in ((args.req_limit, "requests"),
                                                        (args.chars_per_minute, "characters")) if n) or "no limit"
    counted = f"counted in {rates.store.path}" if getattr(rates.store, "path", None) else "counted in memory"
    keys = (f"{len(api_keys)} keys, needed for {', '.join(access.require_key_for) or 'nothing (they raise limits)'}"
            if api_keys is not None else "no keys")
    if api_keys is not None and access.key_origin:
        keys += f" (not from Origin {access.key_origin})"
    hosts = ", ".join(sorted(access.allowed_hosts)) if access.allowed_hosts is not None else "any"
    return (f"guards: at most {app[GUARD].max_connections} connections, headers within {args.header_timeout:g} s, "
            f"bodies within {args.body_timeout:g} s; a minute per address: {per_minute} ({counted}); {keys}; CORS: "
            f"{', '.join(access.cors_origins) or 'none'}; Host: {hosts}")


def listen(app, host, port, shutdown_timeout=60.0, banner=(), shutdown_grace=2.0, idle_timeout=75.0):
    """Serve `app` (Server.app()) until SIGINT or SIGTERM: prints `banner` and "listening on ..."
    once the port is bound (not before: a client that waits for the line may connect at once), then
    on a signal stops as stopping.py says: the connections the kernel completed are accepted and the
    port closes, each request on them is answered (503 if it was not begun), an idle connection is
    closed after shutdown_grace seconds, and what is still busy after shutdown_timeout is cut. Runs
    the app's cleanup and returns how many connections were cut (0: every request was answered).
    Connections pass the app's Guard (connections.py: a cap, a header timeout); one that sends
    nothing is closed after idle_timeout seconds (aiohttp's keep-alive timer)."""
    import asyncio
    import signal

    from aiohttp import web

    from .app import GUARD
    from .stopping import STOPPING, close_listeners, drain

    async def main():
        # the runner's own shutdown finds no connection left (the drain closed them): its timeout
        # only bounds the cancelling of what the drain cut
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0,
                               keepalive_timeout=idle_timeout)
        await runner.setup()
        loop = asyncio.get_running_loop()
        guarded = app[GUARD].factory(runner.server)
        server = await loop.create_server(guarded, host, port, backlog=128)   # as web.TCPSite, ours to drain
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        for line in banner:
            print(line, file=sys.stderr)
        shown = f"[{host}]" if ":" in host else host
        print(f"listening on http://{shown}:{port}  (LibreTranslate API: POST /translate, POST /detect, "
              "GET /languages, GET /frontend/settings, POST /translate_file, GET /download_file/NAME; "
              "POST /v1/translate, GET /health, GET /metrics, the page at /; Ctrl-C stops)", file=sys.stderr, flush=True)
        cut = 0
        try:
            await stop.wait()
            app[STOPPING].since = loop.time()       # from here a request not begun gets 503
            accepting = await close_listeners(server, guarded)
            print(f"stopping: the port is closed; the {len(runner.server.connections) + len(accepting)} open "
                  f"connections ({len(accepting)} taken from its accept queue) get their answers, idle ones "
                  f"are closed after {min(shutdown_grace, shutdown_timeout):g} s", file=sys.stderr, flush=True)
            await asyncio.gather(*accepting, return_exceptions=True)   # one reset by its client: gone
            cut = await drain(lambda: runner.server.connections, app[STOPPING],
                              min(shutdown_grace, shutdown_timeout), shutdown_timeout)
        finally:
            server.close()
            await runner.cleanup()
        return cut
    return asyncio.run(main())


def run(args, load):
    """The command line's serve: load, listen, answer until SIGINT/SIGTERM, then drain and exit 0."""
    _aiohttp()
    from ..errors import FlagError
    from .limits import RateLimits, open_store

    try:                                # before the models load: a wrong URI fails at once
        rates = RateLimits(open_store(args.req_limit_storage))
    except ValueError as exc:
        raise FlagError(str(exc)) from None
    models = load_models(args.model, beam=args.beam, precision=args.precision, max_len=args.max_len,
                         no_repeat_ngram=args.no_repeat_ngram, load=load)
    from .capacity import check_rows_memory
    from .scheduler import max_rows

    warning = check_rows_memory(models, max_rows(models, args.batch_size), args.batch_size, args.batching)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    from .access import LOOPBACK_NAMES, Access, is_loopback
    from .connections import raise_descriptor_limit
    from .fields import Limits
    from .keys import Keys, read_key_file

    raise_descriptor_limit()         # before the Guard reads it (build)
    api_keys = None
    if args.api_keys or args.api_keys_db:
        api_keys = Keys(plain=read_key_file(args.api_keys) if args.api_keys else (), db_path=args.api_keys_db)
    allowed_hosts = None
    if is_loopback(args.host):      # DNS rebinding: a loopback server answers loopback names only
        allowed_hosts = LOOPBACK_NAMES + tuple(args.allowed_hosts or ())
    elif args.allowed_hosts:
        allowed_hosts = tuple(args.allowed_hosts)
    try:
        access = Access(require_key_for=args.require_key_for, cors_origins=args.cors_origins or (),
                        allowed_hosts=allowed_hosts, key_origin=args.require_api_key_origin)
    except ValueError as exc:
        raise FlagError(str(exc)) from None
    limits = Limits(args.char_limit, args.max_texts, args.max_body, body_timeout=args.body_timeout,
                    header_timeout=args.header_timeout, max_connections=args.max_connections,
                    req_limit=args.req_limit, chars_per_minute=args.chars_per_minute,
                    max_file_size=args.max_file_size, file_expiry=args.file_expiry)
    app, scheduler = build(models, batch_tokens=args.batch_tokens, batch_size=args.batch_size,
                           max_queue=args.max_queue, api_keys=api_keys, batching=args.batching, limits=limits,
                           access=access, rates=rates)

    async def drain(app):       # after the in-flight requests were answered: the scheduler stops
        scheduler.stop()
    app.on_cleanup.append(drain)
    banner = [f"serving {name}: {served.source} -> {served.target} from {served.directory} (beam "
              f"{served.defaults['beam']}, precision {served.defaults['precision']}, max_len "
              f"{served.defaults['max_len'] or 'the model rule'})" for name, served in models.items()]
    for name, served in models.items():
        settings = getattr(served.model, "generation", None)
        if settings is not None:
            banner.append(f"  {name}'s generation settings (imported with it): "
                          + "; ".join(settings.describe(served.model.cfg.max_len)))
    banner.append(_guards(app, args, api_keys, access, rates))
    cut = listen(app, args.host, args.port, args.shutdown_timeout, banner, args.shutdown_grace, args.idle_timeout)
    if cut:
        print(f"stopped: {cut} connections still busy after --shutdown-timeout {args.shutdown_timeout:g} s "
              "were closed unanswered", file=sys.stderr, flush=True)
    else:
        print("stopped: every accepted request was answered", file=sys.stderr, flush=True)
    return 0
