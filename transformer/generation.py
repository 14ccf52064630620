"""A model's own decoding settings: what `transformers`' generate() reads from a MarianMT
directory, kept with the model when it is imported, used as the defaults of its decoding, and
written back on export.

Where they come from (as transformers 5 reads them, transformers/generation/utils.py,
adjust_generation_fn): generation_config.json when the directory has one, and then only it (a
field it lacks takes generate's default, not config.json's); otherwise the generation fields of
config.json. Fields set to null count as absent.

What they mean here (csrc/decoder.h runs the rules inside the decoding loops):
- num_beams: the default beam (1: greedy);
- max_length (it counts the decoder's start token, so max_length L allows L - 1 new tokens) or
  max_new_tokens (which wins): the default length limit, as decoding's max_len counts tokens (EOS
  included); neither: generate's default max_length 20, capped by the model's positions;
- forced_eos_token_id: the last allowed token is EOS (greedy and beam);
- bad_words_ids of one token each: those tokens are never chosen (pad and the start token never
  are anyway); bad_words_ids equal to [eos] are dropped, as generate drops them;
- renormalize_logits: beam search normalises each row again after the bans, which moves the
  scores it ranks by (greedy's choice cannot change: a row's order stays);
- length_penalty and early_stopping: generate's beam search (score / len ** length_penalty, and
  its stopping rule), whose defaults 1.0 and False then hold.

Refused on import, naming the field: anything that changes generate's output and that these
rules do not implement (sampling, bad_words_ids of several tokens, repetition penalties, a
minimum length, n-gram bans, ...). Accepted and without effect: fields at generate's own no-op
values, the sampling knobs (temperature, top_k, top_p, ...: generate ignores them without
do_sample), and bookkeeping (output_*, use_cache, transformers_version, ...), which OPUS-MT's
files carry. The models trained here have no settings (None): their decoding is unchanged.
"""
import json
import os
import reprlib

__all__ = ["GenerationSettings", "read_marian_generation", "GENERATION_FILE"]

GENERATION_FILE = "generation.json"      # in our model directory, beside config.json

# generate's defaults for what the rules read (GenerationConfig._get_default_generation_params)
DEFAULT_MAX_LENGTH = 20
_DEFAULTS = {"num_beams": 1, "length_penalty": 1.0, "early_stopping": False, "renormalize_logits": False}

# Fields with no effect on a greedy or beam search's tokens whatever their value.
_BOOKKEEPING = {
    "transformers_version", "_from_model_config", "use_cache", "output_attentions", "output_hidden_states",
    "output_scores", "output_logits", "return_dict_in_generate", "cache_implementation", "cache_config",
    "compile_config", "disable_compile", "max_cache_len", "prefill_chunk_size", "is_assistant",
    "num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold",
    "assistant_lookbehind", "target_lookbehind", "assistant_early_exit", "prompt_lookup_num_tokens",
    "max_matching_ngram_size", "continuous_batching_config", "bos_token_id"}
# Sampling's knobs: generate reads them only with do_sample (refused when true).
_SAMPLING = {"temperature", "top_k", "top_p", "typical_p", "min_p", "top_h", "epsilon_cutoff", "eta_cutoff"}
# Fields accepted only at the value that makes them do nothing (generate's default, or null).
_NO_OP = {
    "do_sample": False, "num_beam_groups": 1, "diversity_penalty": 0.0, "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0,
    "min_length": 0, "min_new_tokens": 0, "num_return_sequences": 1, "remove_invalid_values": False,
    "forced_bos_token_id": None, "exponential_decay_length_penalty": None, "suppress_tokens": None,
    "begin_suppress_tokens": None, "sequence_bias": None, "guidance_scale": 1.0, "constraints": None,
    "force_words_ids": None, "max_time": None, "stop_strings": None, "watermarking_config": None,
    "penalty_alpha": None, "dola_layers": None, "low_memory": None, "token_healing": False,
    "assistant_ensemble_weight": None, "speculation_type": None, "use_mtp": False,
    "forced_decoder_ids": None}
