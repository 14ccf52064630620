"""The models a server holds: each loaded once, frozen, with its languages and decoding defaults."""
import numpy as np

from ..data import collate
from ..train import decode_pieces

class ServedModel:
    """One model directory as the server decodes it: its defaults are translate's (an imported
    model's generation settings, else beam 4; the model's own precision and length rule), each
    settable when the server starts."""

    def __init__(self, name, directory, model, src_tokenizer, tgt_tokenizer, source, target, beam=None,
                 precision=None, max_len=None, no_repeat_ngram=0):
        self.name, self.directory = name, directory
        self.model, self.src_tokenizer, self.tgt_tokenizer = model, src_tokenizer, tgt_tokenizer
        self.source, self.target = source, target
        if beam is None:        # translate's default: an imported model's own num_beams (generation.py), else 4
            settings = getattr(model, "generation", None)
            beam = settings.num_beams if settings is not None else 4
        # max_len None: the model's own rule (its imported generation settings, or 2 x source + 10)
        self.defaults = {"beam": beam, "max_len": max_len, "no_repeat_ngram": no_repeat_ngram,
                         "precision": precision or model.stored_precision}

    def options(self, **overrides):
        """The decoding options of a request: the defaults with the request's overrides, as a
        hashable tuple (requests with equal options can share a batch)."""
        chosen = dict(self.defaults)
        chosen.update({key: value for key, value in overrides.items() if value is not None})
        return tuple(sorted(chosen.items()))

    def decode(self, pieces, beam, max_len, no_repeat_ngram, precision, scores=False, attention=False,
               alternatives=0):
        """Translations of source id lists decoded together, as translate_texts decodes a batch;
        with scores or attention, a dict per piece (text, tokens, score, attention) instead; with
        alternatives N, a list per piece of its best translation and up to N others from the beam
        (at least N + 1 wide), best first."""
        if alternatives:
            n_best = alternatives + 1
            _, hyps = decode_pieces(self.model, pieces, max(beam, n_best), max_len, no_repeat_ngram, precision,
                                    n_best=n_best)
            return [[self.tgt_tokenizer.decode(hyp) for hyp in piece] for piece in hyps]
        src, hyps = decode_pieces(self.model, pieces, beam, max_len, no_repeat_ngram, precision)
        return self.outputs(pieces, hyps, precision, scores, attention, src)

    def alternatives_steps(self, pieces, beam, max_len, no_repeat_ngram, precision, alternatives, workspace=None,
                           **_):
        """decode's answer with alternatives, one decoder step at a time: a generator that yields
        after each step and returns what decode returns for the same pieces and options
        (decoding.beam_search_steps: the same steps, the same bits). workspace: the dict its buffers
        live in, the caller's to keep for the next call."""
        from ..decoding import beam_search_steps
        n_best = alternatives + 1
        src = collate([(ids, [], []) for ids in pieces], range(len(pieces)), self.model.cfg.pad_id)[0]
        # the model's generation settings, as Model.beam_search (which decode calls) resolves them
        max_len, rules = self.model._generation_rules(max_len, None, None)
        options = self.model._beam_options(max(beam, n_best), None, None, None)
        hyps = yield from beam_search_steps(self.model, src, max_len=max_len, no_repeat_ngram=no_repeat_ngram,
                                            precision=precision, n_best=n_best, workspace=workspace, **rules,
                                            **options)
        return [[self.tgt_tokenizer.decode(hyp) for hyp in piece] for piece in hyps]

    def outputs(self, pieces, hyps, precision, scores=False, attention=False, src=None):
        """What decode returns for source id lists and their output tokens. src: the pieces
        padded (collate), when the caller has it."""
        texts = [self.tgt_tokenizer.decode(hyp) for hyp in hyps]
        if not (scores or attention):
            return texts
        if src is None:
            src = collate([(ids, [], []) for ids in pieces], range(len(pieces)), self.model.cfg.pad_id)[0]
        return self._details(src, pieces, hyps, texts, scores, attention, precision)

    def _details(self, src, pieces, hyps, texts, scores, attention, precision):
        """The output scored by one teacher-forced pass over it: the log-probability of each output
        token (EOS included when the hypothesis ended with it) and the last decoder layer's
        cross-attention, averaged over heads: [output tokens, source tokens]."""
        cfg = self.model.cfg
        tgt_in = collate([([], [cfg.bos_id] + list(h), []) for h in hyps], range(len(hyps)), cfg.pad_id)[1]
        logits, maps = self.model.forward(src, tgt_in, return_attention=True, precision=precision)
        out = []
        for row, (ids, hyp, text) in enumerate(zip(pieces, hyps, texts)):
            item = {"text": text, "source_tokens": self.src_tokenizer.tokens(ids),
                    "target_tokens": self.tgt_tokenizer.tokens(hyp)}
            if scores:
                row_logits = logits[row, :len(hyp)].astype(np.float64)
                shifted = row_logits - row_logits.max(axis=1, keepdims=True)
                log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
                token_log_probs = log_probs[np.arange(len(hyp)), hyp] if hyp else np.zeros(0)
                item["log_prob"] = round(float(token_log_probs.sum()), 6)
                item["score"] = round(float(token_log_probs.mean()), 6) if hyp else 0.0
            if attention:
                cross = maps["cross"][-1][row].mean(axis=0)          # [T, S]
                item["attention"] = np.round(cross[:len(hyp), :len(ids)].astype(np.float64), 5).tolist()
            out.append(item)
        return out
