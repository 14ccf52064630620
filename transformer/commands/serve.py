"""`transformer serve`: its flags; the server itself is transformer/serve."""
from ..errors import blame
from .flags import DECODE_PRECISION_HELP, _non_negative_float, _non_negative_int, _positive_float, _positive_int
from .models import _load_model
from .world import _apply_threads


def run(args):
    from ..serve import run as run_server

    _apply_threads(args)
    with blame():
        return run_server(args, load=lambda directory: _load_model(directory, frozen=True))


def register(sub):
    serve = sub.add_parser("serve", help="a translation server: LibreTranslate's API, batching across requests")
    serve.add_argument("--model", required=True, action="append", metavar="[NAME=]DIR",
                       help="a model directory to serve (several: one per language pair); NAME=DIR names it, "
                            "and SRC-TGT=DIR gives the languages of a model without languages.json")
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
                            "requests; default 64)")
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
    serve.add_argument("--api-keys", metavar="FILE", help="require LibreTranslate's api_key: one valid key a line")
    serve.add_argument("--shutdown-timeout", type=_positive_float, default=60.0,
                       help="seconds SIGTERM waits for accepted requests to be answered (default 60)")
    serve.add_argument("--shutdown-grace", type=_non_negative_float, default=2.0,
                       help="seconds after SIGTERM an idle connection stays open, so that a request it sends "
                            "is refused with 503 rather than met by a closed connection (default 2)")
    serve.set_defaults(func=run)
