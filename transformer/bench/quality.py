"""Translation quality for equal wall-clock time: ours against the PyTorch reference network.

Both engines go through the same pipeline (transformer.train.train_on_data): the same split, BPE
vocabularies, length batches, Adam with the warm-up schedule, label smoothing and gradient
clipping; the same initial weights. Only the forward/backward/update of a step differs. The
PyTorch model is evaluated by copying its weights into our model and decoding with our decoder,
so BLEU and chrF compare what training reached, nothing else.

    python benchmarks/quality.py --engine ours|torch --data FILE --src-col eng --tgt-col hin \\
        --minutes 10 --threads 2 [--preset small] [--json RECORDS.jsonl]
    python benchmarks/quality.py --plot OUT.png RECORDS.jsonl...
    python benchmarks/quality.py --compare RECORDS.jsonl...

Every training flag is `transformer train`'s, with its defaults (the budget schedule, ...): what a
user gets. The record has the final dev loss, BLEU and chrF (greedy and beam 4) on the held-out
split, sample translations, and the curve of periodic dev BLEU against training seconds.
--compare prints, for each pair of records (ours, PyTorch) of one corpus, budget, CPU, thread count
and preset, the ratios of their steps and final BLEU / chrF, and the time ratio: how much sooner
ours reached the dev BLEU the reference ended with.
"""
import json
import sys

import numpy as np

from ..model import Seq2SeqTransformer


class TorchEngine:
    """Our model's training interface over the PyTorch reference network (torch_compat)."""

    def __init__(self, cfg, seed=0):
        import torch

        from ..torch_compat import to_torch

        torch.manual_seed(seed)
        self.cfg = cfg
        self.seed = seed
        self.ours = Seq2SeqTransformer(cfg, seed=seed)     # the same initial weights as ours
        self.net = to_torch(self.ours)
        self._synced = True

    def num_parameters(self):
        return self.ours.num_parameters()

    def zero_grad(self):
        for p in self.net.parameters():
            p.grad = None

    def set_dropout(self, p):
        import torch

        for module in self.net.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = p
            elif isinstance(module, torch.nn.MultiheadAttention):
                module.dropout = p
        self.ours.set_dropout(p)
        self.cfg = self.ours.cfg

    def forward_backward(self, src, tgt_in, tgt_out, label_smoothing=0.1, precision="fp32"):
        """precision "bf16": PyTorch's mixed precision, torch.autocast("cpu", torch.bfloat16)."""
        import torch

        from ..torch_compat import torch_loss

        self.net.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = torch_loss(self.net, src, tgt_in, tgt_out, label_smoothing)
        loss.backward()
        self._synced = False
        return float(loss.item())

    def _sync(self):
        if not self._synced:
            from ..torch_compat import torch_state_dict_numpy

            names = set(self.ours.params.data)
            self.ours.load_state_dict({k: v for k, v in torch_state_dict_numpy(self.net).items() if k in names})
            self._synced = True
        return self.ours

    def save(self, path):
        """The weights in our format (--average-last snapshots)."""
        self._sync().save(path)

    def forward(self, src, tgt_in):
        return self._sync().forward(src, tgt_in)

    def greedy_decode(self, *args, **kwargs):
        return self._sync().greedy_decode(*args, **kwargs)

    def beam_search(self, *args, **kwargs):
        return self._sync().beam_search(*args, **kwargs)


class TorchAdam:
    """torch.optim.Adam with the paper's betas and eps; lr set per step like ours."""

    def __init__(self, engine):
        import torch

        self.opt = torch.optim.Adam(engine.net.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)

    def step(self, lr):
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.opt.step()


def torch_clip(engine, max_norm):
    import torch

    return float(torch.nn.utils.clip_grad_norm_(engine.net.parameters(), max_norm))


def torch_engine(seed):
    def make(cfg):
        engine = TorchEngine(cfg, seed)
        return engine, TorchAdam(engine), torch_clip
    return make


def curve(out_dir):
    """[(training seconds, step, dev BLEU, chrF, dev loss)] of a run's periodic evaluations."""
    import os

    from ..checkpoint import LOG_FILE

    points = []
    with open(os.path.join(out_dir, LOG_FILE), encoding="utf-8") as f:
        for line in f:
            entry = json.loads(line)
            if "dev_loss" in entry and "seconds" in entry:
                points.append([entry["seconds"], entry["step"], entry.get("bleu"), entry.get("chrf"),
                               entry["dev_loss"]])
    return points


