"""Training checkpoints: one file, written atomically, verified when read.

`DIR/checkpoint.safetensors` holds the weights, Adam's moments and, as metadata,
everything else a resumed run needs (config, step and data position, the dropout
stream's counter, the optimizer's step, the run's arguments, both tokenizers),
plus a SHA-256 of the tensor data. It is written to a temporary file, fsync'ed
and renamed (serialization.save_file), so an interruption at any moment leaves
the previous checkpoint whole; a truncated, corrupted or foreign file raises
ValueError. No pickle anywhere.

Beside it, `config.json`, `model.safetensors` and the two tokenizer files are
what `transformer translate --model DIR` reads.
"""
import hashlib
import json
import math
import os
import reprlib
import shutil
from dataclasses import dataclass

import numpy as np

from .config import ModelConfig
from .model import Seq2SeqTransformer
from .optim import Adam
from .serialization import atomic_write_bytes, load_file, read_metadata, remove_stale_temporaries, save_file
from .tokenizer import SentencePieceTokenizer, load_tokenizer, tokenizer_from_json

CHECKPOINT_FILE = "checkpoint.safetensors"
SRC_TOKENIZER_FILE = "src_tokenizer.json"
LANGUAGES_FILE = "languages.json"     # {"source": code, "target": code}: what `serve` translates
TGT_TOKENIZER_FILE = "tgt_tokenizer.json"
FORMAT = "transformer-cpu/checkpoint"
VERSION = 1


# The fields of training.loop.TrainState with the JSON types each may have (a test keeps the two in step).
# The SHA-256 covers the tensors only, so the metadata is checked here, before the trainer rebuilds
# the state from it. "schedule" came later: checkpoints written before it lack it (None: planned).
TRAIN_STATE_FIELDS = {"step": int, "epoch": int, "batch_in_epoch": int, "tokens": int,
                      "seconds": (int, float), "best_dev_loss": (int, float), "schedule": (dict, type(None))}
_OPTIONAL_FIELDS = ("schedule",)
# The entries each learning-rate plan of training.schedule.plan needs; all but "name" numbers.
_PLAN_ENTRIES = {"noam": ("warmup", "peak"), "budget": ("warmup", "total", "peak", "final")}


@dataclass
class Checkpoint:
    model: Seq2SeqTransformer
    optimizer: Adam
    train_state: dict
    args: dict
    src_tokenizer: object
    tgt_tokenizer: object


def _digest(tensors):
    h = hashlib.sha256()
    for name, arr in tensors.items():
        h.update(name.encode("utf-8"))
        h.update(memoryview(arr.reshape(-1)).cast("B") if arr.size else b"")
    return h.hexdigest()


def save_checkpoint(directory, model, optimizer, train_state, src_tokenizer, tgt_tokenizer, args):
    """Write DIR/checkpoint.safetensors atomically (and clear what killed earlier writes left)."""
    os.makedirs(directory, exist_ok=True)
    remove_stale_temporaries(directory)
    opt = optimizer.state_dict()
    tensors = {f"model/{name}": view for name, view in model.params.data.items()}
    tensors["optimizer/exp_avg"] = opt["exp_avg"]
    tensors["optimizer/exp_avg_sq"] = opt["exp_avg_sq"]
    optimizer_meta = {k: v for k, v in opt.items() if k not in ("exp_avg", "exp_avg_sq")}
    metadata = {
        "format": FORMAT,
        "version": str(VERSION),
        "config": json.dumps(model.cfg.to_dict(), sort_keys=True),
        "model_seed": str(model.seed),
        "dropout_calls": str(model.stream.calls),
        "optimizer": json.dumps(optimizer_meta),
        "train_state": json.dumps(train_state),
        "args": json.dumps(args, default=str),
        "src_tokenizer": src_tokenizer.to_json(),
        "tgt_tokenizer": tgt_tokenizer.to_json(),
        "sha256": _digest(tensors),
    }
    save_file(tensors, os.path.join(directory, CHECKPOINT_FILE), metadata=metadata)


