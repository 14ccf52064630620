"""Language codes: every standard name of a language (ISO 639-1, 639-2/B and /T, 639-3, BCP-47
tags with a region or script) to one normalised tag, and back to what a client asks for.

The normalised tag is BCP-47's shortest form (langcodes' standardize_tag): "eng", "en" and "EN"
are "en"; "ger" and "deu" are "de"; "pt-BR" stays "pt-BR"; a language without a two-letter code
keeps its three letters ("yue"). What `train` writes to languages.json, what the server serves,
and what LibreTranslate's clients send (two letters, or "zh-Hans", "pt-BR"). The tables are
langcodes' (IANA's registry and ISO 639), not ours; English names come from language_data.
"""
import functools
import re

# The shape of a code (not a name such as "English"): a two- or three-letter language, then
# subtags for a script, region or variant ("en", "spa", "pt-BR", "zh-Hans", "es-419").
_SHAPE = re.compile(r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{1,8})*$")
# Two- and three-letter names that columns and files take and that are not meant as languages
# there, though some are codes (src is Logudorese Sardinian, tsv Tsogo): guessed names only.
NOT_LANGUAGES = {"src", "tgt", "ref", "id", "idx", "key", "url", "txt", "tsv", "raw", "out", "inp", "gz", "sgm",
                 "xml", "csv", "json", "tok", "bpe", "spm", "dev", "tst", "all", "new", "old", "hyp"}
# How close a served tag must be to the asked one to answer for it (langcodes' tag_distance: 0 for
# "pt-BR" to a "pt" model or "zh-Hans" to "zh", 5 between regions, 54 between Chinese scripts).
MATCH_DISTANCE = 10


def _langcodes():
    try:
        import langcodes
    except ImportError:
        raise ImportError("language codes need langcodes: pip install langcodes") from None
    return langcodes


@functools.lru_cache(maxsize=4096)
def normalise(code):
    """The normalised tag of a language code, or None when `code` names no language."""
    if not isinstance(code, str) or not _SHAPE.match(code):
        return None
    langcodes = _langcodes()
    try:
        tag = langcodes.standardize_tag(code.replace("_", "-"))
        language = langcodes.Language.get(tag)
    except (ValueError, LookupError):
        return None
    if not language.language or language.language in ("und", "zxx", "mul", "mis") or not language.is_valid():
        return None
    return tag


def is_language_code(text):
    """Whether `text` is a standard code of a language ("en", "spa", "ger", "pt-BR", "zh-Hans")."""
    return normalise(text) is not None


def guess_code(name):
    """The normalised tag a column header or a file's extension names ("eng", "corpus.es"), or
    None: a guess, so the names files and columns usually take (src, tgt, ref...) are not taken."""
    name = str(name)
    if "." in name:
        stem = name[:-3] if name.endswith(".gz") else name
        name = stem.rsplit(".", 1)[1] if "." in stem else stem
    if name.split("-")[0].split("_")[0].lower() in NOT_LANGUAGES:
        return None
    return normalise(name)


def english_name(code):
    """LibreTranslate's `name` of a language: its English name ("Portuguese (Brazil)"), from
    language_data; the code itself without it."""
    try:
        return _langcodes().Language.get(code).display_name("en")
    except (ImportError, LookupError, ValueError):
        return code


@functools.lru_cache(maxsize=4096)
def _best(asked, served):
    """The served tag (of the tuple `served`) closest to the normalised `asked`, or None."""
    if asked in served:
        return asked
    langcodes = _langcodes()
    best, distance = None, MATCH_DISTANCE + 1
    for tag in served:
        d = langcodes.tag_distance(asked, tag)
        if d < distance:
            best, distance = tag, d
    return best


def match(asked, served):
    """The tag among `served` (normalised tags) that answers for the code `asked` in any of its
    standard names ("en", "eng", "en-US"; "pt-BR" to a "pt" model), or None."""
    tag = normalise(asked)
    return None if tag is None else _best(tag, tuple(sorted(served)))


@functools.lru_cache(maxsize=1024)
def alpha2(code):
    """The ISO 639-1 two-letter language of a tag where it has one ("pt-BR" -> "pt"), else its
    three letters: what identifiers (py3langid, sentence splitters) take."""
    return _langcodes().Language.get(code).language
