"""MarianMT (OPUS-MT) models in and out: Hugging Face's MarianMTModel directories <-> ours.

A MarianMT model is the paper's post-LN encoder-decoder with the options ModelConfig has for it
(SiLU "swish", sines-then-cosines positions, one tied matrix, no final norms, decoding started
from the pad token). Importing maps every tensor by name onto our state dict, with shape checks,
and writes an ordinary model directory whose tokenizers are the model's own SentencePiece models
(tokenizer.SentencePieceTokenizer); token ids stay MarianMT's, so `model.forward(src, tgt_in)`
gives MarianMTModel's logits. Exporting writes the files `MarianMTModel.from_pretrained` and
`MarianTokenizer.from_pretrained` read. Anything that cannot be mapped is an error naming it.

torch and transformers are never imported here: weights are read by transformer/hf_weights.py
(no pickle code runs) and written as safetensors.
"""
import json
import os
import re
import reprlib

import numpy as np

from .config import ModelConfig
from .serialization import atomic_write_bytes, save_file

__all__ = ["config_from_marian", "config_to_marian", "state_dict_from_marian", "state_dict_to_marian",
           "import_marian", "export_marian", "write_marian_vocab"]

_ACTIVATIONS = {"swish": "silu", "silu": "silu", "gelu": "gelu", "relu": "relu"}
# MarianMT's per-layer names -> ours (torch.nn.Transformer's)
_ENCODER = {"self_attn_layer_norm": "norm1", "final_layer_norm": "norm2", "fc1": "linear1",
            "fc2": "linear2", "self_attn.out_proj": "self_attn.out_proj"}
_DECODER = {"self_attn_layer_norm": "norm1", "encoder_attn_layer_norm": "norm2",
            "final_layer_norm": "norm3", "fc1": "linear1", "fc2": "linear2",
            "self_attn.out_proj": "self_attn.out_proj", "encoder_attn.out_proj": "multihead_attn.out_proj"}
_ATTENTION = {"encoder": {"self_attn": "self_attn"},
              "decoder": {"self_attn": "self_attn", "encoder_attn": "multihead_attn"}}
POSITION_ATOL = 1e-6     # a stored sinusoidal table against ours (both float64 rounded once)


def _marian_error(source, message):
    return ValueError(f"{source}: cannot map this MarianMT model: {message}")


_KINDS = {int: "an integer", bool: "true or false", str: "a string", (int, float): "a number"}
_REQUIRED = object()


def config_from_marian(hf, source="config.json"):
    """ModelConfig for a MarianMT config.json dict; ValueError naming what has no equivalent, or
    the field whose value has the wrong type (a damaged or foreign config.json)."""
    if not isinstance(hf, dict):
        raise ValueError(f"{source}: not a MarianMT config: a JSON object is expected, got "
                         f"{type(hf).__name__}")
    model_type = hf.get("model_type")
    if model_type != "marian":
        raise _marian_error(source, f"model_type is {reprlib.repr(model_type)}, not 'marian'")

    def get(name, kind=int, default=_REQUIRED):
        """hf[name], of `kind` (JSON's true and false are not integers), or `default` when absent."""
        if name not in hf:
            if default is _REQUIRED:
                raise _marian_error(source, f"config.json has no {name!r}")
            return default
        value = hf[name]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise ValueError(f"{source}: {name} must be {_KINDS[kind]}, got {reprlib.repr(value)}")
        return value

    for ours, theirs in (("attention heads", ("encoder_attention_heads", "decoder_attention_heads")),
                         ("feed-forward sizes", ("encoder_ffn_dim", "decoder_ffn_dim"))):
        a, b = (get(n) for n in theirs)
        if a != b:
            raise _marian_error(source, f"the encoder and decoder {ours} differ ({theirs[0]}={a}, "
                                        f"{theirs[1]}={b}); this engine has one for both")
    activation = get("activation_function", str)
    if activation not in _ACTIVATIONS:
        raise _marian_error(source, f"activation_function {activation!r} (supported: {sorted(_ACTIVATIONS)})")
    if get("normalize_before", bool, False) or get("add_final_layer_norm", bool, False) \
            or get("normalize_embedding", bool, False):
        raise _marian_error(source, "normalize_before / add_final_layer_norm / normalize_embedding "
                                    "(only MarianMT's post-LN layout is mapped)")
    if not get("static_position_embeddings", bool, True):
        raise _marian_error(source, "learned position embeddings (static_position_embeddings=false)")
    vocab = get("vocab_size")
    share = get("share_encoder_decoder_embeddings", bool, True)
    tie_output = get("tie_word_embeddings", bool, True)
    if share:
        if not tie_output:
            raise _marian_error(source, "share_encoder_decoder_embeddings=true with "
                                        "tie_word_embeddings=false (one embedding matrix, a separate "
                                        "output projection) has no equivalent here")
        tgt_vocab, tie = vocab, "all"
    else:
        # null in configs whose decoder shares the source vocabulary's size
        tgt_vocab = vocab if hf.get("decoder_vocab_size") is None else get("decoder_vocab_size")
        tie = "target" if tie_output else "none"
    pad = get("pad_token_id")
    options = dict(
        src_vocab_size=vocab, tgt_vocab_size=tgt_vocab, d_model=get("d_model"),
        n_heads=get("encoder_attention_heads"), d_ff=get("encoder_ffn_dim"),
        n_encoder_layers=get("encoder_layers"), n_decoder_layers=get("decoder_layers"),
        dropout=get("dropout", (int, float), 0.1), activation=_ACTIVATIONS[activation],
        norm_first=False, max_len=get("max_position_embeddings"), pad_id=pad,
        bos_id=get("decoder_start_token_id", int, pad), eos_id=get("eos_token_id"),
        positions="split", scale_embedding=get("scale_embedding", bool, False),
        tie_embeddings=tie, final_norm=False)
    try:
        return ModelConfig(**options)
    except (TypeError, ValueError) as exc:
        raise _marian_error(source, str(exc)) from None


