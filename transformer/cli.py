"""The `transformer` command line."""
import argparse
import importlib.util
import json
import math
import os
import sys

from .config import (BPE_SAMPLE_PAIRS, DROPOUT_FREE_PASSES, HEAVY_DROPOUT, HEAVY_DROPOUT_PASSES,
                     TRAIN_DEFAULTS)
from .data import HEADER_CHOICES
from .errors import FlagError, blame, describe

HEADER_HELP = ("whether line 1 of --data names the columns: yes, no (it is a pair), or auto (default: yes "
               "when a column is given by name, or when every field of line 1 is a short identifier such "
               "as eng or spa; the summary printed at the start says when line 1 was read as the header)")
DECODE_PRECISION_HELP = ("fp32 (default; int8 for a model written by `transformer quantize`); bf16: linear "
                         "maps on bfloat16 operands with float32 sums; int8: linear maps on int8 weights (one "
                         "scale per output row) and int8 activations (one scale per row), int32 sums")
BENCH_DEFAULTS = {"config": "tiny,base", "families": "gemm,nn,elementwise,loss", "precision": "fp32"}
# What each --what reads besides --threads and --json; these flags given to another are refused.
BENCH_FLAGS = {"kernels": ("families", "against", "precision"),
               "train": ("config", "against", "precision", "repeats"), "profile": ("config",),
               "decode": ("config", "against", "precision", "repeats"), "masking": (),
               "all": ("config", "against", "plot"), "distributed": ("config", "against"),
               "marian": ("config",), "serve": ("config", "precision")}


def _threads(text):
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--threads takes a comma-separated list of ints, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--threads values must be >= 1, got {text!r}")
    return values


def _default_threads():
    """1, 2, 4, ... up to the cores present, and the core count itself."""
    cores = os.cpu_count() or 1
    values, n = [], 1
    while n < cores:
        values.append(n)
        n *= 2
    return values + [cores]


def _against(args):
    """"torch" when asked for and installed; None to measure ours alone."""
    if args.against == "none":
        return None
    try:
        import torch  # noqa: F401
    except ImportError:
        if args.against == "torch":
            print("transformer bench: warning: --against torch needs PyTorch (pip install torch); "
                  "measuring ours alone", file=sys.stderr)
        return None
    return "torch"


def _configs(args):
    """Named configs (tiny,base) or one custom size spec (KEY=INT,...)."""
    from .bench import train

    if "=" in args.config:
        try:
            return [train.custom_config(args.config)]
        except ValueError as exc:
            raise FlagError(str(exc)) from None
    names = [n.strip() for n in args.config.split(",") if n.strip()]
    unknown = [n for n in names if n not in train.CONFIGS or n == "custom"]
    if not names or unknown:
        raise FlagError(f"--config: expected tiny, base, tiny,base or KEY=INT,..., got {args.config!r}")
    return names