def read_records(paths):
    """The records of JSON-lines files (the --json output of runs), in order; blank lines skipped."""
    records = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            records.extend(json.loads(line) for line in f if line.strip())
    return records


def pop_options(argv, options):
    """The suite's own flags taken out of argv (the rest are `transformer train`'s): options maps
    each flag to its default and gets the value given; a flag given twice, the last wins."""
    for flag in options:
        while flag in argv:
            i = argv.index(flag)
            if i + 1 == len(argv):
                raise SystemExit(f"{flag} needs a value")
            options[flag] = argv[i + 1]
            del argv[i:i + 2]
    return options


def write_record(record, path):
    """Print the record as a JSON line, and append it to `path` (None: print only)."""
    print(json.dumps(record))
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def budget(record):
    return f"{record['minutes']:g} min" if record.get("minutes") else f"{record['steps']} steps"


def batches(record):
    """The legend's ', batches of N tokens, dropout p', or '' for a record without batch_tokens."""
    if record.get("batch_tokens") is None:
        return ""
    dropout = f", dropout {record['dropout']:g}" if record.get("dropout") is not None else ""
    return f", batches of {record['batch_tokens']} tokens{dropout}"


def reached_at(points, target):
    """The training seconds at which a curve [(seconds, step, dev BLEU, ...)] first reaches dev BLEU
    `target`, interpolated linearly between the two evaluations around it; None if it never does."""
    points = [p for p in points if p[2] is not None]
    for i, (seconds, _, bleu, *_) in enumerate(points):
        if bleu >= target:
            if i == 0:
                return seconds
            t0, b0 = points[i - 1][0], points[i - 1][2]
            return t0 + (seconds - t0) * (target - b0) / (bleu - b0)
    return None


def compare(records):
    """Ours against the PyTorch reference, for every pair of runs on one corpus with one budget, CPU,
    thread count and preset: the ratios of steps, final BLEU and chrF (greedy, beam 4; held-out
    split), and how much sooner ours reached the reference's last dev BLEU (periodic greedy, on the
    --eval-limit sentences): the reference's training seconds over ours, None if ours never got there."""
    def key(r):
        return (r["data"], r.get("minutes"), r.get("cpu"), r.get("threads"), r.get("preset"))

    def ratio(a, b):
        return round(a / b, 3) if a is not None and b else None

    rows = []
    for ours in (r for r in records if r["engine"] == "ours"):
        for ref in (r for r in records if r["engine"] == "torch" and key(r) == key(ours)):
            end, target = next(((p[0], p[2]) for p in reversed(ref.get("curve") or []) if p[2] is not None),
                               (None, None))
            when = reached_at(ours.get("curve") or [], target) if target is not None else None
            rows.append({
                "data": ours["data"], "minutes": ours.get("minutes"), "cpu": ours.get("cpu"),
                "threads": ours.get("threads"), "preset": ours.get("preset"),
                "ours": {k: ours.get(k) for k in ("batch_tokens", "dropout", "steps")},
                "reference": {k: ref.get(k) for k in ("batch_tokens", "dropout", "steps")},
                "steps_ratio": ratio(ours["steps"], ref["steps"]),
                "bleu_ratio": {s: ratio(ours[s]["bleu"], ref[s]["bleu"]) for s in ("greedy", "beam4")},
                "chrf_ratio": {s: ratio(ours[s]["chrf"], ref[s]["chrf"]) for s in ("greedy", "beam4")},
                "reference_last_dev_bleu": target,
                "ours_reached_it_at_seconds": None if when is None else round(when, 1),
                "time_ratio": ratio(end, when)})
    return rows