def config_to_marian(cfg):
    """The MarianMT config.json dict for a ModelConfig; ValueError naming the option MarianMT
    cannot express."""
    problems = []
    if cfg.norm_first:
        problems.append("norm_first=True (MarianMT is post-LN)")
    if cfg.final_norm:
        problems.append("final_norm=True (MarianMT has no final encoder/decoder LayerNorm)")
    if cfg.positions != "split":
        problems.append(f"positions={cfg.positions!r} (MarianMT's table is 'split': sines, then cosines)")
    if cfg.norm != "layer":
        problems.append(f"norm={cfg.norm!r} (MarianMT's norms are LayerNorms)")
    if cfg.fix_norm:
        problems.append("fix_norm=True (MarianMT reads its embeddings as they are)")
    if problems:
        raise ValueError("cannot export as MarianMT: " + "; ".join(problems))
    share = cfg.tie_embeddings == "all"
    return {
        "model_type": "marian", "architectures": ["MarianMTModel"],
        "vocab_size": cfg.src_vocab_size, "decoder_vocab_size": cfg.tgt_vocab_size,
        "share_encoder_decoder_embeddings": share, "tie_word_embeddings": cfg.tie_embeddings != "none",
        "d_model": cfg.d_model, "encoder_layers": cfg.n_encoder_layers,
        "decoder_layers": cfg.n_decoder_layers, "encoder_attention_heads": cfg.n_heads,
        "decoder_attention_heads": cfg.n_heads, "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff,
        "activation_function": {"silu": "swish"}.get(cfg.activation, cfg.activation),
        "max_position_embeddings": cfg.max_len, "scale_embedding": cfg.scale_embedding,
        # rates set by site are written as such (transformers' MarianConfig has both); word_dropout,
        # training-only, has no equivalent there and is left out, as inference never reads it
        "dropout": cfg.dropout, "attention_dropout": cfg.attention_dropout or 0.0,
        "activation_dropout": cfg.activation_dropout or 0.0,
        "pad_token_id": cfg.pad_id, "eos_token_id": cfg.eos_id, "forced_eos_token_id": cfg.eos_id,
        "decoder_start_token_id": cfg.bos_id, "is_encoder_decoder": True,
        "static_position_embeddings": True, "normalize_embedding": False,
    }


def _layer_map(cfg):
    """{MarianMT name (without the leading "model."): (our name, rows or None)} for every per-layer
    tensor; q/k/v projections map onto row blocks of in_proj_weight / in_proj_bias."""
    D = cfg.d_model
    out = {}
    for side, n, table in (("encoder", cfg.n_encoder_layers, _ENCODER),
                           ("decoder", cfg.n_decoder_layers, _DECODER)):
        for i in range(n):
            theirs, ours = f"{side}.layers.{i}", f"transformer.{side}.layers.{i}"
            for a, b in table.items():
                for kind in ("weight", "bias"):
                    out[f"{theirs}.{a}.{kind}"] = (f"{ours}.{b}.{kind}", None)
            for a, b in _ATTENTION[side].items():
                for part, proj in enumerate(("q_proj", "k_proj", "v_proj")):
                    rows = slice(part * D, (part + 1) * D)
                    out[f"{theirs}.{a}.{proj}.weight"] = (f"{ours}.{b}.in_proj_weight", rows)
                    out[f"{theirs}.{a}.{proj}.bias"] = (f"{ours}.{b}.in_proj_bias", rows)
    return out