def load_checkpoint(directory):
    """Everything save_checkpoint wrote, verified; ValueError naming the file on any damage."""
    path = os.path.join(directory, CHECKPOINT_FILE) if os.path.isdir(directory) else directory
    if not os.path.exists(path):
        raise FileNotFoundError(f"no checkpoint at {path}")
    metadata = read_metadata(path)
    if metadata.get("format") != FORMAT:
        raise ValueError(f"{path}: not a transformer-cpu training checkpoint")
    if metadata.get("version") != str(VERSION):
        raise ValueError(f"{path}: checkpoint version {metadata.get('version')!r} is not supported "
                         f"(this release reads version {VERSION})")
    tensors = load_file(path)
    if _digest(tensors) != metadata.get("sha256"):
        raise ValueError(f"{path}: checksum mismatch: the checkpoint is corrupted")
    try:
        cfg = ModelConfig.from_dict(json.loads(metadata["config"]))
        model = Seq2SeqTransformer(cfg, seed=int(metadata["model_seed"]))
        model.load_state_dict({name[len("model/"):]: arr for name, arr in tensors.items()
                               if name.startswith("model/")})
        model.stream.calls = int(metadata["dropout_calls"])
        optimizer_meta = json.loads(metadata["optimizer"])
        optimizer = Adam(model)
        optimizer.load_state_dict({**optimizer_meta, "exp_avg": tensors["optimizer/exp_avg"],
                                   "exp_avg_sq": tensors["optimizer/exp_avg_sq"]})
        train_state = json.loads(metadata["train_state"])
        args = json.loads(metadata["args"])
        src_tokenizer = tokenizer_from_json(metadata["src_tokenizer"], source=path)
        tgt_tokenizer = tokenizer_from_json(metadata["tgt_tokenizer"], source=path)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: damaged checkpoint ({exc})") from None
    _check_train_state(train_state, path)
    if not isinstance(args, dict):
        raise ValueError(f"{path}: damaged args metadata: a JSON object is expected, got "
                         f"{type(args).__name__}")
    return Checkpoint(model, optimizer, train_state, args, src_tokenizer, tgt_tokenizer)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_train_state(state, path):
    """ValueError naming the file unless `state` has the shape TrainState(**state) and the
    trainer need: the known fields only, each of its type, counts >= 0, a plan it can follow."""
    def bad(why):
        return ValueError(f"{path}: damaged train_state metadata: {why}")

    if not isinstance(state, dict):
        raise bad(f"a JSON object is expected, got {type(state).__name__}")
    unknown = sorted(k for k in state if k not in TRAIN_STATE_FIELDS)
    missing = [k for k in TRAIN_STATE_FIELDS if k not in state and k not in _OPTIONAL_FIELDS]
    if unknown or missing:
        raise bad(f"unknown fields {unknown}" if unknown else f"missing fields {missing}")
    for key, value in state.items():
        kinds = TRAIN_STATE_FIELDS[key]
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise bad(f"{key} is {reprlib.repr(value)}")
        if kinds is int and value < 0:
            raise bad(f"{key} is {value}, a count below 0")
    if not (math.isfinite(state["seconds"]) and state["seconds"] >= 0):
        raise bad(f"seconds is {state['seconds']}")
    plan = state.get("schedule")
    if plan is not None:
        name = plan.get("name")
        needs = _PLAN_ENTRIES.get(name) if isinstance(name, str) else None
        if needs is None or any(k not in plan for k in needs) \
                or not all(_is_number(v) for k, v in plan.items() if k != "name") \
                or not (isinstance(plan.get("curriculum", 1), int) and plan.get("curriculum", 1) >= 1):
            raise bad(f"schedule is {reprlib.repr(plan)}")


def save_inference_files(directory, model, src_tokenizer, tgt_tokenizer, precision="fp32", languages=None):
    """config.json + model.safetensors + the tokenizers: what `translate --model DIR` loads.
    precision "int8": the weight matrices stored quantized (Seq2SeqTransformer.save).
    languages: (source, target) codes, written to languages.json (what `serve` answers for)."""
    model.save(directory, precision=precision)
    src_tokenizer.save(os.path.join(directory, SRC_TOKENIZER_FILE))
    tgt_tokenizer.save(os.path.join(directory, TGT_TOKENIZER_FILE))
    if languages is not None:
        write_languages(directory, *languages)


def write_languages(directory, source, target):
    """languages.json: the model's source and target languages, each as its normalised tag
    (languages.py: "eng" is written "en")."""
    from .languages import normalise

    source, target = (normalise(code) or code for code in (source, target))
    atomic_write_bytes(os.path.join(directory, LANGUAGES_FILE),
                       (json.dumps({"source": source, "target": target}) + "\n").encode("utf-8"))


def is_language_code(text):
    """A standard code of a language: ISO 639-1/2/3 or a BCP-47 tag ("en", "spa", "ger", "pt-BR").
    transformer/languages.py."""
    from .languages import is_language_code
    return is_language_code(text)


