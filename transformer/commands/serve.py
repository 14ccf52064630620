"""`transformer serve`: its flags, and `transformer serve keys` (the key database); the server
itself is transformer/serve."""
import argparse

from ..errors import FlagError, blame
from .flags import DECODE_PRECISION_HELP, _non_negative_float, _non_negative_int, _positive_float, _positive_int
from .models import _load_model
from .world import _apply_threads

KEY_ROUTES = ("translate", "metrics", "health")     # serve/access.py's, without importing aiohttp here


def run(args):
    from ..serve import run as run_server

    if not args.model:
        raise FlagError("the following arguments are required: --model (or: transformer serve keys ...)")
    if args.require_api_key_origin is not None:        # it exempts from a key: with none asked, it does nothing
        if not (args.api_keys or args.api_keys_db):
            raise FlagError("--require-api-key-origin: no key is asked for without --api-keys or --api-keys-db, "
                            "so it would change nothing")
        if not args.require_key_for:
            raise FlagError("--require-api-key-origin: --require-key-for none asks a key for no route, so it would "
                            "change nothing")
    _apply_threads(args)
    with blame():
        return run_server(args, load=lambda directory: _load_model(directory, frozen=True))


def run_keys(args):
    """`transformer serve keys add|remove|list --api-keys-db FILE`, as LibreTranslate's `ltmanage keys`."""
    from ..serve import keys

    with blame("--api-keys-db", args.api_keys_db):
        if args.action == "add":
            key = keys.add(args.api_keys_db, args.req_limit, args.key, args.char_limit, args.chars_per_minute)
            print(key)
        elif args.action == "remove":
            if not keys.remove(args.api_keys_db, args.key):
                raise FlagError(f"{args.key}: no such key in {args.api_keys_db}")
            print(args.key)
        else:
            rows = keys.listing(args.api_keys_db)
            print("api_key\treq_limit\tchar_limit\tchars_per_minute")
            for row in rows:
                print("\t".join("-" if value is None else str(value) for value in row))
    return 0


def _names(choices):
    """A comma-separated list of `choices` (or "none")."""
    def parse(text):
        names = [name.strip() for name in text.split(",") if name.strip()]
        if names == ["none"]:
            return ()
        unknown = [name for name in names if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"takes {', '.join(choices)} or none, comma-separated; got {unknown[0]}")
        return tuple(names)
    return parse


def _list(text):
    return tuple(item.strip() for item in text.split(",") if item.strip())