# What the rules implement.
_IMPLEMENTED = {"num_beams", "max_length", "max_new_tokens", "forced_eos_token_id", "bad_words_ids",
                "renormalize_logits", "length_penalty", "early_stopping", "eos_token_id", "pad_token_id",
                "decoder_start_token_id"}
# Every field of transformers' GenerationConfig: which of config.json's fields are generation settings.
GENERATION_FIELDS = _BOOKKEEPING | _SAMPLING | set(_NO_OP) | _IMPLEMENTED


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


class GenerationSettings:
    """The generation settings a model was imported with: `values` {field: value} (only those the
    files set), `origin` {field: the file it came from}. Built by read_marian_generation or
    from_json, which check every field; immutable in use."""

    def __init__(self, values, origin):
        self.values = dict(values)
        self.origin = dict(origin)

    def __eq__(self, other):
        return isinstance(other, GenerationSettings) and self.values == other.values

    def __repr__(self):
        return f"GenerationSettings({self.values!r})"

    # -- what decoding reads ------------------------------------------------------------------

    def _get(self, name):
        return self.values.get(name, _DEFAULTS.get(name))

    @property
    def num_beams(self):
        return self._get("num_beams")

    @property
    def length_penalty(self):
        return float(self._get("length_penalty"))

    @property
    def early_stopping(self):
        return self._get("early_stopping")

    @property
    def renormalize(self):
        return bool(self._get("renormalize_logits"))

    @property
    def forced_eos(self):
        return self.values.get("forced_eos_token_id") is not None

    @property
    def banned(self):
        """The tokens bad_words_ids bans (each a one-token entry), in order, without repeats."""
        out = []
        for entry in self.values.get("bad_words_ids") or []:
            if entry[0] not in out:
                out.append(entry[0])
        return tuple(out)

    def max_new_tokens(self, positions):
        """The default limit in new tokens (EOS counted) for a model of `positions` positions:
        max_new_tokens, else max_length - 1 (generate counts the start token), else generate's
        default max_length 20 capped by the positions; never more than the positions."""
        if self.values.get("max_new_tokens") is not None:
            limit = self.values["max_new_tokens"]
        elif self.values.get("max_length") is not None:
            limit = self.values["max_length"] - 1
        else:
            limit = min(DEFAULT_MAX_LENGTH + 1, positions) - 1
        return max(1, min(limit, positions))

    # -- saying what is in force ---------------------------------------------------------------

    def describe(self, positions):
        """One line per setting decoding uses: `name=value (where it came from)`."""
        def origin(name):
            return self.origin.get(name, "transformers' default")
        if self.values.get("max_new_tokens") is not None:
            limit = f"max_new_tokens={self.values['max_new_tokens']}, {origin('max_new_tokens')}"
        elif self.values.get("max_length") is not None:
            limit = f"max_length={self.values['max_length']} less the start token, {origin('max_length')}"
        else:
            limit = f"transformers' default max_length={DEFAULT_MAX_LENGTH} less the start token"
        lines = [f"num_beams={self.num_beams} ({origin('num_beams')})",
                 f"max_new_tokens={self.max_new_tokens(positions)} ({limit}; within the model's {positions} positions)",
                 f"forced_eos_token_id={self.values.get('forced_eos_token_id')} ({origin('forced_eos_token_id')})",
                 f"bad_words_ids={[[t] for t in self.banned]} ({origin('bad_words_ids')})",
                 f"renormalize_logits={self.renormalize} ({origin('renormalize_logits')})",
                 f"length_penalty={self.length_penalty} ({origin('length_penalty')})",
                 f"early_stopping={self.early_stopping} ({origin('early_stopping')})"]
        return lines

    # -- our model directory and the way back out ----------------------------------------------

    def to_json(self):
        return {"format": "transformers generation settings", "values": self.values, "from": self.origin}

    @classmethod
    def from_json(cls, obj, cfg, source=GENERATION_FILE):
        if not isinstance(obj, dict) or obj.get("format") != "transformers generation settings" \
                or not isinstance(obj.get("values"), dict) or not isinstance(obj.get("from", {}), dict):
            raise ValueError(f"{source}: not a generation settings file of this engine")
        values = _check(obj["values"], cfg, source)
        origin = {k: str(v) for k, v in obj.get("from", {}).items() if k in values}
        return cls(values, origin)

    def to_generation_config(self, cfg):
        """generation_config.json for an export: the settings as imported (so transformers reads
        the same ones), with the model's token ids."""
        out = {k: v for k, v in self.values.items() if k in _IMPLEMENTED}
        out.update(decoder_start_token_id=cfg.bos_id, eos_token_id=cfg.eos_id, pad_token_id=cfg.pad_id)
        if out.get("forced_eos_token_id") is not None:
            out["forced_eos_token_id"] = cfg.eos_id
        return out