def read_languages(directory):
    """(source, target) normalised tags (languages.py) of a model directory's languages.json, or
    None. A model written before the tags were normalised ("eng", "spa") reads as "en", "es"."""
    from .languages import normalise

    path = os.path.join(directory, LANGUAGES_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        pair = (data["source"], data["target"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: damaged ({exc})") from None
    tags = tuple(normalise(code) for code in pair)
    for code, tag in zip(pair, tags):
        if tag is None:
            raise ValueError(f"{path}: {code!r} is not a language code")
    return tags


def copy_languages(source_dir, target_dir):
    """A derived model (quantized, averaged) translates the same languages as its input."""
    path = os.path.join(source_dir, LANGUAGES_FILE)
    if os.path.isfile(path):
        with open(path, "rb") as f:
            atomic_write_bytes(os.path.join(target_dir, LANGUAGES_FILE), f.read())


def load_for_inference(directory):
    """(model, src_tokenizer, tgt_tokenizer) from a directory written by training."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise NotADirectoryError(f"{directory}: a file, not a model directory (the --out of train, "
                                 f"quantize, average or convert)")
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"model directory not found: {directory}")
    model = Seq2SeqTransformer.load(directory)
    src = load_tokenizer(os.path.join(directory, SRC_TOKENIZER_FILE))
    tgt = load_tokenizer(os.path.join(directory, TGT_TOKENIZER_FILE))
    for side, tok, size in (("source", src, model.cfg.src_vocab_size), ("target", tgt, model.cfg.tgt_vocab_size)):
        # Training sizes the embeddings by its tokenizers, so they agree exactly; a MarianMT model's
        # vocab.json may hold fewer pieces than its embeddings' rows, never more.
        fits = tok.vocab_size <= size if isinstance(tok, SentencePieceTokenizer) else tok.vocab_size == size
        if not fits:
            raise ValueError(f"{directory}: the {side} tokenizer has {tok.vocab_size} ids and the model's "
                             f"embeddings {size} rows: not the tokenizer the model was trained with")
    return model, src, tgt


def average_weights(models, names=None):
    """The element-wise mean of several models' weights (same config), summed in float64:
    checkpoint averaging (section 6.1 of the paper averages the last 5 or 20 checkpoints).
    names: what errors call the models (their directories); models[i] otherwise."""
    if not models:
        raise ValueError("models: nothing to average")
    names = names or [f"models[{i}]" for i in range(len(models))]
    cfg = models[0].cfg
    for name, m in zip(names[1:], models[1:]):
        if m.cfg != cfg:
            raise ValueError(f"{name}: config differs from {names[0]}'s; only one model's "
                             "checkpoints can be averaged")
    total = np.zeros(models[0].params.flat.size, np.float64)
    for m in models:
        total += m.params.flat
    averaged = Seq2SeqTransformer(cfg, seed=models[0].seed)
    averaged.params.flat[:] = (total / len(models)).astype(np.float32)
    return averaged


def average_model_dirs(directories):
    """(model, src_tokenizer, tgt_tokenizer): the average of several model directories written by
    the same training run (same config and tokenizers, else ValueError naming the directory)."""
    loaded = [load_for_inference(d) for d in directories]
    if not loaded:
        raise ValueError("directories: nothing to average")
    _, src, tgt = loaded[0]
    for d, (m, s, t) in zip(directories, loaded):
        if m.stored_precision != "fp32":     # its weights are int8 roundings: average the fp32 ones
            raise ValueError(f"{d}: an {m.stored_precision} model; average the float32 models it was "
                             "quantized from, then quantize the average")
        if s.to_json() != src.to_json() or t.to_json() != tgt.to_json():
            raise ValueError(f"{d}: its tokenizers differ from {directories[0]}'s: not the same run")
    return average_weights([m for m, _, _ in loaded], names=list(directories)), src, tgt


SNAPSHOT_DIR = "snapshots"


LOG_FILE = "log.jsonl"   # the training log (training/loop.py): one JSON line per step and per evaluation
BEST_DIR = "best"        # --keep-best's model


def clear_run(directory):
    """Remove from `directory`, when it holds a run or a model, what that left there and nothing
    else: its checkpoint, model files, tokenizers, log, --keep-best's model and --average-last's
    snapshots. What replaces a run or model (--overwrite) starts from this, so it is never mixed
    with what it replaces (a --resume would have continued the old checkpoint beside a new model,
    and a new run's averages would have counted the old run's snapshots)."""
    from .model import CONFIG_FILE, WEIGHTS_FILE

    marks = (CHECKPOINT_FILE, CONFIG_FILE, WEIGHTS_FILE)
    if not any(os.path.isfile(os.path.join(directory, name)) for name in marks):
        return      # no run or model here: whatever bears these names is someone else's
    from .generation import GENERATION_FILE

    for name in (CHECKPOINT_FILE, CONFIG_FILE, WEIGHTS_FILE, SRC_TOKENIZER_FILE, TGT_TOKENIZER_FILE, LOG_FILE,
                 LANGUAGES_FILE, GENERATION_FILE):
        path = os.path.join(directory, name)
        if os.path.isfile(path) or os.path.islink(path):
            os.remove(path)
    for name in (BEST_DIR, SNAPSHOT_DIR):
        path = os.path.join(directory, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)


def snapshot_path(directory, step):
    return os.path.join(directory, SNAPSHOT_DIR, f"step-{step:07d}")


def save_snapshot(directory, step, model, keep):
    """DIR/snapshots/step-NNNNNNN/model.safetensors (+ config.json), keeping the newest `keep`."""
    model.save(snapshot_path(directory, step))
    for old in list_snapshots(directory)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def list_snapshots(directory):
    """Snapshot directories, oldest first."""
    root = os.path.join(directory, SNAPSHOT_DIR)
    if not os.path.isdir(root):
        return []
    return [os.path.join(root, name) for name in sorted(os.listdir(root)) if name.startswith("step-")]