def register(sub):
    serve = sub.add_parser("serve", help="a translation server: LibreTranslate's API, batching across requests")
    serve.add_argument("--model", action="append", metavar="[NAME=]DIR",
                       help="a model directory to serve (needed to serve; several: one per language pair); "
                            "NAME=DIR names it, and SRC-TGT=DIR gives the languages of a model without "
                            "languages.json")
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: "
                       "this machine only)")
    serve.add_argument("--port", type=_positive_int, default=8000)
    serve.add_argument("--beam", type=_positive_int,
                       help="beam size (1: greedy; default, as translate's: an imported model's own num_beams, else 4)")
    serve.add_argument("--max-len", type=_positive_int, metavar="N",
                       help="output tokens at most (default: the model's rule, as translate)")
    serve.add_argument("--no-repeat-ngram", type=_non_negative_int, default=0, metavar="N")
    serve.add_argument("--precision", choices=["fp32", "bf16", "int8"], help=DECODE_PRECISION_HELP)
    serve.add_argument("--threads", type=_positive_int)
    serve.add_argument("--batch-tokens", type=_positive_int, default=4096,
                       help="a batch's source tokens at most, rows x longest x beam (default 4096)")
    serve.add_argument("--batch-size", type=_positive_int, default=64,
                       help="sentences a batch at most (1: one sentence at a time, no batching across "
                            "requests; default 64); the server holds x 4 decoder rows, and refuses to start "
                            "when their step buffers cannot fit the memory")
    serve.add_argument("--batching", choices=["step", "batch"], default="step",
                       help="step: sentences join the running batch between decoder steps and leave it when "
                            "done (iteration-level batching; default); batch: each batch decoded to its end "
                            "before the next starts")
    serve.add_argument("--max-queue", type=_positive_int, default=4096,
                       help="sentences waiting at most; past it requests get 429 with Retry-After (default 4096)")
    serve.add_argument("--char-limit", type=_non_negative_int, default=5000,
                       help="characters a request at most, as LibreTranslate's (0: no limit; default 5000)")
    serve.add_argument("--max-texts", type=_positive_int, default=64, help="texts in one request's q at most")
    serve.add_argument("--max-body", type=_positive_int, default=1 << 20, help="request body bytes at most")
    serve.add_argument("--max-file-size", type=_positive_int, default=1 << 20, metavar="BYTES",
                       help="bytes of a file to POST /translate_file at most (in place of --max-body there); past "
                            "it 413 (default 1048576)")
    serve.add_argument("--file-expiry", type=_positive_float, default=1800.0, metavar="S",
                       help="seconds a translated file waits for GET /download_file before it is removed "
                            "(default 1800)")
    serve.add_argument("--api-keys", metavar="FILE", help="require LibreTranslate's api_key: one valid key a line")
    serve.add_argument("--api-keys-db", "--api-keys-db-path", metavar="FILE",
                       help="require LibreTranslate's api_key: the keys of this SQLite database, each with its "
                            "own limits (LibreTranslate's api_keys table and flag name; `transformer serve keys` "
                            "keeps it)")
    serve.add_argument("--require-key-for", type=_names(KEY_ROUTES), default=("translate",), metavar="ROUTES",
                       help="with --api-keys or --api-keys-db, what needs a key, comma-separated: translate "
                            "(POST /translate, /detect, /v1/translate), metrics (GET /metrics), health (the "
                            "queue and scheduler of GET /health), or none (a key only raises the limits, as "
                            "LibreTranslate's --api-keys); default translate")
    serve.add_argument("--require-api-key-origin", metavar="ORIGIN",
                       help="with --api-keys or --api-keys-db, a request whose Origin header is ORIGIN (your own "
                            "web page, e.g. https://translate.example.org) needs no key where --require-key-for "
                            "asks one, as LibreTranslate's (there a pattern; here the exact origin)")
    serve.add_argument("--req-limit", type=_non_negative_int, default=0, metavar="N",
                       help="requests a minute from one address, as LibreTranslate's (a key: its req_limit); "
                            "past it 429 with Retry-After (0: no limit; default 0)")
    serve.add_argument("--chars-per-minute", type=_non_negative_int, default=0, metavar="N",
                       help="characters a minute from one address (a key: its chars_per_minute); past it 429 "
                            "with Retry-After (0: no limit; default 0)")
    serve.add_argument("--req-limit-storage", default="memory://", metavar="URI",
                       help="where the limits a minute (--req-limit, --chars-per-minute, a key's) are counted, as "
                            "LibreTranslate's: memory:// (this process; default) or sqlite:///PATH (a file the "
                            "servers of one host share, kept across restarts; sqlite:////ABS/PATH for an "
                            "absolute path)")
    serve.add_argument("--max-connections", type=_positive_int, default=1000, metavar="N",
                       help="connections open at once (fewer if the descriptor limit is lower); past it the "
                            "longest idle one is closed, or the new one gets 503 when all are busy (default 1000)")
    serve.add_argument("--header-timeout", type=_non_negative_float, default=10.0, metavar="S",
                       help="seconds a request's headers may take from its first byte; past it 408 and the "
                            "connection closes (0: none; default 10)")
    serve.add_argument("--body-timeout", type=_non_negative_float, default=30.0, metavar="S",
                       help="seconds a request's body may take to arrive; past it 408 (0: none; default 30)")
    serve.add_argument("--idle-timeout", type=_positive_float, default=75.0, metavar="S",
                       help="seconds a connection may wait without a request before it is closed (default 75)")
    serve.add_argument("--cors-origins", type=_list, metavar="ORIGINS",
                       help="browser origins that may read the answers (comma-separated, e.g. "
                            "https://example.org; * for any); default none: no CORS headers")
    serve.add_argument("--allowed-hosts", type=_list, metavar="NAMES",
                       help="Host names answered besides localhost, 127.0.0.1 and ::1 when bound to loopback "
                            "(others get 421: DNS rebinding), or the only ones answered on another address "
                            "(default: any there)")
    serve.add_argument("--shutdown-timeout", type=_positive_float, default=60.0,
                       help="seconds SIGTERM waits for accepted requests to be answered (default 60)")
    serve.add_argument("--shutdown-grace", type=_non_negative_float, default=2.0,
                       help="seconds after SIGTERM an idle connection stays open, so that a request it sends "
                            "is refused with 503 rather than met by a closed connection (default 2)")
    serve.set_defaults(func=run)
    actions = serve.add_subparsers(dest="serve_command", metavar="{keys}")
    keys = actions.add_parser("keys", help="the API key database (--api-keys-db), as LibreTranslate's ltmanage keys")
    keys.add_argument("--api-keys-db", "--api-keys-db-path", required=True, metavar="FILE",
                      help="the SQLite key database (made by add)")
    verbs = keys.add_subparsers(dest="action", required=True)
    add = verbs.add_parser("add", help="add a key (printed) with its requests a minute")
    add.add_argument("req_limit", type=_non_negative_int, metavar="REQ_LIMIT", help="requests a minute (0: no limit)")
    add.add_argument("--key", help="the key (default: a new random one)")
    add.add_argument("--char-limit", type=_non_negative_int, metavar="N",
                     help="characters a request, in place of the server's --char-limit")
    add.add_argument("--chars-per-minute", type=_non_negative_int, metavar="N",
                     help="characters a minute, in place of the server's --chars-per-minute")
    remove = verbs.add_parser("remove", help="remove a key")
    remove.add_argument("key", metavar="KEY")
    verbs.add_parser("list", help="every key and its limits")
    keys.set_defaults(func=run_keys)
