"""Which served model answers a request's source and target: each language under any of its
standard names (languages.py), "auto" by detection (detect.py), and the errors LibreTranslate gives
("xx is not supported", "Spanish (es) is not available as a target language from English (en)")."""
from ..languages import english_name, match
from .fields import BadRequest, MAX_CODE, language_of, shown


class Pairs:
    """The served models by language pair. models: {name: ServedModel}; detector: a Detector of
    their source languages."""

    def __init__(self, models, detector):
        self.models, self.detector = models, detector
        self.by_pair = {(m.source, m.target): name for name, m in models.items()}
        self.targets = {}
        for m in models.values():
            self.targets.setdefault(m.source, set()).add(m.target)
        self.targets = {source: tuple(sorted(t)) for source, t in self.targets.items()}
        self.languages = sorted(set(self.targets) | {m.target for m in models.values()})
        self._named = {}                # (source, target) as asked -> model name

    def listing(self):
        """GET /languages as LibreTranslate lists them: every language served, from or to, with its
        English name and the languages it translates to (none for a target only)."""
        return [{"code": code, "name": english_name(code), "targets": list(self.targets.get(code, ()))}
                for code in self.languages]

    def _source(self, source):
        tag = match(source, self.targets)
        if tag is None:
            raise BadRequest(f"{source} is not supported (this server translates from "
                             f"{', '.join(sorted(self.targets))})")
        return tag

    def _target(self, source_tag, target):
        tag = match(target, self.targets[source_tag])
        if tag is None:
            known = match(target, self.languages)
            if known is None:
                raise BadRequest(f"{target} is not supported (this server translates to "
                                 f"{', '.join(sorted({m.target for m in self.models.values()}))})")
            raise BadRequest(f"{english_name(known)} ({known}) is not available as a target language from "
                             f"{english_name(source_tag)} ({source_tag})")
        return tag

    def sources_to(self, target):
        """The served sources with a model to `target` (any of its names)."""
        return [source for source, targets in sorted(self.targets.items()) if match(target, targets) is not None]

    def route(self, fields, texts, detect):
        """[(model name, detected)] for each text: detected is LibreTranslate's detectedLanguage
        ({"confidence", "language"}) for source "auto", else None. detect(text, among) ranks a
        text's language (Detector.detect)."""
        name = fields.get("model")
        if name is not None:
            if not isinstance(name, str) or len(name) > MAX_CODE:
                raise BadRequest(f"model must be the name of a served model, got {shown(name)}")
            if name not in self.models:
                raise BadRequest(f"model {shown(name)} is not served (served: {', '.join(self.models)})")
            return [(name, None)] * len(texts)
        source, target = language_of(fields, "source"), language_of(fields, "target")
        if source != "auto":
            name = self._named.get((source, target))
            if name is None:            # resolved once for each spelling a client uses
                source_tag = self._source(source)
                name = self.by_pair[(source_tag, self._target(source_tag, target))]
                if len(self._named) < 4096:
                    self._named[(source, target)] = name
            return [(name, None)] * len(texts)
        candidates = self.sources_to(target)
        if not candidates:
            raise BadRequest(f"{target} is not supported (this server translates to "
                             f"{', '.join(sorted({m.target for m in self.models.values()}))})")
        routes = []
        for text in texts:
            if len(candidates) == 1:        # nothing to tell apart: LibreTranslate's answer for a given source
                found = {"confidence": 100.0, "language": candidates[0]}
            else:
                found = detect(text, candidates)[0]
            routes.append((self.by_pair[(found["language"], match(target, self.targets[found["language"]]))], found))
        return routes