def _check(raw, cfg, source):
    """The settings of `raw` that decoding reads, checked; ValueError naming a field whose value
    is malformed, or that asks for what this engine does not implement."""
    values = {}

    def refuse(name, why):
        raise ValueError(f"{source}: generation setting {name}={reprlib.repr(raw[name])} {why}")

    def token(name, value):
        """A token id, or a list holding one (generate accepts both)."""
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if not _is_int(value):
            refuse(name, "is not a token id (a list of several is not implemented here)")
        return value

    for name, value in raw.items():
        if value is None:
            continue
        if name in _BOOKKEEPING or name in _SAMPLING:
            continue
        if name in _NO_OP:
            if value == _NO_OP[name]:
                continue
            refuse(name, "changes what generate outputs and is not implemented here")
        if name not in _IMPLEMENTED:
            refuse(name, "is not a generation setting this engine knows")
        if name in ("num_beams", "max_length", "max_new_tokens"):
            if not _is_int(value) or value < (2 if name == "max_length" else 1):
                refuse(name, f"must be an integer >= {2 if name == 'max_length' else 1}")
            values[name] = value
        elif name in ("eos_token_id", "pad_token_id", "decoder_start_token_id", "forced_eos_token_id"):
            value = token(name, value)
            mine = {"eos_token_id": cfg.eos_id, "forced_eos_token_id": cfg.eos_id, "pad_token_id": cfg.pad_id,
                    "decoder_start_token_id": cfg.bos_id}[name]
            if value != mine:
                refuse(name, f"differs from the model's ({mine}); only the model's own token is implemented")
            values[name] = value
        elif name == "bad_words_ids":
            if not isinstance(value, list) or not all(isinstance(e, list) and e and all(_is_int(t) for t in e)
                                                      for e in value):
                refuse(name, "must be a list of lists of token ids")
            for entry in value:
                if len(entry) > 1:
                    raise ValueError(f"{source}: generation setting bad_words_ids entry {entry} bans a sequence "
                                     "of several tokens, which is not implemented here (only single tokens)")
                if not 0 <= entry[0] < cfg.tgt_vocab_size:
                    refuse(name, f"holds token {entry[0]}, outside the vocabulary [0, {cfg.tgt_vocab_size})")
            # generate drops the entries equal to EOS (NoBadWordsLogitsProcessor)
            values[name] = [list(e) for e in value if e != [cfg.eos_id]]
        elif name == "renormalize_logits":
            if not isinstance(value, bool):
                refuse(name, "must be true or false")
            values[name] = value
        elif name == "length_penalty":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
                    or value in (float("inf"), float("-inf")):
                refuse(name, "must be a finite number")
            values[name] = float(value)
        elif name == "early_stopping":
            if value not in (True, False, "never") or not isinstance(value, (bool, str)):
                refuse(name, "must be true, false or \"never\"")
            values[name] = value
    return values


def read_marian_generation(hf_dir, hf_config, cfg):
    """The GenerationSettings of a MarianMT directory (module docstring: generation_config.json
    when present, else config.json's generation fields), checked against the model's config cfg."""
    path = os.path.join(hf_dir, "generation_config.json")
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a valid generation config ({exc})") from None
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: not a generation config: a JSON object is expected")
        source, name = path, "generation_config.json"
    else:
        raw = {k: v for k, v in hf_config.items() if k in GENERATION_FIELDS}
        source, name = os.path.join(hf_dir, "config.json"), "config.json"
    values = _check(raw, cfg, source)
    return GenerationSettings(values, {k: name for k in values})
