"""Text in, text out: a text cut into pieces that fit the model's positions, the pieces decoded in
batches of similar length, the translations joined and scored (BLEU, chrF). What `translate`,
`evaluate`, the trainer's evaluation and the server share."""
from .data import collate


def score_translations(hyps, refs, signatures=False):
    """Corpus BLEU and chrF of hyps against one reference each (sacrebleu's defaults); with
    signatures, also sacrebleu's signature of each (tokenizer, smoothing, version: what makes a
    figure comparable with another) under "signature"."""
    from sacrebleu.metrics import BLEU, CHRF

    metrics = {"bleu": BLEU(), "chrf": CHRF()}
    scores = {name: metric.corpus_score(hyps, [refs]).score for name, metric in metrics.items()}
    if signatures:
        scores["signature"] = {name: str(metric.get_signature()) for name, metric in metrics.items()}
    return scores


SENTENCE_ENDS = tuple(".!?\u0964\u3002\u061f")       # . ! ? and the danda, ideographic full stop, Arabic ?
CLAUSE_ENDS = tuple(",;:\u060c\u3001")
CLOSERS = "\u2581 \"')]}\u00bb\u201d\u2019"          # the word-start mark, closing quotes and brackets


def split_to_fit(ids, limit, tokenizer=None):
    """`ids` cut into pieces of at most `limit` ids, each cut after the last sentence punctuation
    that fits, else after the last clause punctuation, else before the last word start (with a
    tokenizer to read the subwords), else at `limit`. No ids, no pieces."""
    ids = list(ids)
    if len(ids) <= limit:
        return [ids] if ids else []
    tokens = tokenizer.tokens(ids) if hasattr(tokenizer, "tokens") else None
    pieces, start = [], 0
    while len(ids) - start > limit:
        cut = start + limit
        if tokens is not None:
            tests = (lambda c: tokens[c - 1].rstrip(CLOSERS).endswith(SENTENCE_ENDS),
                     lambda c: tokens[c - 1].rstrip(CLOSERS).endswith(CLAUSE_ENDS),
                     lambda c: tokens[c].startswith("\u2581") or tokens[c - 1].isspace())
            for test in tests:
                found = next((c for c in range(start + limit, start, -1) if test(c)), None)
                if found is not None:
                    cut = found
                    break
        pieces.append(ids[start:cut])
        start = cut
    pieces.append(ids[start:])
    return pieces


def text_pieces(model, src_tokenizer, text):
    """A text's source ids in the pieces that fit the model's positions (split_to_fit); none for a
    blank text. What translate_texts and the server (serve/scheduler.py) decode."""
    ids = src_tokenizer.encode(text) if text.strip() else []
    return split_to_fit(ids, model.cfg.max_len, src_tokenizer)


def decode_pieces(model, pieces, beam, max_len, no_repeat_ngram, precision, n_best=1):
    """(padded src, hypotheses) of source id lists decoded together: beam search for beam > 1,
    else greedy; max_len None: the model's own limit per sentence, relative to its source length.
    n_best > 1 (beam search): each piece's list of its best hypotheses, best first."""
    src = collate([(ids, [], []) for ids in pieces], range(len(pieces)), model.cfg.pad_id)[0]
    if beam > 1:
        return src, model.beam_search(src, beam_size=beam, max_len=max_len, no_repeat_ngram=no_repeat_ngram,
                                      precision=precision, n_best=n_best)
    return src, model.greedy_decode(src, max_len=max_len, no_repeat_ngram=no_repeat_ngram, precision=precision)


def translate_texts(model, src_tokenizer, tgt_tokenizer, texts, beam=1, max_len=None, batch_size=64,
                    on_split=None, no_repeat_ngram=0, precision="fp32"):
    """Translate a list of strings, batching sentences of similar length; results in input order.

    An empty or blank text translates to "". A text of more subwords than the model has positions
    (cfg.max_len) is translated in pieces that fit (split_to_fit), joined by spaces, and
    on_split(index, subwords, pieces) is called for it. A batch holds batch_size sentences, fewer
    with more than 4 beams: at most batch_size * 4 decoder rows (sentences x beams), so that a
    wide beam does not multiply the caches' memory."""
    if beam > 4:
        batch_size = max(1, batch_size * 4 // beam)
    encoded, owner = [], []         # the pieces to translate, and the index of the text of each
    for index, text in enumerate(texts):
        pieces = text_pieces(model, src_tokenizer, text)
        if len(pieces) > 1 and on_split is not None:
            on_split(index, sum(map(len, pieces)), len(pieces))
        encoded += pieces
        owner += [index] * len(pieces)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    results = [None] * len(encoded)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        _, hyps = decode_pieces(model, [encoded[i] for i in chunk], beam, max_len, no_repeat_ngram, precision)
        for i, hyp in zip(chunk, hyps):
            results[i] = tgt_tokenizer.decode(hyp)
    joined = [[] for _ in texts]
    for index, result in zip(owner, results):
        joined[index].append(result)
    return [" ".join(parts) for parts in joined]
