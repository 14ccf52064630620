"""`transformer translate`: sentences from the arguments or standard input, translated in blocks; or
a file (--file IN --out OUT: .txt, .srt, .vtt, .html, .docx, .pptx, .odt, .epub), its layout kept
as POST /translate_file keeps it (serve/formats.py)."""
import sys

from ..errors import FlagError, blame
from .flags import DECODE_PRECISION_HELP, _check_output, _non_negative_int, _positive_int
from .models import _load_model, _model_beam
from .world import _apply_threads

# Lines of a pipe or file translated together (sorted by length within the block, printed when the
# block is done): a long input streams out, in bounded memory, as fast as batching allows.
STDIN_BLOCK_LINES = 256


def _text_blocks(texts):
    """The sentences to translate, in blocks of consecutive lines: the arguments (one block), or
    standard input's lines (one at a time from a terminal, so that each translation appears when
    its line is entered; STDIN_BLOCK_LINES at a time otherwise). All UTF-8: a line in another
    encoding is refused, not translated into garbage."""
    if texts:
        for index, text in enumerate(texts):
            try:
                text.encode("utf-8")     # bytes that are not UTF-8 reach argv as lone surrogates
            except UnicodeEncodeError:
                raise FlagError(f"argument {index + 1}: not UTF-8 text") from None
        yield list(texts)
        return
    if sys.stdin is None:            # started with standard input closed
        raise FlagError("no text: give sentences as arguments or as lines on standard input")
    stream = getattr(sys.stdin, "buffer", None)
    size = 1 if sys.stdin.isatty() else STDIN_BLOCK_LINES
    lines = iter(stream) if stream is not None else (line.encode("utf-8", "surrogateescape") for line in sys.stdin)
    block, number = [], 0
    while True:
        with blame("standard input"):
            line = next(lines, None)
        if line is None:
            break
        number += 1
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FlagError(f"standard input line {number}: not UTF-8 (byte 0x{line[exc.start]:02x} at "
                            f"byte {exc.start + 1} of the line)") from None
        # one line a sentence, whatever ends it: "\r\n" (a file from Windows) is no character of it
        block.append(text.rstrip("\n").removesuffix("\r"))
        if len(block) == size:
            yield block
            block = []
    if block:
        yield block


def _translate_file(args, model, src_tok, tgt_tok):
    """--file IN --out OUT: the file read as the server reads an upload, its sentences translated,
    written back with everything else as it was."""
    from ..checkpoint import read_languages
    from ..languages import alpha2
    from ..serve.formats import FormatError, read
    from ..translation import translate_texts

    with blame("--file", args.file):
        with open(args.file, "rb") as f:
            data = f.read()
    pair = read_languages(args.model)
    try:
        document = read(data, args.file, alpha2(pair[0]) if pair else "en")
    except FormatError as exc:
        raise FlagError(f"--file {args.file}: {exc}") from None
    translated = translate_texts(model, src_tok, tgt_tok, document.sentences, beam=args.beam, max_len=args.max_len,
                                 no_repeat_ngram=args.no_repeat_ngram,
                                 precision=args.precision or model.stored_precision) if document.sentences else []
    with blame("--out", args.out):
        with open(args.out, "wb") as f:
            f.write(document.render(translated))
    print(f"{args.file}: {len(document.sentences)} sentences translated into {args.out}", file=sys.stderr)
    return 0


def run(args):
    from ..translation import translate_texts

    if args.file is not None and (args.out is None or args.text or args.attention):
        raise FlagError("--file needs --out, and takes no sentences and no --attention")
    if args.out is not None and args.file is None:
        raise FlagError("--out names where --file's translation goes: give --file too")
    _apply_threads(args)
    _check_output("--attention", args.attention, needs="matplotlib")
    model, src_tok, tgt_tok = _load_model(args.model, frozen=True)
    _model_beam(args, model, "translate")
    if args.max_len is not None and args.max_len > model.cfg.max_len:
        raise FlagError(f"--max-len {args.max_len}: the model in --model {args.model} has {model.cfg.max_len} "
                        f"positions, so translations of at most {model.cfg.max_len} tokens")
    if args.file is not None:
        return _translate_file(args, model, src_tok, tgt_tok)
    blocks = _text_blocks(args.text)
    block = next(blocks, [])
    if args.attention and not (block and block[0].strip()):
        raise FlagError("--attention draws the first sentence, and there is none")
    first = block[0] if block else None
    where = "argument" if args.text else "line"
    done = 0        # lines translated before this block

    def warn(index, subwords, pieces):
        print(f"transformer translate: warning: {where} {done + index + 1} has {subwords} subwords, more than "
              f"the model's {model.cfg.max_len} positions: translated in {pieces} pieces", file=sys.stderr)

    while block:
        for line in translate_texts(model, src_tok, tgt_tok, block, beam=args.beam, max_len=args.max_len,
                                    on_split=warn, no_repeat_ngram=args.no_repeat_ngram,
                                    precision=args.precision or model.stored_precision):
            print(line)
        sys.stdout.flush()
        done += len(block)
        block = next(blocks, [])
    if args.attention:
        from ..plot import plot_cross_attention

        with blame("--attention", args.attention):
            missing = plot_cross_attention(model, src_tok, tgt_tok, first, args.attention, max_len=args.max_len)
        if missing:
            print(f"transformer translate: warning: no installed font draws {len(missing)} of the characters "
                  f"(such as {', '.join(missing[:5])}): {args.attention} shows boxes for them; a font for "
                  "their script (e.g. the fonts-noto package) draws them", file=sys.stderr)
        # the heatmap follows one greedy float32 decoding: say so when the lines above came otherwise
        other = [f"{flag} {value}" for flag, value, plain in (
            ("--beam", args.beam, 1), ("--no-repeat-ngram", args.no_repeat_ngram, 0),
            ("--precision", args.precision or model.stored_precision, "fp32")) if value != plain]
        note = f" (of its greedy float32 translation, not the one with {', '.join(other)} above)" if other else ""
        print(f"cross-attention of {first!r} drawn in {args.attention}{note}", file=sys.stderr)
    return 0


def register(sub):
    translate = sub.add_parser("translate", help="translate sentences (arguments, or stdin lines)")
    translate.add_argument("--model", required=True, metavar="DIR")
    translate.add_argument("--beam", type=_positive_int,
                           help="beam size (1: greedy; default: an imported model's own num_beams, else 4)")
    translate.add_argument("--max-len", type=_positive_int, metavar="N",
                           help="at most N subwords per translation, up to the model's positions (default: "
                                "twice the source's subwords + 10, within the model's positions)")
    translate.add_argument("--no-repeat-ngram", type=_non_negative_int, default=0, metavar="N",
                           help="never repeat an n-gram of N tokens in an output (0: off)")
    translate.add_argument("--precision", choices=["fp32", "bf16", "int8"],
                           help=DECODE_PRECISION_HELP)
    translate.add_argument("--threads", type=_positive_int)
    translate.add_argument("--attention", metavar="FILE.png", help="draw the cross-attention of the first sentence")
    translate.add_argument("--file", metavar="IN",
                           help="translate a file (.txt, .srt, .vtt, .html, .docx, .pptx, .odt, .epub) into --out, its "
                                "layout kept as `serve`'s POST /translate_file keeps it")
    translate.add_argument("--out", metavar="OUT", help="where --file's translation is written")
    translate.add_argument("text", nargs="*")
    translate.set_defaults(func=run)
