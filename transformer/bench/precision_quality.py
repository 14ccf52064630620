"""Translation quality of one trained model decoded in fp32, bf16 and int8.

The held-out split is the one training used (data.split_pairs with training's defaults, or the
given --dev-fraction/--dev-max), so the sentences were never trained on. For each precision and
search (greedy, beam 4): BLEU and chrF, the share of sentences whose output is identical to fp32's
with the same search, and the decoding time of the split (same run, so the ratios hold).

    python benchmarks/precision_quality.py --model runs/spa --data ../shared/data/bible-eng-spa.tsv.gz \\
        --src-col eng --tgt-col spa [--precisions fp32,bf16,int8] [--threads 2] [--json OUT.jsonl]

An int8 model file (transformer quantize) is evaluated the same way; its fp32/bf16 rows decode
its dequantized weights.
"""
import argparse
import json
import sys
import time

from .. import decoding


def evaluate(model_dir, data, src_col, tgt_col, precisions=("fp32", "bf16", "int8"), beams=(1, 4),
             dev_fraction=None, dev_max=None, threads=None, generator=None, samples=3):
    import transformer as T
    from ..checkpoint import load_for_inference
    from ..config import TRAIN_DEFAULTS
    from ..data import read_pairs, split_pairs
    from .harness import cpu_model
    from ..translation import score_translations, translate_texts

    if threads:
        T.set_num_threads(threads)
    if generator:
        decoding.INT8_GENERATOR = generator
    model, src_tok, tgt_tok = load_for_inference(model_dir)
    pairs, _ = read_pairs(data, src_col, tgt_col)
    _, dev = split_pairs(pairs, dev_fraction=dev_fraction or TRAIN_DEFAULTS["dev_fraction"],
                         max_dev=dev_max or TRAIN_DEFAULTS["dev_max"])
    sources, refs = [s for s, _ in dev], [t for _, t in dev]
    records = []
    for beam in beams:
        outputs, times = {}, {}     # of this search, by precision
        for precision in precisions:
            translate_texts(model, src_tok, tgt_tok, sources[:8], beam=beam, precision=precision)  # warm up
            start = time.perf_counter()
            hyps = translate_texts(model, src_tok, tgt_tok, sources, beam=beam, precision=precision)
            seconds = time.perf_counter() - start
            outputs[precision], times[precision] = hyps, seconds
            record = {"model": model_dir, "precision": precision, "search": "greedy" if beam == 1 else f"beam {beam}",
                      "int8_generator": decoding.int8_generator(model.cfg) if precision == "int8" else None,
                      "sentences": len(sources), "seconds": round(seconds, 3), "threads": T.get_num_threads(),
                      "cpu": cpu_model(), **{k: round(v, 2) for k, v in score_translations(hyps, refs).items()}}
            if "fp32" in outputs:
                same = sum(a == b for a, b in zip(hyps, outputs["fp32"]))
                record["identical_to_fp32"] = round(same / len(hyps), 4)
                record["time_vs_fp32"] = round(seconds / times["fp32"], 3)
            record["samples"] = [{"source": s, "reference": r, "output": h}
                                 for s, r, h in list(zip(sources, refs, hyps))[:samples]]
            records.append(record)
            print(json.dumps({k: v for k, v in record.items() if k != "samples"}), file=sys.stderr, flush=True)
    return records


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--src-col", default="0")
    parser.add_argument("--tgt-col", default="1")
    parser.add_argument("--precisions", default="fp32,bf16,int8")
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--dev-fraction", type=float)
    parser.add_argument("--dev-max", type=int)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--int8-generator", choices=["int8", "bf16", "fp32"],
                        help="the output projection's precision in int8 decoding (default: decoding.int8_generator's rule)")
    parser.add_argument("--json", help="append the records to this file (JSON lines)")
    args = parser.parse_args(argv)
    records = evaluate(args.model, args.data, args.src_col, args.tgt_col, args.precisions.split(","),
                       [int(b) for b in args.beams.split(",")], args.dev_fraction, args.dev_max, args.threads,
                       args.int8_generator)
    if args.json:
        with open(args.json, "a", encoding="utf-8") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
    for record in records:
        print(json.dumps(record, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
