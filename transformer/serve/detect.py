"""Which served source language a text is in: POST /detect, and source "auto".

py3langid (a maintained fork of langid.py: a naive Bayes model over byte n-grams for 97
languages, the model inside the package, nothing downloaded; 50 us a sentence) restricted to the
languages the server translates from, its probabilities normalised among them. Loading its
model takes about 2 s, so it is loaded once, on first use or in the background when the server
starts with more than one source language. A served language it does not know is never
detected; when it knows none of them, the answer is the first served one at confidence 0
(LibreTranslate's own answer for a text it cannot place is {"confidence": 0.0, "language": "en"}).
"""
import threading

from ..languages import alpha2


class Detector:
    """Identifies a text's language among `languages` (normalised tags)."""

    def __init__(self, languages):
        self.languages = sorted(set(languages))
        self._lock = threading.Lock()
        self._identifier = None
        self._tags = {}                 # the identifier's code -> our tag

    def warm(self):
        """Load the model in the background."""
        threading.Thread(target=self._load, name="transformer-detect-load", daemon=True).start()

    def _load(self):
        with self._lock:
            if self._identifier is None:
                try:
                    from py3langid.langid import MODEL_FILE, LanguageIdentifier
                except ImportError:
                    raise ImportError('language detection needs py3langid: pip install "transformer-cpu[serve]"') \
                        from None
                identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
                known = set(identifier.nb_classes)
                self._tags = {}
                for tag in self.languages:
                    code = alpha2(tag)
                    if code in known and code not in self._tags:
                        self._tags[code] = tag
                if self._tags:
                    identifier.set_languages(sorted(self._tags))
                self._identifier = identifier
            return self._identifier

    def detect(self, text, among=None, top=3):
        """[{"confidence": percent, "language": tag}], best first, at most `top`: the languages of
        `among` (default: all served) that the text may be in, as LibreTranslate answers /detect."""
        identifier = self._load()
        among = set(self.languages if among is None else among)
        ranked = [(self._tags[code], p) for code, p in identifier.rank(text)
                  if code in self._tags and self._tags[code] in among] if self._tags else []
        total = sum(p for _, p in ranked)
        if not ranked or total <= 0:
            return [{"confidence": 0.0, "language": sorted(among)[0]}]
        return [{"confidence": float(round(100.0 * p / total, 1)), "language": tag} for tag, p in ranked[:top]]