def _check_output(flag, path, needs=None):
    """Refuse, before any work, an output file that cannot be written (or drawn)."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FlagError(f"{flag} {path}: there is no folder {folder} to write it in")
    if os.path.isdir(path):
        raise FlagError(f"{flag} {path}: a folder, not a file")
    if needs and importlib.util.find_spec(needs) is None:
        raise FlagError(f"{flag} needs {needs} (pip install {needs})")


def _bench_marian(args):
    """MarianMT at OPUS-MT's size: decoding against CTranslate2 and transformers, fine-tuning
    against transformers (transformer/bench/marian.py)."""
    from .bench import marian

    if args.config not in marian.CONFIGS:
        raise FlagError(f"--config {args.config}: --what marian takes {' or '.join(sorted(marian.CONFIGS))}")
    missing = [name for name in ("torch", "transformers", "sentencepiece", "ctranslate2")
               if importlib.util.find_spec(name) is None]
    if missing:
        raise FlagError(f"--what marian compares with CTranslate2 and transformers: it needs "
                        f"{', '.join(missing)} (pip install {' '.join(missing)})")
    records = marian.run(tuple(args.threads), config=args.config, stream=sys.stdout)
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    return 0


def _bench_serve(args):
    """`transformer serve` under concurrent clients (transformer/bench/serve.py)."""
    from .bench import serve

    if importlib.util.find_spec("aiohttp") is None:
        raise FlagError('--what serve needs aiohttp: pip install "transformer-cpu[serve]"')
    names = [n.strip() for n in args.config.split(",") if n.strip()]
    unknown = [n for n in names if n not in serve.CONFIGS]
    if not names or unknown:
        raise FlagError(f"--config {args.config}: --what serve takes {', '.join(serve.CONFIGS)}")
    records = []
    for threads in args.threads:
        records += serve.run(configs=tuple(names), threads=threads, precision=args.precision, stream=sys.stdout)
    if args.json:
        with open(args.json, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    print(serve.table(records), file=sys.stderr)
    return 0


def _check_bench_flags(args):
    """A flag the chosen --what would not read is refused, not silently ignored."""
    for key in ("config", "against", "families", "plot", "precision", "repeats"):
        if getattr(args, key) is not None and key not in BENCH_FLAGS[args.what]:
            readers = " or ".join(what for what, keys in BENCH_FLAGS.items() if key in keys)
            raise FlagError(f"--{key} does not apply to --what {args.what}, only to --what {readers}")
    if args.what == "distributed" and args.config is None:
        args.config = "base"            # the figure: the base training step
    if args.what == "marian" and args.config is None:
        args.config = "opus"            # OPUS-MT's size
    if args.what == "serve" and args.precision is None:
        args.precision = "int8"         # the figure: int8 serving
    for key, value in BENCH_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    _check_output("--json", args.json)
    _check_output("--plot", args.plot, needs="matplotlib")
    _check_bench_precision(args)


def _check_bench_precision(args):
    """--precision: int8 is for inference, not --what train; bf16/int8 kernels rows are GEMM rows;
    and an engine built without the precision API is refused here, before any work, rather than
    measured at fp32 under another name."""
    from .bench.precision import SUPPORTED, missing

    if args.what not in SUPPORTED or args.precision == "fp32":
        return
    if args.precision not in SUPPORTED[args.what]:
        raise FlagError(f"--precision {args.precision} does not apply to --what {args.what}: training runs at "
                        f"{' or '.join(SUPPORTED[args.what])} ({args.precision} is for inference: --what decode "
                        f"or kernels)")
    if args.what == "kernels" and "gemm" not in args.families.split(","):
        raise FlagError(f"--precision {args.precision} adds GEMM rows to --what kernels: --families must "
                        f"include gemm, got {args.families!r}")
    why = missing(args.precision, args.what)
    if why is not None:
        with blame("--precision", args.precision):
            raise ValueError(f"{why}: this engine cannot run {args.what} at {args.precision} yet")


def _emit(records, args):
    with open(args.json, "w") if args.json else open(os.devnull, "w") as sink:
        for record in records:
            print(json.dumps(record))
            sink.write(json.dumps(record) + "\n")


def _bench(args):
    from .bench import kernels

    _check_bench_flags(args)
    if args.threads is None:
        args.threads = _default_threads()
    if args.what == "marian":
        return _bench_marian(args)
    if args.what == "serve":
        return _bench_serve(args)
    configs = _configs(args)
    against = _against(args)
    if args.what == "kernels" and against is None:
        raise FlagError("--what kernels compares with PyTorch and numpy: it needs torch "
                        "(--what train, profile, decode, masking and all run without it)")
    if args.what == "all":
        from .bench import scaling

        suites = ("gemm", "train", "decode") if against else ("train", "decode")
        records = scaling.run_all(args.threads, what=suites, stream=sys.stdout,
                                  configs=configs, against=against)
        if args.json:
            with open(args.json, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        print(scaling.efficiency_table(records), file=sys.stderr)
        if args.plot:
            scaling.plot(records, args.plot)
            print(f"plot written to {args.plot}", file=sys.stderr)
        return 0
    if args.what in ("train", "profile"):
        from .bench import train

        records = []
        if args.what == "train":
            records = train.run(threads=tuple(args.threads), configs=tuple(configs), against=against,
                                precision=args.precision, repeats=args.repeats)
        profiles = [train.profile(name, n, precision=args.precision) for name in configs for n in args.threads]
        _emit(records + profiles, args)
        for record in profiles:
            print("\n" + train.profile_table(record), file=sys.stderr)
        return 0
    if args.what == "decode":
        from .bench import decode

        engines = ("ours", "torch", "ctranslate2") if against else ("ours",)
        _emit(decode.run(threads=tuple(args.threads), configs=tuple(configs), engines=engines,
                         precision=args.precision, repeats=args.repeats), args)
        return 0
    if args.what == "distributed":
        from .bench import distributed

        if _against(args) is None and args.against != "none":
            raise FlagError("--what distributed compares with PyTorch DDP: it needs torch (or --against none)")
        records = distributed.run(threads=tuple(args.threads), configs=tuple(configs), against=against,
                                  stream=sys.stdout)
        if args.json:
            with open(args.json, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        print(distributed.table(records), file=sys.stderr)
        return 0
    if args.what == "masking":
        from .bench import masking

        records = masking.run(threads=tuple(args.threads), stream=sys.stdout)
        if args.json:
            with open(args.json, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        print(masking.table(records), file=sys.stderr)
        return 0
    families = [f for f in args.families.split(",") if f]
    unknown = sorted(set(families) - set(kernels.FAMILIES))
    if unknown or not families:
        raise FlagError(f"--families {args.families}: unknown {unknown}; choose from {list(kernels.FAMILIES)}")
    records = kernels.run(threads=args.threads, families=families, stream=sys.stdout, precision=args.precision)
    if args.json:
        with open(args.json, "w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")
    print(kernels.summary_table(records), file=sys.stderr)
    return 0


def _integer(text, minimum):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def _positive_int(text):
    return _integer(text, 1)


def _non_negative_int(text):
    return _integer(text, 0)


def _at_least_two(text):
    return _integer(text, 2)


def _vocab_size(text):
    from .tokenizer import MAX_VOCAB_SIZE, SPECIAL_TOKENS

    value = _integer(text, len(SPECIAL_TOKENS) + 1)      # the reserved ids and one learned entry
    if value > MAX_VOCAB_SIZE:
        raise argparse.ArgumentTypeError(f"must be <= {MAX_VOCAB_SIZE}, got {value}")
    return value


def _real(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _positive_float(text):
    value = _real(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _non_negative_float(text):
    value = _real(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _language_code(text):
    from .checkpoint import is_language_code

    if not is_language_code(text):
        raise argparse.ArgumentTypeError(f"must be a language code such as en, spa or pt-BR, got {text!r}")
    return text


def _fraction(text):
    value = _real(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def _cores():
    """The cores this process may run on (a launcher's or a container's binding counts)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _apply_threads(args):
    if getattr(args, "threads", None):
        import transformer as T

        threads = args.threads[0] if isinstance(args.threads, list) else args.threads
        cores = _cores()
        if threads > cores:   # honoured, but every thread past the cores slows all of them down
            print(f"transformer {args.command}: warning: --threads {threads} is more than the {cores} "
                  f"core{'s' if cores > 1 else ''} this process may run on; threads past the cores take turns "
                  f"on them and make every step slower", file=sys.stderr)
        with blame("--threads", threads):   # a build without OpenMP refuses more than one, in one line
            T.set_num_threads(threads)