def plot(records, path):
    """Dev BLEU (periodic, greedy, --eval-limit sentences) against training wall-clock, one line per
    run: engine, corpus and budget in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    corpora = sorted({r["data"] for r in records})
    fig, axes = plt.subplots(1, len(corpora), figsize=(6.5 * len(corpora), 4.5), squeeze=False)
    for ax, corpus in zip(axes[0], corpora):
        for r in sorted((r for r in records if r["data"] == corpus), key=lambda r: (r["engine"], r["minutes"] or 0)):
            xs = [p[0] / 60 for p in r["curve"] if p[2] is not None]
            ys = [p[2] for p in r["curve"] if p[2] is not None]
            style = "-" if r["engine"] == "ours" else "--"
            ax.plot(xs, ys, style, marker="o", markersize=3,
                    label=f"{r['engine']}, {budget(r)}{batches(r)} (final greedy BLEU {r['greedy']['bleu']:.1f})")
        ax.set_title(f"{corpus}: dev BLEU during training ({records[0].get('cpu', '')}, "
                     f"{records[0].get('threads')} threads)", fontsize=9)
        ax.set_xlabel("training wall-clock (minutes)")
        ax.set_ylabel("dev BLEU (greedy)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    import os

    from .. import cli, train
    from .harness import cpu_model

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--plot" in argv:      # --plot OUT.png RECORDS.jsonl...: draw committed records, no training
        i = argv.index("--plot")
        path, files = argv[i + 1], argv[:i] + argv[i + 2:]
        plot([r for r in read_records(files) if "curve" in r], path)
        print(f"plot written to {path}", file=sys.stderr)
        return 0
    if "--compare" in argv:   # --compare RECORDS.jsonl...: ours against PyTorch in committed records
        for row in compare(read_records(f for f in argv if f != "--compare")):
            print(json.dumps(row))
        return 0
    options = pop_options(argv, {"--engine": "ours", "--json": None})
    engine = options["--engine"]
    if engine not in ("ours", "torch"):
        raise SystemExit("--engine must be ours or torch")
    args = cli.build_parser().parse_args(["train", *argv])
    if not train.has_data(args):
        raise SystemExit("--data is required")
    if args.threads:
        import transformer as T

        T.set_num_threads(args.threads)
        if engine == "torch":
            import torch

            torch.set_num_threads(args.threads)
    if not args.eval_every:
        args.eval_every = 50          # the curve: dev BLEU every 50 steps (not counted as training time)
    train.load_resume(args)
    train.apply_defaults(args)            # the defaults a user gets with --data
    train.prepare_out_dir(args)
    np.seterr(all="ignore")
    print(f"engine: {engine}", file=sys.stderr)
    report = {}
    status = train.train_on_data(args, engine=None if engine == "ours" else torch_engine(args.seed), result=report)
    if status:
        return status
    trainer = report["trainer"]
    final = report["record"].get("final", report["record"])    # the raw weights, with --average-last too
    beam = trainer.evaluate(beam=4)
    samples = [s for s, _ in trainer.dev[:5]] + ["How are you?", "The king went to the city."]
    record = {"engine": engine, "data": os.path.basename(train.describe_data(args)), "preset": args.preset,
              "precision": args.precision, "size": report["record"].get("size"), "cpu": cpu_model(),
              "threads": args.threads, "minutes": args.minutes, "schedule": trainer.state.schedule,
              "batch_tokens": args.batch_tokens, "vocab": args.vocab_size, "dropout": trainer.model.cfg.dropout,
              "norm": trainer.model.cfg.norm, "fix_norm": trainer.model.cfg.fix_norm,
              "steps": trainer.state.step, "tokens": trainer.state.tokens, "seconds": trainer.state.seconds,
              "dev_loss": report["record"].get("dev_loss"), "dev_pairs": len(trainer.dev),
              "greedy": {k: final.get(k) for k in ("bleu", "chrf")},
              "beam4": {k: beam.get(k) for k in ("bleu", "chrf")},
              "samples": [f"{s}  ->  {h}" for s, h in zip(samples, trainer.translate(samples, beam=4))],
              "curve": curve(args.out)}
    if "final" in report["record"]:
        record["dev_loss"] = final.get("dev_loss")
        record["averaged_last"] = {"k": args.average_last, "snapshot_every": trainer.snapshot_every(),
                                   **{k: report["record"].get(k) for k in ("dev_loss", "bleu", "chrf")}}
        record["best_dev_loss_periodic"] = trainer.state.best_dev_loss
        with trainer.scoring(trainer.model_for_inference):
            averaged_beam = trainer.evaluate(beam=4)
        record["averaged_last"]["beam4"] = {k: averaged_beam.get(k) for k in ("bleu", "chrf")}
    write_record(record, options["--json"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