# MarianMT's embedding and output matrices -> ours (a tied one then resolves to its owner)
_EMBEDDINGS = {"shared.weight": "src_embed.weight", "encoder.embed_tokens.weight": "src_embed.weight",
               "decoder.embed_tokens.weight": "tgt_embed.weight", "lm_head.weight": "generator.weight"}


def _sinusoids(cfg):
    from .model import _positional_encoding
    return _positional_encoding(cfg.max_len, cfg.d_model, "split")


def state_dict_from_marian(tensors, cfg, source="weights"):
    """Our state dict (tied names included once per owner) from MarianMT's {name: float32 array};
    ValueError naming any tensor that is unknown, missing, misshapen, inconsistent or not finite."""
    from .params import tied_names
    spec_shapes = {name: shape for name, shape, _ in _specs(cfg)}
    tied = tied_names(cfg)
    layer_map = _layer_map(cfg)
    sd, filled = {}, {}
    V = cfg.tgt_vocab_size

    def target(name, shape):
        if name not in sd:
            sd[name] = np.zeros(shape, dtype=np.float32)
            filled[name] = np.zeros(shape[0], dtype=bool)
        return sd[name]

    owners = {}     # our matrix -> the MarianMT names that gave it (tied copies must agree)
    for key, value in tensors.items():
        name = key[len("model."):] if key.startswith("model.") else key
        value = np.asarray(value, dtype=np.float32)
        if not np.isfinite(value).all():     # a damaged file (0xFF bytes are NaN), or beyond float32
            raise ValueError(f"{source}: tensor {key!r} holds non-finite values (NaN or inf): the "
                             "weights file is damaged")
        if name in ("encoder.embed_positions.weight", "decoder.embed_positions.weight"):
            want = _sinusoids(cfg)
            if value.shape != want.shape:
                raise _marian_error(source, f"{key} has shape {value.shape}, expected {want.shape}")
            if not np.allclose(value, want, rtol=0, atol=POSITION_ATOL):
                raise _marian_error(source, f"{key} is not the sinusoidal table (learned positions?)")
            continue
        if name == "final_logits_bias":
            if value.shape != (1, V):
                raise _marian_error(source, f"{key} has shape {value.shape}, expected (1, {V})")
            sd["generator.bias"] = value.reshape(V).copy()
            continue
        if name in _EMBEDDINGS:
            ours = tied.get(_EMBEDDINGS[name], _EMBEDDINGS[name])
            shape = spec_shapes[ours]
            if value.shape != shape:
                raise _marian_error(source, f"{key} has shape {value.shape}, expected {shape}")
            if ours in owners:
                if not np.array_equal(sd[ours], value):
                    raise _marian_error(source, f"{key} differs from {owners[ours][0]}, which this "
                                                f"config ties it to")
                owners[ours].append(key)
                continue
            owners[ours] = [key]
            sd[ours] = value.copy()
            continue
        if name not in layer_map:
            raise _marian_error(source, f"no equivalent for tensor {key!r}")
        ours, rows = layer_map[name]
        shape = spec_shapes[ours]
        dest = target(ours, shape)
        want = shape if rows is None else (rows.stop - rows.start,) + tuple(shape[1:])
        if value.shape != want:
            raise _marian_error(source, f"{key} has shape {value.shape}, expected {want}")
        if rows is None:
            dest[...] = value
            filled[ours][:] = True
        else:
            dest[rows] = value
            filled[ours][rows] = True
    if "generator.bias" not in sd:          # MarianMT's final_logits_bias starts (and often stays) 0
        sd["generator.bias"] = np.zeros(V, dtype=np.float32)
    missing = [n for n in spec_shapes if n not in sd or (n in filled and not filled[n].all())]
    if missing:
        raise _marian_error(source, f"tensors missing for {missing[:5]}{'...' if len(missing) > 5 else ''}")
    return sd


def _specs(cfg):
    from .params import parameter_specs
    return parameter_specs(cfg)