def _mpi_world():
    """Under mpirun/mpiexec: (rank, size, ranks on this machine, the cores this rank may use, how
    many ranks on this machine may use exactly those cores); None for a plain process (importing
    no MPI)."""
    from .distributed import import_mpi, launched_ranks

    rank, size = launched_ranks()
    if size == 1:
        return None
    try:
        MPI = import_mpi()
    except ImportError as exc:
        raise FlagError(f"started by an MPI launcher with {size} ranks, but {exc}") from None
    comm = MPI.COMM_WORLD
    if comm.Get_size() != size:
        raise FlagError(f"the MPI launcher started {size} ranks but mpi4py sees {comm.Get_size()}: mpi4py was "
                        "built for another MPI than the mpirun used (use the mpirun of the same installation, "
                        "e.g. the one `pip install \"transformer-cpu[mpi]\"` puts in the virtual environment)")
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    cores = sorted(os.sched_getaffinity(0))
    sharing = sum(other == cores for other in local.allgather(cores))
    return comm.Get_rank(), size, local.Get_size(), cores, sharing


def _rank_share(world):
    """(bound, threads): whether this rank may run on fewer than all the machine's cores (pinned by
    the launcher, or a container's limit), and the threads it may run without oversubscribing: its
    share of the cores it may use, among the ranks here that may use the same ones."""
    cores, sharing = world[3], world[4]
    return len(cores) < (os.cpu_count() or len(cores)), max(1, len(cores) // sharing)


def _threads_per_rank(args, world):
    """Ranks x threads must not oversubscribe the cores: the default is this rank's share of the
    cores it may run on; a --threads that would oversubscribe is refused."""
    cores, sharing = world[3], world[4]
    bound, share = _rank_share(world)
    if args.threads is None:
        args.threads = share
        return
    if args.threads > share:
        whose = "the same" if bound else "this machine's"
        how = (f"this rank is bound to {len(cores)} core{'s' if len(cores) > 1 else ''}" if sharing == 1 else
               f"{sharing} ranks share {whose} {len(cores)} cores")
        raise FlagError(f"--threads {args.threads}: {how}, so {args.threads} threads a rank would oversubscribe "
                        f"them (at most {share}; or bind each rank to more cores: MPICH `mpiexec -bind-to "
                        f"core:{args.threads}`, Open MPI `mpirun --map-by slot:PE={args.threads}`)")


def _train(args):
    from . import train
    from .training import report

    world = _mpi_world()
    if world is not None:
        args.world = world[:2]
        report.SILENT = world[0] != 0
        if world[0] != 0:
            args.quiet = True
        _threads_per_rank(args, world)
    _apply_threads(args)
    with blame("--resume", args.resume):
        if args.resume and not os.path.exists(args.resume):
            raise FileNotFoundError("no such directory")
        if args.resume and os.path.isdir(args.resume) and not os.path.exists(
                os.path.join(args.resume, "checkpoint.safetensors")):
            raise FileNotFoundError("no checkpoint.safetensors in it: not the --out of a training run")
        train.load_resume(args)
    train.apply_defaults(args)
    builtin_default = args.out is None and args.resume is None and not train.has_data(args)
    if world is None or world[0] == 0:    # rank 0 writes --out; the others may start after it has
        _check_train_out(args, builtin_default)
    with blame("--out", args.out):
        created = train.prepare_out_dir(args)
    try:
        if train.has_data(args):
            return train.train_on_data(args)
        return train.train_builtin(args)
    except BaseException:
        if world is None or world[0] == 0:   # a run that failed before writing anything leaves no
            for directory in created:          # empty --out behind (nor the runs/ made for it)
                try:
                    os.rmdir(directory)
                except OSError:   # not empty: what it wrote stays
                    break
        raise


def _prepare(args):
    """`transformer prepare`: a corpus read once into a prepared directory (transformer/corpus)."""
    import time

    from . import datasets
    from .corpus import is_prepared, make_inputs, prepare
    from .training.flags import corpus_blame, data_specs

    for key in ("src_col", "tgt_col", "header", "dev_fraction", "dev_max", "bpe_sample"):
        if getattr(args, key) is None:
            setattr(args, key, TRAIN_DEFAULTS[key])
    with blame("--out", args.out):
        if os.path.isdir(args.out) and os.listdir(args.out):
            if not is_prepared(args.out):
                raise FlagError(f"--out {args.out}: holds files that are not a prepared corpus (nothing there "
                                "is replaced: choose another directory)")
            if not args.overwrite:
                raise FlagError(f"--out {args.out}: holds a prepared corpus; --overwrite replaces it")
        elif os.path.exists(args.out) and not os.path.isdir(args.out):
            raise NotADirectoryError(f"{args.out}: a file, not a directory")
        elif os.path.isdir(args.out):
            os.rmdir(args.out)           # an empty directory: the prepared one takes its place
    tokenizers = None
    if args.tokenizers_from:
        from .checkpoint import load_for_inference

        if args.vocab_size is not None:
            raise FlagError("--vocab-size: the vocabularies come from --tokenizers-from (leave the flag out)")
        with blame("--tokenizers-from", args.tokenizers_from):
            _, src_tok, tgt_tok = load_for_inference(args.tokenizers_from)
        tokenizers = {"src": src_tok, "tgt": tgt_tok}
    with corpus_blame(args):
        specs = [datasets.resolve(spec) if datasets.is_shortcut(spec) else spec for spec in data_specs(args.data)]
        inputs = make_inputs(specs, args.src_col, args.tgt_col, HEADER_CHOICES[args.header], args.src_file,
                             args.tgt_file)
    started = time.monotonic()
    with corpus_blame(args):
        path = prepare(inputs, args.out, dev_fraction=args.dev_fraction, dev_max=args.dev_max,
                       vocab_size=args.vocab_size, bpe_sample=args.bpe_sample, tokenizers=tokenizers,
                       overwrite=args.overwrite, progress=not args.quiet,
                       log=lambda message: print(message, file=sys.stderr, flush=True))
    seconds = time.monotonic() - started
    from .corpus import read_manifest

    manifest = read_manifest(path)
    counts = manifest["counts"]
    print(json.dumps({"prepared": path, **counts, "seconds": round(seconds, 2),
                      "pairs_per_s": round(counts["pairs"] / max(seconds, 1e-9), 1),
                      "phases": manifest["seconds"],
                      "ids_dtype": manifest["arrays"]["train.src.ids"]["dtype"]}))
    print(f"prepared {counts['train']:,} training and {counts['dev']:,} held-out pairs into {path} in "
          f"{seconds:.1f} s; train on them with: transformer train --data {path}", file=sys.stderr)
    return 0


def _check_train_out(args, builtin_default):
    """A new run does not write over another run's checkpoint or model: --resume continues it,
    --overwrite replaces it. The built-in task's default directory (a two-minute demo) is the
    exception, so that `transformer train` can be run again."""
    from .training.resume import default_out_dir

    out = args.out or args.resume or default_out_dir(args)
    if args.resume is not None and os.path.realpath(out) == os.path.realpath(args.resume):
        return
    if builtin_default:
        return
    _check_out_dir(out, [("--init-from", getattr(args, "init_from", None))], args.overwrite)


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


# What marks a directory as holding a model or a training run: ours, or a MarianMT export's.
MODEL_FILES = ("checkpoint.safetensors", "config.json", "model.safetensors", "pytorch_model.bin")


def _check_out_dir(out, inputs=(), overwrite=False):
    """Refuse, before any work, an --out that is one of the command's inputs (the input would be
    lost while it is read), or that already holds a model or run, unless --overwrite."""
    target = os.path.realpath(out)
    for flag, path in inputs:
        if path is not None and os.path.realpath(path) == target:
            raise FlagError(f"--out {out}: the same directory as {flag}; write the result to another one")
    held = [name for name in MODEL_FILES if os.path.exists(os.path.join(out, name))]
    if held and not overwrite:
        raise FlagError(f"--out {out}: already holds a model ({held[0]}); give --overwrite to replace it, "
                        "or another directory")


def _replace(args):
    """With --overwrite, what a run or model of ours left in --out goes before the new one is
    written (checkpoint.clear_run), so the two are never mixed; input checks have all passed."""
    from .checkpoint import clear_run

    if args.overwrite and os.path.isdir(args.out):
        clear_run(args.out)


def _load_model(directory, flag="--model", frozen=False):
    """load_for_inference, errors blamed on `flag`. frozen: read-only weights (Parameters.freeze),
    for the commands that only decode: no one else ever holds a view of them, so decoding trusts
    its converted matrices from call to call instead of reading every weight again."""
    from .checkpoint import load_for_inference

    with blame(flag, directory):
        if os.path.isdir(directory) and not os.path.exists(os.path.join(directory, "config.json")):
            raise FileNotFoundError("no config.json in it: not the --out of a training run")
        model, src_tok, tgt_tok = load_for_inference(directory)
    if frozen:
        model.params.freeze()
    return model, src_tok, tgt_tok


def _serve(args):
    from .serve import run

    _apply_threads(args)
    with blame():
        return run(args, load=lambda directory: _load_model(directory, frozen=True))


def _model_beam(args, model, command):
    """--beam as given, else the model's own num_beams (an imported model's generation settings,
    generation.py), else 4; for translate, says on stderr which settings decode and whence."""
    settings = model.generation
    given = args.beam is not None
    if not given:
        args.beam = settings.num_beams if settings is not None else 4
    if settings is None or command != "translate":
        return
    overrides = [f"{flag} {value}" for flag, value, on in (("--beam", args.beam, given),
                                                            ("--max-len", args.max_len, args.max_len is not None))
                 if on]
    print(f"transformer translate: the model's generation settings (imported with it, as transformers' "
          f"generate reads them): {'; '.join(settings.describe(model.cfg.max_len))}"
          + (f"; given: {', '.join(overrides)}" if overrides else ""), file=sys.stderr)


def _translate(args):
    from .translation import translate_texts

    _apply_threads(args)
    _check_output("--attention", args.attention, needs="matplotlib")
    model, src_tok, tgt_tok = _load_model(args.model, frozen=True)
    _model_beam(args, model, "translate")
    if args.max_len is not None and args.max_len > model.cfg.max_len:
        raise FlagError(f"--max-len {args.max_len}: the model in --model {args.model} has {model.cfg.max_len} "
                        f"positions, so translations of at most {model.cfg.max_len} tokens")
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
        from .plot import plot_cross_attention

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


def _evaluate(args):
    from .data import read_pairs
    from .translation import score_translations, translate_texts

    _apply_threads(args)
    _check_output("--output", args.output)
    from . import datasets

    model, src_tok, tgt_tok = _load_model(args.model, frozen=True)
    _model_beam(args, model, "evaluate")
    with blame("--data", args.data):
        if datasets.is_shortcut(args.data):
            args.data = datasets.resolve(args.data)
        pairs, report = read_pairs(args.data, args.src_col, args.tgt_col, max_pairs=args.limit,
                                   header=HEADER_CHOICES[args.header])
    print(report.summary(), file=sys.stderr)
    split = []
    precision = args.precision or model.stored_precision
    hyps = translate_texts(model, src_tok, tgt_tok, [s for s, _ in pairs], beam=args.beam,
                           on_split=lambda index, subwords, pieces: split.append(index),
                           no_repeat_ngram=args.no_repeat_ngram, precision=precision)
    if split:
        print(f"transformer evaluate: warning: {len(split)} source sentences (the first: pair {split[0] + 1}) "
              f"have more subwords than the model's {model.cfg.max_len} positions: translated in pieces",
              file=sys.stderr)
    if args.output:
        with blame("--output", args.output), open(args.output, "w", encoding="utf-8") as f:
            f.writelines(hyp + "\n" for hyp in hyps)
    scores = score_translations(hyps, [t for _, t in pairs], signatures=True)
    print(json.dumps({"pairs": len(pairs), "beam": args.beam, "precision": precision,
                      "bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2),
                      "signature": scores["signature"]}))
    return 0


def _average(args):
    from .checkpoint import average_model_dirs, copy_languages, save_inference_files

    if len(args.models) < 2:
        raise FlagError(f"one model directory ({args.models[0]}): averaging needs at least two (to copy "
                        f"a model, copy its directory)")
    _check_out_dir(args.out, [("a model it averages", m) for m in args.models], args.overwrite)
    with blame():
        model, src_tok, tgt_tok = average_model_dirs(args.models)
    with blame("--out", args.out):
        _replace(args)
        save_inference_files(args.out, model, src_tok, tgt_tok)
        copy_languages(args.models[0], args.out)
    print(f"averaged {len(args.models)} models into {args.out}", file=sys.stderr)
    return 0


def _quantize(args):
    from .checkpoint import copy_languages, save_inference_files

    _check_out_dir(args.out, [("--model", args.model)], args.overwrite)
    model, src_tok, tgt_tok = _load_model(args.model)
    with blame("--out", args.out):
        _replace(args)
        save_inference_files(args.out, model, src_tok, tgt_tok, precision="int8")
        copy_languages(args.model, args.out)
    print(f"wrote the int8 model {args.out} (its weight matrices quantized per row; translate and "
          "evaluate decode it in int8 unless given another --precision)", file=sys.stderr)
    return 0


def _convert(args):
    from .checkpoint import save_inference_files
    from .checkpoint import read_languages
    from .marian import config_to_marian, export_marian, import_marian, marian_languages

    if (args.source is None) == (args.to is None):
        raise FlagError("give exactly one of --from marian HF_DIR (import) and --to marian DIR (export)")
    if args.source is not None:
        fmt, directory = args.source
        if fmt != "marian":
            raise FlagError(f"--from {fmt}: the formats are: marian")
        _check_out_dir(args.out, [("--from", directory)], args.overwrite)
        with blame("--from", directory):
            if not os.path.isdir(directory):
                raise FileNotFoundError("MarianMT directory not found")
            model, src_tok, tgt_tok = import_marian(directory)
        with blame("--out", args.out):
            _replace(args)
            languages = marian_languages(directory)
            save_inference_files(args.out, model, src_tok, tgt_tok, languages=languages)
        said = f"; languages {languages[0]} -> {languages[1]}" if languages else \
            "; its languages are not in it (serve it as --model SRC-TGT=DIR)"
        print(f"wrote {args.out}: a MarianMT model with {model.num_parameters():,} parameters "
              f"(translate, evaluate and train --init-from read it){said}", file=sys.stderr)
        return 0
    fmt, directory = args.to
    if fmt != "marian":
        raise FlagError(f"--to {fmt}: the formats are: marian")
    _check_out_dir(args.out, [("--to", directory)], args.overwrite)
    model, src_tok, tgt_tok = _load_model(directory, "--to")
    with blame("--to", directory):
        config_to_marian(model.cfg)
    with blame("--out", args.out):
        _replace(args)
        export_marian(model, src_tok, tgt_tok, args.out, languages=read_languages(directory))
    print(f"wrote {args.out}: MarianMTModel.from_pretrained and MarianTokenizer.from_pretrained read it",
          file=sys.stderr)
    return 0


def _info(args):
    import transformer as T

    info = T.build_info()
    if args.model is not None:
        model = _load_model(args.model)[0]
        settings = model.generation
        info["model"] = {"dir": args.model, "generation_settings": None if settings is None else
                         settings.describe(model.cfg.max_len),
                         "note": "imported with the model: the defaults of translate, evaluate and decoding calls"
                         if settings is not None else "a model trained here: this engine's decoding defaults"}
    world = _mpi_world()
    if world is not None:           # under mpirun: every rank reports, rank order
        from .distributed import import_mpi

        rank, size, local, cores, _ = world
        bound, share = _rank_share(world)
        mine = {"rank": rank, "ranks": size, "ranks_on_this_machine": local, "host": os.uname().nodename,
                "threads": share, "bound_by_the_launcher": bound, "cores_this_rank_may_use": cores}
        every = import_mpi().COMM_WORLD.gather(mine, root=0)
        if rank != 0:
            return 0
        info["mpi"] = every
    print(json.dumps(info, indent=2))
    return 0


class _Parser(argparse.ArgumentParser):
    """A usage error is one line, `transformer train: error: argument --threads: ...` (exit status 2);
    only the top level, whose usage is one line, shows it too."""
    usage_on_error = False

    def error(self, message):
        if self.usage_on_error:
            self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_args(self, args=None, namespace=None):
        # an argument no parser took is the command's error (`transformer translate: error: ...`),
        # not the top level's, which would print the usage of every command
        args, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(self, "commands", {}).get(getattr(args, "command", None), self)
            command.error(f"unrecognized arguments: {' '.join(extras)}")
        return args


DATA_HELP = ("the corpus: tab-separated pairs (.tsv, plain or gzip), SOURCE,TARGET for two aligned text files "
             "(OPUS's format, one sentence a line), or tatoeba:SRC-TGT (downloaded once); several are one corpus")


def _corpus_flags(parser, data_help):
    parser.add_argument("--data", nargs="+", action="extend", metavar="PATH", help=data_help)
    parser.add_argument("--src-file", metavar="FILE", help="the source side of two aligned text files")
    parser.add_argument("--tgt-file", metavar="FILE", help="the target side of two aligned text files")
    parser.add_argument("--src-col", help="source column of tab-separated files: header name or 0-based index "
                        "(default 0)")
    parser.add_argument("--tgt-col", help="target column of tab-separated files: header name or 0-based index "
                        "(default 1)")
    parser.add_argument("--header", choices=list(HEADER_CHOICES), help=HEADER_HELP)


def _vocabulary_flags(parser):
    parser.add_argument("--vocab-size", type=_vocab_size,
                        help="with --data: BPE vocabulary size per language (default: one per 16 words of the "
                             "training text, per language on average, rounded down to a multiple of 500, "
                             "between 1000 and 4000)")
    parser.add_argument("--bpe-sample", type=_positive_int, metavar="PAIRS",
                        help="with --data: learn BPE from at most this many training pairs, those of smallest "
                             f"hash when there are more (default {BPE_SAMPLE_PAIRS:,}: every pair of a "
                             "smaller corpus)")


def _split_flags(parser):
    parser.add_argument("--dev-fraction", type=_fraction,
                        help=f"with --data: share held out for evaluation (default {TRAIN_DEFAULTS['dev_fraction']})")
    parser.add_argument("--dev-max", type=_positive_int,
                        help=f"with --data: at most this many held out (default {TRAIN_DEFAULTS['dev_max']})")


def build_parser():
    parser = _Parser(prog="transformer", description=__doc__)
    parser.usage_on_error = True
    parser.add_argument("--debug", action="store_true",
                        help="show the Python traceback of a failure (a user's mistake is one line without it)")
    sub = parser.add_subparsers(dest="command", required=True)
    parser.commands = sub.choices

    bench = sub.add_parser("bench", help="benchmark our kernels against numpy/PyTorch")
    bench.add_argument("--what", default="kernels",
                       choices=["kernels", "train", "profile", "decode", "masking", "all", "distributed", "marian",
                                "serve"],
                       help="kernels: every kernel vs PyTorch/numpy; train: a training step (and its "
                            "profile); profile: where a training step's time goes; decode: greedy and "
                            "beam search; masking: parallel masked training vs an autoregressive loop, "
                            "and the leakage without the mask; all: thread scaling of GEMM, training "
                            "and decoding; distributed: the training step data-parallel over MPI ranks x "
                            "threads (every pair of --threads values that fits the cores) against PyTorch DDP; "
                            "marian: a MarianMT model of OPUS-MT's size, decoding against CTranslate2 and "
                            "transformers, fine-tuning against transformers (--config opus or tiny); serve: "
                            "`transformer serve` under 1, 8, 64 and 256 concurrent clients against offline "
                            "translate, itself one sentence at a time, and CTranslate2 behind the same front")
    bench.add_argument("--threads", type=_threads, default=None,
                       help="e.g. 1,2,4 (default: 1, 2, 4, ... up to the cores present)")
    bench.add_argument("--config",
                       help="tiny, base, tiny,base, or custom sizes for train/profile/decode/all: "
                            "d_model=256,n_heads=4,d_ff=1024,layers=3[,vocab=8000,batch=16,length=48] "
                            f"(default {BENCH_DEFAULTS['config']})")
    bench.add_argument("--against", choices=["torch", "none"],
                       help="reference measured in the same run by kernels/train/decode/all (default torch, "
                            "when installed)")
    bench.add_argument("--families",
                       help=f"with --what kernels: kernel families to run (default {BENCH_DEFAULTS['families']})")
    bench.add_argument("--precision", choices=["fp32", "bf16", "int8"],
                       help="train: fp32 (default) or bf16, ours against torch.autocast bf16 and ours fp32; "
                            "decode: fp32, bf16 or int8, ours against CTranslate2 at the same compute type "
                            "and ours fp32; kernels: bf16 or int8 adds GEMM rows at that precision")
    bench.add_argument("--repeats", type=_positive_int,
                       help="train, decode: timed runs of each engine per measurement, alternated, the "
                            "median reported (default per config: train 15 tiny / 3 base, decode 5 / 3); "
                            "more gives steadier ratios on a noisy machine")
    bench.add_argument("--json", metavar="FILE", help="also write the JSON lines to FILE")
    bench.add_argument("--plot", metavar="FILE.png", help="with --what all: draw throughput and efficiency")
    bench.set_defaults(func=_bench)

    train = sub.add_parser("train", help="train a translation model (no --data: the built-in task)")
    _corpus_flags(train, DATA_HELP + "; or a directory of `transformer prepare`. Prepared once into a cache "
                  "($TRANSFORMER_CACHE/prepared) and reused while the files and settings are the same")
    train.add_argument("--src-lang", metavar="CODE", type=_language_code,
                       help="with --data: the source language's code, written beside the model for `serve` "
                            "(default: the source column's header name or file extension, when it is a code)")
    train.add_argument("--tgt-lang", metavar="CODE", type=_language_code, help="the target language's code (as --src-lang)")
    train.add_argument("--out", help="output directory for checkpoints and the model (one that holds another "
                       "run or model is refused without --overwrite)")
    train.add_argument("--overwrite", action="store_true",
                       help="let a new run replace the run or model in --out")
    train.add_argument("--resume", metavar="DIR", help="continue the run whose checkpoint is in DIR")
    train.add_argument("--init-from", dest="init_from", metavar="DIR",
                       help="with --data: fine-tune the model in DIR (a training run's --out, or a MarianMT "
                            "model imported with `transformer convert --from marian`) with its own "
                            "tokenizers; its sizes are the run's")
    train.add_argument("--preset", choices=["tiny", "small", "base"], help="model sizes (default tiny)")
    train.add_argument("--d-model", dest="d_model", type=_positive_int)
    train.add_argument("--n-heads", dest="n_heads", type=_positive_int)
    train.add_argument("--d-ff", dest="d_ff", type=_positive_int)
    train.add_argument("--n-encoder-layers", dest="n_encoder_layers", type=_positive_int)
    train.add_argument("--n-decoder-layers", dest="n_decoder_layers", type=_positive_int)
    train.add_argument("--dropout", type=_fraction,
                       help=f"default with --data: 0 when the budget sees the training pairs fewer than "
                            f"{DROPOUT_FREE_PASSES:g} times, {HEAVY_DROPOUT:g} when it sees them "
                            f"{HEAVY_DROPOUT_PASSES:g} times or more, else 0.1; 0 for the built-in task")
    train.add_argument("--activation", choices=["relu", "gelu", "silu"])
    train.add_argument("--tie-embeddings", dest="tie_embeddings", choices=["none", "target"],
                       help="target: the output projection is the target embedding matrix (one matrix, "
                            "its gradient summed over both uses; default none)")
    train.add_argument("--norm-first", dest="norm_first", action=argparse.BooleanOptionalAction, default=None,
                       help="layer norm before each sublayer (pre-LN; the default with --data) or after it "
                            "(--no-norm-first: the paper's post-LN; the default for the built-in task)")
    train.add_argument("--max-steps", type=_positive_int)
    train.add_argument("--minutes", type=_positive_float, help="wall-clock budget (default 2 built-in, 10 with --data; "
                       "periodic evaluation is not counted; with --resume: what the interrupted run had left)")
    train.add_argument("--threads", type=_positive_int)
    train.add_argument("--batch-tokens", type=_positive_int,
                       help=f"with --data: tokens per batch, padding included (default {TRAIN_DEFAULTS['batch_tokens']})")
    train.add_argument("--batch-size", type=_positive_int,
                       help=f"built-in task: sentences per batch (default {TRAIN_DEFAULTS['batch_size']})")
    train.add_argument("--precision", choices=["fp32", "bf16", "int8"],
                       help="fp32 (default), or bf16 mixed precision: every GEMM of forward and backward "
                            "multiplies bfloat16 operands with float32 sums; weights, gradients, Adam, "
                            "softmax, layer norm and loss stay float32, and checkpoints are the same. "
                            "With --resume: the interrupted run's precision unless given")
    train.add_argument("--schedule", choices=["budget", "noam"],
                       help="learning-rate schedule. budget (default with --data): warm-up over the first "
                            "5%% of the budget (--max-steps, or --minutes divided by a measured step time), "
                            "then linear decay to its end; noam (default for the built-in task): the "
                            "paper's inverse-square-root schedule with --warmup steps")
    train.add_argument("--warmup", type=_positive_int,
                       help="warm-up steps (noam: default 300 built-in, 4000 with --data; budget: 5%% of the budget)")
    train.add_argument("--lr", type=_positive_float, help="peak learning rate of the budget schedule (default 0.032 * d_model^-0.5: 2e-3 for small)")
    train.add_argument("--lr-scale", type=_positive_float,
                       help=f"factor on the learning-rate schedule (default {TRAIN_DEFAULTS['lr_scale']})")
    train.add_argument("--label-smoothing", type=_fraction, help=f"default {TRAIN_DEFAULTS['label_smoothing']}")
    train.add_argument("--clip-norm", type=_non_negative_float,
                       help=f"clip gradients to this global norm (0: off; default {TRAIN_DEFAULTS['clip_norm']})")
    _vocabulary_flags(train)
    train.add_argument("--max-sentence-tokens", type=_positive_int,
                       help="with --data: longer training pairs are skipped; also the model's positions "
                            f"(default {TRAIN_DEFAULTS['max_sentence_tokens']})")
    _split_flags(train)
    train.add_argument("--eval-every", type=_non_negative_int, default=0,
                       help="evaluate every N steps (0: only at the end)")
    train.add_argument("--eval-limit", type=_positive_int,
                       help=f"dev sentences used by periodic evaluation (default {TRAIN_DEFAULTS['eval_limit']})")
    train.add_argument("--save-every", type=_non_negative_int, default=0, help="checkpoint every N steps")
    train.add_argument("--save-minutes", type=_non_negative_float, default=5.0,
                       help="checkpoint every M minutes (default 5)")
    train.add_argument("--average-last", type=_at_least_two, metavar="K",
                       help="snapshot the weights every --snapshot-every steps and make the saved model "
                            "the average of the last K (the checkpoint keeps the raw weights)")
    train.add_argument("--snapshot-every", type=_positive_int, metavar="N",
                       help="with --average-last: steps between snapshots (default 2.5%% of the planned steps)")
    train.add_argument("--keep-best", action="store_true",
                       help="with --eval-every: also keep the model of the best dev loss in OUT/best")
    train.add_argument("--seed", type=_non_negative_int, help=f"default {TRAIN_DEFAULTS['seed']}")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.add_argument("--samples", nargs="*", metavar="TEXT", help="with --data: also translate these at the end")
    train.set_defaults(func=_train)

    prepare = sub.add_parser("prepare", help="read a corpus once into memory-mapped token-id arrays for train --data")
    _corpus_flags(prepare, DATA_HELP)
    prepare.add_argument("--out", required=True, metavar="DIR", help="the prepared directory to write "
                         "(one that holds a prepared corpus is refused without --overwrite)")
    prepare.add_argument("--overwrite", action="store_true", help="replace a prepared corpus already in --out")
    _vocabulary_flags(prepare)
    prepare.add_argument("--tokenizers-from", metavar="MODEL_DIR",
                         help="encode with the tokenizers of this model (to fine-tune it with --init-from) "
                              "instead of learning BPE")
    _split_flags(prepare)
    prepare.add_argument("--quiet", action="store_true", help="no progress bar")
    prepare.set_defaults(func=_prepare)

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
    serve.set_defaults(func=_serve)

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
    translate.add_argument("text", nargs="*")
    translate.set_defaults(func=_translate)

    evaluate = sub.add_parser("evaluate", help="BLEU and chrF on tab-separated pairs")
    evaluate.add_argument("--model", required=True, metavar="DIR")
    evaluate.add_argument("--data", required=True)
    evaluate.add_argument("--src-col", default="0")
    evaluate.add_argument("--tgt-col", default="1")
    evaluate.add_argument("--header", choices=list(HEADER_CHOICES), default="auto", help=HEADER_HELP)
    evaluate.add_argument("--beam", type=_positive_int,
                          help="beam size (1: greedy; default: an imported model's own num_beams, else 4)")
    evaluate.add_argument("--no-repeat-ngram", type=_non_negative_int, default=0, metavar="N",
                          help="never repeat an n-gram of N tokens in an output (0: off)")
    evaluate.add_argument("--limit", type=_positive_int, help="use only the first N pairs")
    evaluate.add_argument("--precision", choices=["fp32", "bf16", "int8"],
                          help=DECODE_PRECISION_HELP)
    evaluate.add_argument("--threads", type=_positive_int)
    evaluate.add_argument("--output", metavar="FILE", help="also write the translations there, one per line, "
                                                            "in the order of the pairs")
    evaluate.set_defaults(func=_evaluate)

    average = sub.add_parser("average", help="average the weights of several model directories of one run")
    average.add_argument("models", nargs="+", metavar="DIR", help="model directories (same config and tokenizers)")
    average.add_argument("--out", required=True, metavar="DIR", help="where to write the averaged model")
    average.add_argument("--overwrite", action="store_true", help="replace a model already in --out")
    average.set_defaults(func=_average)

    quantize = sub.add_parser("quantize", help="write an int8 copy of a model (its weight matrices at a quarter of their size)")
    quantize.add_argument("--model", required=True, metavar="DIR")
    quantize.add_argument("--out", required=True, metavar="DIR", help="where to write the int8 model")
    quantize.add_argument("--overwrite", action="store_true", help="replace a model already in --out")
    quantize.set_defaults(func=_quantize)
    convert = sub.add_parser("convert", help="import a MarianMT (OPUS-MT) model, or export one")
    convert.add_argument("--from", dest="source", nargs=2, metavar=("FORMAT", "HF_DIR"),
                         help="marian HF_DIR: a local MarianMTModel directory (config.json, "
                              "model.safetensors or pytorch_model.bin, source.spm, target.spm, vocab.json)")
    convert.add_argument("--to", nargs=2, metavar=("FORMAT", "DIR"),
                         help="marian DIR: write our model directory DIR as a MarianMTModel directory")
    convert.add_argument("--out", required=True, metavar="DIR", help="the directory to write")
    convert.add_argument("--overwrite", action="store_true", help="replace a model already in --out")
    convert.set_defaults(func=_convert)
    info = sub.add_parser("info", help="print build_info(): compiler, OpenMP, SIMD level, threads")
    info.add_argument("--model", metavar="DIR", help="also the decoding settings of the model in DIR "
                                                     "(an imported model's generation settings)")
    info.set_defaults(func=_info)
    for command in sub.choices.values():         # --debug before or after the command
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the Python traceback of a failure")
    return parser


def main(argv=None):
    """Run one command; its exit status. An expected failure (a missing or damaged file, a wrong
    column, a flag that cannot apply, Ctrl-C) is one line on stderr, `transformer <command>: error:
    ...`; a bug keeps its traceback, and so does everything with --debug."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BaseException as exc:
        if getattr(args, "world", (0, 1))[1] > 1:
            return _fail_under_mpi(args, exc)
        return _fail(args, exc)


def _fail(args, exc):
    if isinstance(exc, KeyboardInterrupt):
        if args.debug:
            raise exc
        print(f"transformer {args.command}: error: interrupted", file=sys.stderr)
        return 130
    if isinstance(exc, BrokenPipeError):         # the reader went away (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    told = describe(exc, args) if isinstance(exc, Exception) else None
    if told is None or args.debug:
        raise exc
    message, status = told
    print(f"transformer {args.command}: error: {message}", file=sys.stderr)
    return status


def _fail_under_mpi(args, exc):
    """Under mpirun. A failure every rank saw (ranks that disagree, replicas that diverged) is told
    once, by rank 0, and every rank exits with it. A rank that fails alone says so and takes the
    others down with MPI_Abort rather than leave them waiting."""
    import traceback

    from .distributed import import_mpi

    rank = args.world[0]
    everywhere = getattr(exc, "everywhere", False)
    if isinstance(exc, KeyboardInterrupt):
        told = ("interrupted", 130)
    elif isinstance(exc, SystemExit):
        told = (None, exc.code if isinstance(exc.code, int) else 1)
    else:
        told = describe(exc, args) if isinstance(exc, Exception) else None
        if told is None or args.debug:
            traceback.print_exception(type(exc), exc, exc.__traceback__)
        if told is None:
            told = (f"{type(exc).__name__}: {exc}", 1)
    message, status = told
    if message and (rank == 0 or not everywhere):
        where = "" if everywhere or message.startswith("rank ") else f"rank {rank}: "
        print(f"transformer {args.command}: error: {where}{message}", file=sys.stderr, flush=True)
    if not everywhere:
        import_mpi().COMM_WORLD.Abort(status or 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
