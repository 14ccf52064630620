"""Pictures: the cross-attention of a translated sentence (matplotlib, optional)."""
import re
import warnings

import numpy as np


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'transformer-cpu[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Per-glyph fallback (matplotlib >= 3.6): Devanagari and other scripts render where a font
    # for them is installed, instead of empty boxes.
    from matplotlib import font_manager

    installed = {font.name for font in font_manager.fontManager.ttflist}
    wanted = ["DejaVu Sans", "Noto Sans Devanagari", "Lohit Devanagari", "Noto Sans"]
    plt.rcParams["font.family"] = [name for name in wanted if name in installed] + ["sans-serif"]

    return plt


# matplotlib's warning for a character no font in use can draw (one per character and text)
_MISSING_GLYPH = re.compile(r"Glyph (\d+) .*missing from")


def plot_cross_attention(model, src_tokenizer, tgt_tokenizer, text, path, max_len=None):
    """Translate `text` greedily and draw the last decoder layer's cross-attention: source tokens
    across, generated tokens down, one panel per head (section 3.2.2, Figure 3 style). Returns
    the characters that no installed font could draw (shown as boxes), in order of appearance:
    matplotlib warns once per character and label, a dozen lines for a Hindi sentence."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _draw(model, src_tokenizer, tgt_tokenizer, text, path, max_len)
    missing = []
    for warning in caught:
        glyph = _MISSING_GLYPH.search(str(warning.message))
        if glyph is None:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        elif chr(int(glyph.group(1))) not in missing:
            missing.append(chr(int(glyph.group(1))))
    return missing


def _draw(model, src_tokenizer, tgt_tokenizer, text, path, max_len):
    cfg = model.cfg
    src_ids = src_tokenizer.encode(text)[:cfg.max_len] or [cfg.pad_id]
    src = np.array([src_ids], dtype=np.int64)
    limit = min(cfg.max_len, max_len or 2 * len(src_ids) + 10)
    hyps, attention = model.greedy_decode(src, max_len=limit, return_attention=True)
    weights = attention[0]                          # [steps, H, S]
    out_ids = hyps[0] + ([cfg.eos_id] if len(weights) > len(hyps[0]) else [])
    src_labels = src_tokenizer.tokens(src_ids)
    tgt_labels = tgt_tokenizer.tokens(out_ids)
    tgt_labels = [("</s>" if i == cfg.eos_id else label) for i, label in zip(out_ids, tgt_labels)]

    plt = _pyplot()
    heads = weights.shape[1]
    cols = min(heads, 4)
    rows = -(-heads // cols)
    cell = 0.38
    width = max(4.0, cols * (1.0 + cell * len(src_labels)))
    height = max(3.0, rows * (1.4 + cell * len(tgt_labels)))
    fig, axes = plt.subplots(rows, cols, figsize=(width, height + 0.8), squeeze=False, layout="constrained")
    image = None
    for head in range(rows * cols):
        ax = axes[head // cols][head % cols]
        if head >= heads:
            ax.axis("off")
            continue
        image = ax.imshow(weights[:, head, :], cmap="viridis", vmin=0.0, vmax=1.0, aspect="equal")
        ax.set_title(f"head {head + 1}", fontsize=10)
        ax.set_xticks(range(len(src_labels)))
        ax.set_xticklabels(src_labels, rotation=90, fontsize=9)
        ax.set_yticks(range(len(tgt_labels)))
        ax.set_yticklabels(tgt_labels, fontsize=9)
        if head % cols == 0:
            ax.set_ylabel("generated token")
        if head // cols == rows - 1:
            ax.set_xlabel("source token")
    fig.suptitle(f"Cross-attention of the last decoder layer, greedy decoding\n{text!r} -> "
                 f"{tgt_tokenizer.decode(hyps[0])!r}", fontsize=11)
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    fig.savefig(path, dpi=120)
    plt.close(fig)