def state_dict_to_marian(model):
    """MarianMT's {name: float32 array} for a model whose config MarianMT can express
    (config_to_marian): what MarianMTModel.state_dict() holds, tied matrices once per name that
    MarianMT keeps (its loader ties the others)."""
    cfg = model.cfg
    config_to_marian(cfg)
    p = model.params
    out = {}
    for theirs, (ours, rows) in _layer_map(cfg).items():
        value = p.tensor(ours)
        out[f"model.{theirs}"] = np.ascontiguousarray(value if rows is None else value[rows])
    if cfg.tie_embeddings == "all":
        out["model.shared.weight"] = p.tensor("src_embed.weight")
    else:
        out["model.encoder.embed_tokens.weight"] = p.tensor("src_embed.weight")
        out["model.decoder.embed_tokens.weight"] = p.tensor("tgt_embed.weight")
        if cfg.tie_embeddings == "none":
            out["lm_head.weight"] = p.tensor("generator.weight")
    table = _sinusoids(cfg)
    out["model.encoder.embed_positions.weight"] = table
    out["model.decoder.embed_positions.weight"] = table
    out["final_logits_bias"] = p.tensor("generator.bias").reshape(1, -1)
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def marian_languages(hf_dir, hf=None):
    """(source, target) language codes of a MarianMT directory, or None: tokenizer_config.json's
    source_lang and target_lang (MarianTokenizer's), else the OPUS-MT name the config was saved
    from (_name_or_path "Helsinki-NLP/opus-mt-en-de"); codes only, each as its normalised tag
    (languages.py: "eng" is "en")."""
    from .languages import normalise

    try:
        with open(os.path.join(hf_dir, "tokenizer_config.json"), encoding="utf-8") as f:
            tokenizer = json.load(f)
    except (OSError, ValueError):
        tokenizer = {}
    pair = (tokenizer.get("source_lang"), tokenizer.get("target_lang")) if isinstance(tokenizer, dict) else ()
    tags = tuple(normalise(code) for code in pair)
    if len(tags) == 2 and None not in tags:
        return tags
    if hf is None:
        try:
            with open(os.path.join(hf_dir, "config.json"), encoding="utf-8") as f:
                hf = json.load(f)
        except (OSError, ValueError):
            return None
    name = hf.get("_name_or_path") or hf.get("name_or_path") if isinstance(hf, dict) else None
    if isinstance(name, str):
        match = re.search(r"opus-mt-([A-Za-z]{2,3})-([A-Za-z]{2,3})/?$", name)
        tags = tuple(normalise(code) for code in match.groups()) if match else (None,)
        if None not in tags:
            return tags
    return None


def import_marian(hf_dir, out_dir=None):
    """Read a local MarianMT directory (config.json, model.safetensors or pytorch_model.bin,
    source.spm, target.spm, vocab.json, generation_config.json when present); returns (model,
    src_tokenizer, tgt_tokenizer) and, when out_dir is given, writes an ordinary model directory
    there (Seq2SeqTransformer.load, `transformer translate --model`). The model carries the
    directory's generation settings (model.generation, generation.py: its decoding defaults, as
    generate's); a setting this engine does not implement is a ValueError naming it."""
    from .hf_weights import read_hf_weights
    from .model import Seq2SeqTransformer
    from .tokenizer import marian_tokenizers

    hf_dir = os.fspath(hf_dir)
    if not os.path.isdir(hf_dir):
        raise FileNotFoundError(f"MarianMT directory not found: {hf_dir}")
    cfg_path = os.path.join(hf_dir, "config.json")
    try:
        with open(cfg_path, encoding="utf-8") as f:
            hf = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{cfg_path}: no config.json in the MarianMT directory") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{cfg_path}: not a valid config file ({exc})") from None
    cfg = config_from_marian(hf, cfg_path)
    src_tok, tgt_tok = marian_tokenizers(hf_dir)
    for side, tok, size in (("source", src_tok, cfg.src_vocab_size), ("target", tgt_tok, cfg.tgt_vocab_size)):
        if tok.vocab_size > size:
            raise _marian_error(hf_dir, f"the {side} vocabulary has {tok.vocab_size} ids, the model {size}")
    from .generation import read_marian_generation
    settings = read_marian_generation(hf_dir, hf, cfg)    # refused before the weights are read
    tensors = read_hf_weights(hf_dir)
    model = Seq2SeqTransformer(cfg)
    model.load_state_dict(state_dict_from_marian(tensors, cfg, hf_dir))
    model.generation = settings
    if out_dir is not None:
        from .checkpoint import save_inference_files
        save_inference_files(os.fspath(out_dir), model, src_tok, tgt_tok, languages=marian_languages(hf_dir, hf))
    return model, src_tok, tgt_tok


