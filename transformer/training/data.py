"""From the corpus flags (--data, --src-file/--tgt-file) to the prepared corpus a run batches: the
prepared directory found or made (once, by rank 0), its settings checked against the flags, the
vocabulary size and the languages chosen."""
import os

from .. import datasets
from ..data import HEADER_CHOICES
from ..errors import FlagError, blame
from .flags import corpus_blame, data_specs, flag_name
from .report import say
from .world import one_rank_prepares


def choose_vocab_size(train_pairs):
    """The BPE vocabulary size (per language) for training pairs when --vocab-size is left out
    (config.VOCAB_WORDS_PER_ENTRY; a prepared corpus counts the words as it reads them)."""
    from ..corpus.preparation import vocab_size_for_words

    return vocab_size_for_words(sum(len(s.split()) + len(t.split()) for s, t in train_pairs) / 2)


def prepared_dir(args):
    """The prepared directory that --data names alone, or None."""
    from ..corpus import is_prepared

    specs = data_specs(args.data)
    if len(specs) == 1 and not getattr(args, "src_file", None) and os.path.isdir(specs[0]):
        with blame("--data", specs[0]):
            if not is_prepared(specs[0]):
                raise ValueError(f"{specs[0]}: a directory, and not a prepared corpus (no manifest.json; "
                                 "`transformer prepare --out DIR` writes one)")
        return specs[0]
    return None


# Flags that decide how a corpus is read and prepared: they cannot apply to one already prepared.
CORPUS_READING_FLAGS = ("src_col", "tgt_col", "header", "src_file", "tgt_file", "bpe_sample")


def check_prepared_flags(args, directory):
    """--data DIR (prepared): the flags that decide how a corpus is prepared are refused, or must
    say what DIR was prepared with (FlagError naming the flag)."""
    from ..corpus import read_manifest

    with blame("--data", directory):
        manifest = read_manifest(directory)
    for key in CORPUS_READING_FLAGS:
        if getattr(args, key, None) is not None:
            raise FlagError(f"{flag_name(key)}: --data {directory} is a prepared corpus, read and encoded already "
                            "(the flag applies to `transformer prepare`, or to --data FILE)")
    held = {"dev_fraction": manifest["settings"]["dev_fraction"], "dev_max": manifest["settings"]["dev_max"],
            "vocab_size": manifest.get("bpe", {}).get("vocab_size")}
    for key, value in held.items():
        given = getattr(args, key, None)
        if given is not None and value is not None and given != value:
            raise FlagError(f"{flag_name(key)} {given}: --data {directory} was prepared with {flag_name(key)} {value}")
    return held


def language_code_of(name):
    """The normalised language tag a column header or a file's extension names ("eng" and
    "corpus.en" are "en"), or None (languages.guess_code)."""
    from ..languages import guess_code
    return guess_code(name)


def choose_languages(args, manifest):
    """--src-lang / --tgt-lang, or by default the corpus's own names for its languages: the columns'
    header names (eng, hin) or the aligned files' extensions (corpus.en, corpus.es), when those are
    language codes. Each is its normalised tag (languages.py: eng is en), kept in the run's flags and
    written beside the model (languages.json)."""
    if args.src_lang and args.tgt_lang:
        return
    first = manifest["inputs"][0]
    guess = (None, None)
    if first["kind"] == "tsv":
        columns = manifest["settings"]["inputs"][0]
        guess = (language_code_of(columns["src_col"]), language_code_of(columns["tgt_col"]))
        if first.get("header") is None:
            guess = (None, None)           # no header: the columns are numbers
    elif first["kind"] == "aligned":
        guess = tuple(language_code_of(path) for path in first["path"].split(",", 1))
    args.src_lang = args.src_lang or guess[0]
    args.tgt_lang = args.tgt_lang or guess[1]
    if args.src_lang and args.tgt_lang:
        say(f"languages: {args.src_lang} -> {args.tgt_lang} (written beside the model for `transformer serve`; "
             "--src-lang / --tgt-lang to choose)")


def open_corpus(args, tokenizers=None):
    """The PreparedCorpus the run trains on: --data DIR as it is, or --data FILE... (and
    --src-file/--tgt-file) prepared into the cache or found there. tokenizers: {"src", "tgt"} the
    run must encode with (a resumed run's, or the --init-from model's); None: BPE is learned."""
    from ..corpus import PreparedCorpus, find_or_prepare, make_inputs
    from ..corpus.preparation import tokenizers_digest

    directory = prepared_dir(args)
    if directory is not None:
        def prepare():
            with blame("--data", directory):
                return PreparedCorpus(directory)
        corpus = one_rank_prepares(args, prepare, lambda path: PreparedCorpus(path, verify=False))
        settings = corpus.manifest["settings"]
        for key in ("dev_fraction", "dev_max"):
            if getattr(args, key) != settings[key]:
                raise FlagError(f"--data {directory}: prepared with {flag_name(key)} {settings[key]}, and the run in "
                                f"{args.resume} has {getattr(args, key)}")
        if tokenizers is not None and corpus.manifest["tokenizers_sha256"] != tokenizers_digest(tokenizers):
            whose = f"the run in {args.resume}" if args.checkpoint is not None else f"the model in {args.init_from}"
            raise FlagError(f"--data {directory}: encoded with other vocabularies than {whose}'s (prepare it "
                            f"with `transformer prepare --tokenizers-from MODEL_DIR`, or give the corpus's files)")
        return corpus

    with corpus_blame(args):
        specs = [datasets.resolve(spec) if datasets.is_shortcut(spec) else spec for spec in data_specs(args.data)]
        if specs != data_specs(args.data):
            args.data = specs
        inputs = make_inputs(specs, args.src_col, args.tgt_col, HEADER_CHOICES[args.header],
                             getattr(args, "src_file", None), getattr(args, "tgt_file", None))

    def prepare():
        with corpus_blame(args):
            return find_or_prepare(inputs, dev_fraction=args.dev_fraction, dev_max=args.dev_max,
                                   vocab_size=args.vocab_size if tokenizers is None else None,
                                   bpe_sample=args.bpe_sample, tokenizers=tokenizers,
                                   progress=not args.quiet, log=say)
    return one_rank_prepares(args, prepare, lambda path: PreparedCorpus(path, verify=False))
