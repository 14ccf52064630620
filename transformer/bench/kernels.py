"""Every kernel family's benchmark, ours against the references, from one run.

Each family module (gemm, nn, elementwise, loss) measures ours and torch (and
numpy for GEMM) interleaved, after warm-up, and returns one dict per
measurement with a `ratio` = reference time / our time (> 1: we are faster).
"""
import importlib
import json
import platform
import sys
import time

FAMILIES = ("gemm", "nn", "elementwise", "loss")


def cpu_model():
    """'AMD EPYC (family 25, model 1)': the name alone does not tell Zen 3, 4 and 5 apart."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model") and key not in fields:
                    fields[key] = value.strip()
                if not line.strip() and fields:
                    break
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def run(threads=(1, 2), families=FAMILIES, stream=None, precision="fp32"):
    """Run the family benchmarks; yields and optionally prints each record as a JSON line.
    precision "bf16" or "int8" adds the GEMM family's rows at that precision (gemm.run_precisions)."""
    import transformer as T

    header = {"record": "header", "cpu": cpu_model(), "build": T.build_info(),
              "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    records = [header]
    if stream:
        print(json.dumps(header), file=stream, flush=True)
    for family in families:
        module = importlib.import_module(f"transformer.bench.{family}")
        kwargs = {"precisions": (precision,)} if family == "gemm" and precision != "fp32" else {}
        for record in module.run(threads=tuple(threads), **kwargs):
            record = {"family": family, **record}
            records.append(record)
            if stream:
                print(json.dumps(record), file=stream, flush=True)
    return records


def summary_table(records):
    """A plain-text table of the ratios, one line per measurement."""
    lines = [f"{'family':<12}{'kernel':<34}{'shape':<26}{'thr':>4}{'ours':>14}{'ratio':>9}"]
    for r in records:
        if r.get("record") == "header":
            continue
        figure = ""
        for key, unit in (("ours_gflops", "GF/s"), ("ours_gops", "GOP/s"), ("ours_gbps", "GB/s"),
                          ("ours_per_s", "/s")):
            if key in r:
                figure = f"{r[key]:.1f} {unit}"
                break
        ratio = r.get("ratio")
        lines.append(f"{r.get('family', ''):<12}{str(r.get('kernel', ''))[:33]:<34}"
                     f"{str(r.get('shape', ''))[:25]:<26}{r.get('threads', ''):>4}{figure:>14}"
                     f"{(f'{ratio:.2f}x' if isinstance(ratio, (int, float)) else ''):>9}")
    return "\n".join(lines)


if __name__ == "__main__":
    records = run(stream=sys.stdout)
    print(summary_table(records), file=sys.stderr)
