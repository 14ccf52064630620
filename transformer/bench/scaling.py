"""Thread scaling: throughput and parallel efficiency per thread count, ours and PyTorch's (and, for
decoding, CTranslate2's).

Efficiency at n threads = throughput(n) / (n * throughput(1)) for each engine, from the records
of the train and decode benchmarks (and the GEMM's), all measured in one run.
"""

from .harness import cpu_model, emit, header_record

# Which figure of a record is "throughput" for each engine.
_OURS = ("ours_per_s", "ours_tokens_per_s", "ours_gflops", "ours_gbps")
_TORCH = ("torch_per_s", "torch_tokens_per_s", "ref_tokens_per_s", "torch_gflops", "torch_gbps")
_ENGINES = (("ours", _OURS), ("torch", _TORCH), ("ctranslate2", ("ctranslate2_per_s",)))
_SHORT = {"ours": "ours", "torch": "torch", "ctranslate2": "ct2"}      # table labels
_LABEL = {"ours": "ours", "torch": "PyTorch", "ctranslate2": "CTranslate2"}   # plot legend
_STYLE = {"ours": "-o", "torch": "--s", "ctranslate2": ":^"}


def _figure(record, keys):
    for key in keys:
        if isinstance(record.get(key), (int, float)):
            return float(record[key]), key
    return None, None


def series(records):
    """{(kernel, shape): {engine: {threads: throughput}}} with the unit of each series."""
    out, units = {}, {}
    for r in records:
        if "threads" not in r or r.get("record") == "header":
            continue
        name = r.get("kernel") or r.get("bench") or "?"
        shape = f"{r['config']} {r.get('shape', '')}" if "config" in r and r.get("bench") else r.get("shape", "")
        key = (str(name), str(shape))
        for engine, keys in _ENGINES:
            value, unit = _figure(r, keys)
            if value is not None:
                out.setdefault(key, {}).setdefault(engine, {})[int(r["threads"])] = value
                units[key] = unit.split("_", 1)[1].replace("tokens_per_s", "per_s")
    return out, units


def efficiency_table(records):
    """Plain-text table: throughput and efficiency per thread count, ours and each reference."""
    data, units = series(records)
    lines = []
    for (kernel, shape), engines in data.items():
        threads = sorted(set().union(*[set(v) for v in engines.values()]))
        lines.append(f"{kernel} [{shape}] ({units[(kernel, shape)].replace('_', ' ')})")
        lines.append("  threads " + "".join(f"{n:>12}" for n in threads))
        for engine, values in engines.items():
            base = values.get(1)
            lines.append(f"  {_SHORT[engine]:<7} " + "".join(f"{values.get(n, float('nan')):>12,.1f}" for n in threads))
            if base:
                lines.append(f"  {'eff.':<7} " + "".join(
                    f"{values[n] / (n * base):>12.0%}" if n in values else f"{'':>12}" for n in threads))
        for ref in ("torch", "ctranslate2"):
            if "ours" in engines and ref in engines:
                lines.append(f"  {'ours/' + _SHORT[ref]:<10}" + "".join(
                    f"{engines['ours'][n] / engines[ref][n]:>11.2f}x" if n in engines["ours"] and n in engines[ref]
                    else f"{'':>12}" for n in threads)[2:])
    return "\n".join(lines)


def plot(records, path, title_extra=""):
    """tokens/s against threads (ours solid, PyTorch dashed, CTranslate2 dotted) and parallel efficiency."""
    from ..plot import _pyplot

    plt = _pyplot()
    data, units = series(records)
    chosen = {k: v for k, v in data.items() if units[k] in ("per_s", "tokens_per_s")}
    if not chosen:
        chosen, unit_label = data, "throughput"
    else:
        unit_label = "tokens / s"
    fig, (ax_speed, ax_eff) = plt.subplots(1, 2, figsize=(13, 5.2), layout="constrained")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    all_threads = set()
    for i, ((kernel, shape), engines) in enumerate(sorted(chosen.items())):
        color = colors[i % len(colors)]
        for engine, style in _STYLE.items():
            values = engines.get(engine)
            if not values:
                continue
            threads = sorted(values)
            all_threads.update(threads)
            config = shape.split(" ")[0]
            name = kernel if config in kernel.split() else f"{kernel} {config}"
            label = f"{name} ({_LABEL[engine]})"
            ax_speed.plot(threads, [values[n] for n in threads], style, color=color, label=label)
            if 1 in values:
                ax_eff.plot(threads, [values[n] / (n * values[1]) for n in threads], style, color=color,
                            label=label)
    for ax in (ax_speed, ax_eff):
        ax.set_xscale("log", base=2)
        ticks = sorted(all_threads)
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        ax.set_xlabel("threads")
        ax.grid(True, which="both", alpha=0.3)
    ax_speed.set_yscale("log")
    ax_speed.set_ylabel(unit_label)
    ax_speed.set_title("Throughput")
    ax_eff.set_ylabel("parallel efficiency  (speed-up / threads)")
    ax_eff.set_ylim(0, 1.1)
    ax_eff.axhline(1.0, color="grey", lw=0.8)
    ax_eff.set_title("Parallel efficiency")
    ax_eff.legend(fontsize=7, loc="lower left", ncol=1)
    fig.suptitle(f"Thread scaling on {cpu_model()} {title_extra}".strip())
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run_all(threads, what=("train", "decode"), stream=None, configs=("tiny", "base"), against="torch"):
    """Run the chosen suites at every thread count; returns all records (JSON lines to stream).
    against=None measures ours alone."""
    import importlib

    records = [header_record(threads=None)]
    for suite in what:
        module = importlib.import_module(f"transformer.bench.{suite}")
        kwargs = {}
        if suite == "train":
            kwargs = {"memory": False, "configs": tuple(configs), "against": against}
        if suite == "gemm":
            kwargs = {"skinny": False, "attention": False, "repeats": 3}
        if suite == "decode":   # greedy only: PyTorch's prefix re-run with beams takes minutes per point
            kwargs = {"beams": (1,), "configs": tuple(configs),
                      "engines": ("ours", "torch", "ctranslate2") if against else ("ours",)}
        for record in module.run(threads=tuple(threads), **kwargs):
            emit({"suite": suite, **record}, records, stream)
    return records
