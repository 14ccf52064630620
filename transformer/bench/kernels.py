"""Every kernel family's benchmark, ours against the references, from one run.

Each family module (gemm, nn, elementwise, loss) measures ours and torch (and
numpy for GEMM) interleaved, after warm-up, and returns one dict per
measurement with a `ratio` = reference time / our time (> 1: we are faster).
"""
import importlib
import sys

from .harness import cpu_model, emit, header_record  # noqa: F401 (cpu_model: kernels.cpu_model, as before)

FAMILIES = ("gemm", "nn", "elementwise", "loss")


def run(threads=(1, 2), families=FAMILIES, stream=None, precision="fp32"):
    """Run the family benchmarks; yields and optionally prints each record as a JSON line.
    precision "bf16" or "int8" adds the GEMM family's rows at that precision (gemm.run_precisions)."""
    records = []
    emit(header_record(), records, stream)
    for family in families:
        module = importlib.import_module(f"transformer.bench.{family}")
        kwargs = {"precisions": (precision,)} if family == "gemm" and precision != "fp32" else {}
        for record in module.run(threads=tuple(threads), **kwargs):
            emit({"family": family, **record}, records, stream)
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