def export_marian(model, src_tokenizer, tgt_tokenizer, out_dir, languages=None):
    """Write a MarianMT directory for `model` and its SentencePiece tokenizers: config.json,
    generation_config.json, model.safetensors, source.spm, target.spm, vocab.json,
    tokenizer_config.json (with source_lang and target_lang when `languages` are given). ValueError
    when the model or its tokenizers have no MarianMT form."""
    from .tokenizer import SentencePieceTokenizer

    cfg = model.cfg
    hf = config_to_marian(cfg)
    for side, tok in (("source", src_tokenizer), ("target", tgt_tokenizer)):
        if not isinstance(tok, SentencePieceTokenizer):
            raise ValueError(f"cannot export as MarianMT: the {side} tokenizer is a "
                             f"{type(tok).__name__}; MarianTokenizer reads SentencePiece models "
                             f"(a model imported with `transformer convert --from marian`)")
    if src_tokenizer.vocab != tgt_tokenizer.vocab:
        raise ValueError("cannot export as MarianMT: the source and target vocabularies differ "
                         "(only MarianMT's shared vocab.json is written)")
    vocab = src_tokenizer.vocab
    special = {"eos_token": cfg.eos_id, "unk_token": src_tokenizer.unk_id, "pad_token": cfg.pad_id}
    names = {}
    for key, token_id in special.items():
        found = [piece for piece, i in vocab.items() if i == token_id]
        if not found:
            raise ValueError(f"cannot export as MarianMT: no vocabulary entry has the {key} id {token_id}")
        names[key] = found[0]
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)

    def write_json(name, obj):
        atomic_write_bytes(os.path.join(out_dir, name), (json.dumps(obj, indent=2, ensure_ascii=False)
                                                         + "\n").encode("utf-8"))

    if model.generation is not None:
        # the settings it was imported with, in both files, so that transformers reads the same
        # ones whichever it reads (generation_config.json, when present, alone)
        generation = model.generation.to_generation_config(cfg)
        hf = {**{k: v for k, v in hf.items() if k != "forced_eos_token_id"}, **generation}
    else:       # a model trained here: OPUS-MT's settings
        generation = {
            "decoder_start_token_id": cfg.bos_id, "eos_token_id": cfg.eos_id, "pad_token_id": cfg.pad_id,
            "forced_eos_token_id": cfg.eos_id, "bad_words_ids": [[cfg.pad_id]], "max_length": cfg.max_len,
            "num_beams": 4}
    write_json("config.json", hf)
    write_json("generation_config.json", generation)
    write_json("vocab.json", vocab)
    write_json("tokenizer_config.json", {
        **names, "model_max_length": cfg.max_len, "separate_vocabs": False,
        "tokenizer_class": "MarianTokenizer",
        "clean_up_tokenization_spaces": tgt_tokenizer.clean_up_tokenization_spaces,
        **({"source_lang": languages[0], "target_lang": languages[1]} if languages else {})})
    atomic_write_bytes(os.path.join(out_dir, "source.spm"), src_tokenizer.model_bytes)
    atomic_write_bytes(os.path.join(out_dir, "target.spm"), tgt_tokenizer.model_bytes)
    with model._lock:
        tensors = state_dict_to_marian(model)
    # "format": "pt" is what transformers' loader asks of a safetensors file
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def write_marian_vocab(directory, spm_file, vocab_size=None):
    """The tokenizer files of a MarianMT directory for one SentencePiece model (used on both
    sides): source.spm, target.spm and vocab.json laid out as OPUS-MT's ("</s>" 0, "<unk>" 1, the
    pieces, placeholder pieces up to vocab_size when given, "<pad>" last). For building MarianMT
    directories in tests and benchmarks. Returns the vocabulary {piece: id}."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.fspath(spm_file))
    vocab = {"</s>": 0, "<unk>": 1}
    for i in range(sp.get_piece_size()):
        if sp.id_to_piece(i) != "<unk>":
            vocab.setdefault(sp.id_to_piece(i), len(vocab))
    filler = 0
    while vocab_size is not None and len(vocab) < vocab_size - 1:
        vocab.setdefault(f"\u2581placeholder{filler}", len(vocab))
        filler += 1
    vocab["<pad>"] = len(vocab)
    os.makedirs(directory, exist_ok=True)
    atomic_write_bytes(os.path.join(directory, "vocab.json"), json.dumps(vocab, ensure_ascii=False).encode("utf-8"))
    with open(spm_file, "rb") as f:
        blob = f.read()
    for name in ("source.spm", "target.spm"):
        atomic_write_bytes(os.path.join(directory, name), blob)
    return vocab
