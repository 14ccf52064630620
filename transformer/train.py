"""Training loop: teacher forcing, Adam with the warm-up schedule (section 5.3),
label smoothing (section 5.4), periodic evaluation and resumable checkpoints.

Every source of randomness is a function of (seed, step) or of state stored in
the checkpoint, so `--resume` continues with exactly the losses an uninterrupted
run would have had.
"""
import contextlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass

import numpy as np

from . import _C, datasets
from .checkpoint import (BEST_DIR, CHECKPOINT_FILE, LOG_FILE, average_weights, clear_run, list_snapshots,
                         load_checkpoint, save_checkpoint, save_inference_files, save_snapshot,
                         snapshot_path)
from .config import DROPOUT_FREE_PASSES, HEAVY_DROPOUT, HEAVY_DROPOUT_PASSES, PRESETS, ModelConfig
from .data import HEADER_CHOICES, collate, length_batches, make_example
from .errors import FlagError, blame
from .model import Seq2SeqTransformer
from .optim import Adam, budget_lr, clip_grad_norm, noam_lr
from .tasks import ReverseTask

SIZE_FLAGS = ("d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers", "dropout", "activation",
              "norm_first", "tie_embeddings")


# The budget schedule (the default with --data): warm-up over this share of the budget, peak
# learning rate PEAK_LR_FACTOR * d_model^-0.5 (the paper's schedule peaks at d_model^-0.5 *
# warmup^-0.5: 1e-3 for d_model 256 with its 4000 warm-up steps; a 10-minute budget with pre-LN
# takes twice that: on the Bible corpus, `small`, dev BLEU 2.62 at peak 2e-3 against 1.42 at 1e-3
# and 1.99 at 3e-3), linear decay to FINAL_LR_SHARE of the peak at the end of the budget.
WARMUP_SHARE = 0.05
MIN_WARMUP = 10
PEAK_LR_FACTOR = 0.032
FINAL_LR_SHARE = 0.1
SNAPSHOT_SHARE = 0.025   # --average-last: a snapshot every 2.5% of the planned steps
PROBE_STEPS = 2          # forward/backward passes timed (not trained on) to estimate the step rate


class NonFiniteLoss(RuntimeError):
    pass


@dataclass
class TrainState:
    """Where training is: saved in every checkpoint."""
    step: int = 0          # optimizer steps taken
    epoch: int = 0         # data passes started (real data only)
    batch_in_epoch: int = 0
    tokens: int = 0        # target tokens trained on
    seconds: float = 0.0   # wall-clock seconds spent training, over all runs
    best_dev_loss: float = float("inf")
    schedule: dict = None  # the learning-rate plan, fixed before step 1 (see plan_schedule)


class StopFlag:
    """SIGINT/SIGTERM ask the loop to stop after the current step, save, and exit."""

    def __init__(self):
        self.signal = None
        self.remote = False       # data parallel: the signal came to another rank
        self._previous = {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.signal is not None:        # a second Ctrl-C: stop now
            raise KeyboardInterrupt
        self.signal = signum

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


def model_config_from_args(args, src_vocab, tgt_vocab, max_len):
    preset = dict(PRESETS[args.preset])
    for name in SIZE_FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            preset[name] = value
    return ModelConfig(src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab, max_len=max_len, **preset)


def describe(model):
    cfg = model.cfg
    return (f"model: d_model {cfg.d_model}, {cfg.n_heads} heads, d_ff {cfg.d_ff}, "
            f"{cfg.n_encoder_layers}+{cfg.n_decoder_layers} layers{', pre-LN' if cfg.norm_first else ''}, "
            f"{model.num_parameters():,} parameters; "
            f"threads {_C.get_num_threads()} ({_C.isa()})")


# Under mpirun, only rank 0 talks: the others set this (see _data_parallel).
_SILENT = False
REPLICA_CHECK_EVERY = 200   # data parallel: steps between checks that every rank holds the same weights


def _log(message, stream=None):
    if not _SILENT:
        print(message, file=stream or sys.stderr, flush=True)


class Trainer:
    """Owns the model, optimizer, data stream and checkpoints of one run."""

    def __init__(self, args, model, optimizer, src_tokenizer, tgt_tokenizer, data, dev, state=None, task=None,
                 clip=clip_grad_norm, checkpoints=True, dp=None):
        self.args = args
        self.precision = getattr(args, "precision", None) or "fp32"
        self.model = model
        self.optimizer = optimizer
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.data = data                             # a corpus.TrainingSet (real data), or None
        self.dev = dev                               # list of (src_text, tgt_text)
        self.state = state or TrainState()
        self.task = task
        self.clip = clip                    # (model, max_norm) -> global norm before clipping
        self.checkpoints = checkpoints      # False for the PyTorch comparison runs
        # --average-last snapshots: ours, and the PyTorch comparison's engine (which saves a copy of
        # its weights in our format), so that both average the same way
        self.snapshots = checkpoints or callable(getattr(model, "save", None))
        self.dp = dp                        # a DataParallel under mpirun: this rank trains on its shard
        self.leader = dp is None or dp.rank == 0   # logs, evaluates and writes checkpoints
        self.model_for_inference = None     # with --average-last: the averaged model, after run()
        # (source, target) language codes, written beside the model for `serve` (or None)
        src_lang, tgt_lang = getattr(args, "src_lang", None), getattr(args, "tgt_lang", None)
        self.languages = (src_lang, tgt_lang) if src_lang and tgt_lang else None
        # --overwrite: this run replaces the run or model in --out (checkpoint.clear_run as it
        # begins), unless it continues that very run (--resume into its own directory)
        resume = getattr(args, "resume", None)
        self.replaces_run = bool(getattr(args, "overwrite", False)) and checkpoints and not (
            resume and os.path.realpath(resume) == os.path.realpath(args.out))

    # -- data ---------------------------------------------------------------------------------
    def next_batch(self):
        """The batch for the current state; advances the data position."""
        cfg = self.model.cfg
        if self.task is not None:
            rng = np.random.default_rng([self.args.seed, self.state.step])
            pairs = self._shard(self.task.sample(rng, self.args.batch_size))
            examples = [make_example(self.src_tokenizer.encode(s), self.tgt_tokenizer.encode(t),
                                     cfg.bos_id, cfg.eos_id) for s, t in pairs]
            return collate(examples, range(len(examples)), cfg.pad_id) if examples else (None, None, None)
        batches = self.data.batches(self.state.epoch)
        if self.state.batch_in_epoch >= len(batches):
            self.state.epoch += 1
            self.state.batch_in_epoch = 0
            batches = self.data.batches(self.state.epoch)
        positions = self._shard(batches[self.state.batch_in_epoch])
        self.state.batch_in_epoch += 1
        return self.data.collate(positions) if len(positions) else (None, None, None)

    def _shard(self, items):
        """Data parallel: this rank's disjoint part of a global batch (every size-th sentence from
        its rank on; batches are sorted by length, so the parts have similar sizes)."""
        return items if self.dp is None else items[self.dp.rank::self.dp.size]

    def forward_backward(self, src, tgt_in, tgt_out):
        """One training pass on the current (part of the) batch; data parallel: the global one."""
        if self.dp is not None:
            return self.dp.forward_backward(src, tgt_in, tgt_out, label_smoothing=self.args.label_smoothing,
                                            precision=self.precision)
        return self.model.forward_backward(src, tgt_in, tgt_out, label_smoothing=self.args.label_smoothing,
                                           precision=self.precision)

    # -- the learning-rate schedule -------------------------------------------------------------
    def plan_schedule(self, budget_seconds=None):
        """Fix the learning-rate plan before step 1 and keep it in the train state, so that the
        checkpoint carries it and a resumed run follows it exactly.

        noam: the paper's inverse-square-root schedule (equation 3), --warmup steps.
        budget: the step count the budget allows (--max-steps, or --minutes divided by a measured
        step time), warm-up over WARMUP_SHARE of it, then linear decay to its end."""
        args, cfg = self.args, self.model.cfg
        if args.schedule == "noam":
            warmup = args.warmup or 4000
            plan = {"name": "noam", "warmup": warmup, "peak": args.lr_scale * noam_lr(warmup, cfg.d_model, warmup)}
        else:
            total, step_seconds = args.max_steps, None
            if budget_seconds is not None:
                step_seconds = self.measure_step_seconds()
                by_time = max(1, int(budget_seconds / step_seconds))
                total = by_time if total is None else min(total, by_time)
            if total is None:
                raise ValueError("--schedule budget needs a budget: --max-steps or --minutes")
            warmup = args.warmup or max(MIN_WARMUP, round(WARMUP_SHARE * total))
            warmup = min(warmup, total)
            peak = args.lr if args.lr is not None else PEAK_LR_FACTOR * cfg.d_model ** -0.5
            plan = {"name": "budget", "warmup": int(warmup), "total": int(total), "peak": args.lr_scale * peak,
                    "final": FINAL_LR_SHARE}
            if step_seconds is not None:
                plan["estimated_step_seconds"] = round(step_seconds, 4)
                plan["replan_at"] = int(warmup)   # see replan_total
        self.state.schedule = plan
        return plan

    def measure_step_seconds(self):
        """Seconds per training step, timed on the next batches without training on them: the
        gradients are cleared and the data position and dropout stream are put back."""
        state = (self.state.epoch, self.state.batch_in_epoch)
        stream = getattr(self.model, "stream", None)
        calls = stream.calls if stream is not None else None
        times = []
        try:
            for _ in range(PROBE_STEPS + 1):     # the first pass also allocates: not timed
                src, tgt_in, tgt_out = self.next_batch()
                started = time.perf_counter()
                self.model.zero_grad()
                self.forward_backward(src, tgt_in, tgt_out)
                if self.args.clip_norm > 0:
                    self.clip(self.model, self.args.clip_norm)
                times.append(time.perf_counter() - started)
        finally:
            self.state.epoch, self.state.batch_in_epoch = state
            if stream is not None:
                stream.calls = calls
            self.model.zero_grad()
        # + the optimizer step and bookkeeping, a few percent of a step
        seconds = 1.03 * float(np.median(times[1:]))
        return seconds if self.dp is None else self.dp.bcast_object(seconds)   # rank 0's clock plans

    def replan_total(self, seconds_per_step, seconds_left):
        """At the end of warm-up, a time-bounded plan re-estimates its step count from the steps
        actually taken (the probe sees two batches; real steps include the optimizer, checkpoints,
        batches of every length). The learning rates of steps already taken do not change."""
        plan = self.state.schedule
        total = self.state.step + max(int(seconds_left / seconds_per_step), 0)
        if self.args.max_steps is not None:
            total = min(total, self.args.max_steps)
        plan["total"] = max(int(total), plan["warmup"])
        plan["estimated_step_seconds"] = round(seconds_per_step, 4)
        del plan["replan_at"]

    def choose_dropout(self, stream=None):
        """A new run on data without --dropout: no dropout when the plan sees the training pairs
        fewer than DROPOUT_FREE_PASSES times, HEAVY_DROPOUT when it sees them HEAVY_DROPOUT_PASSES
        times or more, else the model's 0.1 (see DROPOUT_FREE_PASSES)."""
        plan = self.state.schedule
        if getattr(self.args, "dropout", 0.0) is not None or self.task is not None or "total" not in plan:
            return
        passes = plan["total"] / max(len(self.data.batches(self.state.epoch)), 1)
        if passes < DROPOUT_FREE_PASSES:
            self.model.set_dropout(0.0)
            _log(f"dropout 0: the plan sees the training pairs {passes:.1f} times (fewer than "
                 f"{DROPOUT_FREE_PASSES:g}: nothing to regularise yet; --dropout to choose)", stream)
        elif passes >= HEAVY_DROPOUT_PASSES:
            self.model.set_dropout(HEAVY_DROPOUT)
            _log(f"dropout {HEAVY_DROPOUT:g}: the plan sees the training pairs {passes:.1f} times "
                 f"({HEAVY_DROPOUT_PASSES:g} or more: a small corpus to learn, not to memorise; "
                 "--dropout to choose)", stream)
        else:
            _log(f"dropout {self.model.cfg.dropout:g}: the plan sees the training pairs {passes:.1f} times", stream)

    def learning_rate(self, step):
        plan = self.state.schedule
        if plan["name"] == "noam":
            return self.args.lr_scale * noam_lr(step, d_model=self.model.cfg.d_model, warmup=plan["warmup"])
        return budget_lr(step, plan["peak"], plan["warmup"], plan["total"], plan["final"])

    def describe_schedule(self):
        plan = self.state.schedule
        if plan["name"] == "noam":
            return (f"schedule: noam (the paper's), warm-up {plan['warmup']} steps, "
                    f"peak learning rate {plan['peak']:.2e} at step {plan['warmup']}")
        how = ""
        if "estimated_step_seconds" in plan:
            how = f", from {plan['estimated_step_seconds']:.2f} s a step measured"
        return (f"schedule: budget, about {plan['total']} steps{how}; warm-up {plan['warmup']} steps "
                f"to peak learning rate {plan['peak']:.2e}, then linear decay to "
                f"{plan['peak'] * plan['final']:.2e} at step {plan['total']}")

    # -- one step -----------------------------------------------------------------------------

    def step(self):
        src, tgt_in, tgt_out = self.next_batch()
        self.model.zero_grad()
        loss = self.forward_backward(src, tgt_in, tgt_out)
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"non-finite loss ({loss}) at step {self.state.step + 1}")
        if self.args.clip_norm > 0:
            norm = self.clip(self.model, self.args.clip_norm)
            if not math.isfinite(norm):
                raise NonFiniteLoss(f"non-finite gradient norm ({norm}) at step {self.state.step + 1}")
        self.state.step += 1
        lr = self.learning_rate(self.state.step)
        self.optimizer.step(lr=lr)
        if self.dp is not None:
            tokens = self.dp.last_target_count       # every rank's part
        else:
            tokens = int((tgt_out != self.model.cfg.pad_id).sum())
        self.state.tokens += tokens
        return loss, tokens, lr

    # -- evaluation ---------------------------------------------------------------------------
    def translate(self, texts, beam=1, max_len=None):
        return translate_texts(self.model, self.src_tokenizer, self.tgt_tokenizer, texts, beam=beam,
                               max_len=max_len)

    def evaluate(self, limit=None, beam=1):
        """Dev loss and, with sacrebleu, BLEU and chrF of greedy (or beam) translations."""
        dev = self.dev[:limit] if limit else self.dev
        if not dev:
            return {}
        cfg = self.model.cfg
        examples = [make_example(self.src_tokenizer.encode(s)[:cfg.max_len],
                                 self.tgt_tokenizer.encode(t)[:cfg.max_len - 1], cfg.bos_id, cfg.eos_id)
                    for s, t in dev]
        total, count = 0.0, 0
        for indices in length_batches(examples, self.args.batch_tokens, shuffle=False):
            src, tgt_in, tgt_out = collate(examples, indices, cfg.pad_id)
            logits = self.model.forward(src, tgt_in)
            loss, n = _C.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1),
                                       ignore_index=cfg.pad_id)
            total, count = total + loss * n, count + n
        result = {"dev_loss": total / max(count, 1)}
        hyps = self.translate([s for s, _ in dev], beam=beam)
        result.update(score_translations(hyps, [t for _, t in dev]))
        return result

    @contextlib.contextmanager
    def scoring(self, model):
        """evaluate() and translate() use `model` (e.g. the --average-last average) inside the block;
        the trained model comes back after it."""
        trained, self.model = self.model, model
        try:
            yield self
        finally:
            self.model = trained

    # -- checkpoints --------------------------------------------------------------------------
    def save(self):
        if not self.checkpoints or not self.leader:
            return
        args = {k: v for k, v in vars(self.args).items() if k not in ("checkpoint", "initial", "func")}
        save_checkpoint(self.args.out, self.model, self.optimizer, self.state.__dict__,
                        self.src_tokenizer, self.tgt_tokenizer, args)
        save_inference_files(self.args.out, self.model, self.src_tokenizer, self.tgt_tokenizer,
                             languages=self.languages)

    # -- checkpoint averaging and the best model -----------------------------------------------
    def snapshot_every(self):
        plan = self.state.schedule
        if self.args.snapshot_every:
            return self.args.snapshot_every
        return max(1, round(SNAPSHOT_SHARE * plan.get("total", plan["warmup"])))

    def write_average(self, stream=None):
        """The inference model in --out becomes the mean of the last --average-last snapshots (the
        final weights among them); the checkpoint keeps the raw weights, for --resume."""
        k = self.args.average_last
        if self.state.step and not os.path.isdir(snapshot_path(self.args.out, self.state.step)):
            save_snapshot(self.args.out, self.state.step, self.model, keep=k)
        snapshots = list_snapshots(self.args.out)[-k:]
        model = average_weights([Seq2SeqTransformer.load(path) for path in snapshots])
        save_inference_files(self.args.out, model, self.src_tokenizer, self.tgt_tokenizer, languages=self.languages)
        _log(f"the model in {self.args.out} is the average of {len(snapshots)} snapshots (steps "
             + ", ".join(str(int(os.path.basename(p)[5:])) for p in snapshots) + ")", stream)
        if len(snapshots) < k:
            _log(f"warning: --average-last {k} found only {len(snapshots)} snapshot"
                 f"{'s' if len(snapshots) != 1 else ''}: the run was shorter than {k} x --snapshot-every "
                 f"({self.snapshot_every()} steps)" + (", so the model is the final weights" if len(snapshots) == 1 else ""),
                 stream)
        return model

    def keep_if_best(self, metrics):
        loss = metrics.get("dev_loss")
        if loss is not None and loss < self.state.best_dev_loss:
            self.state.best_dev_loss = loss
            if self.checkpoints:
                save_inference_files(os.path.join(self.args.out, BEST_DIR), self.model, self.src_tokenizer,
                                     self.tgt_tokenizer, languages=self.languages)
            return True
        return False

    # -- the loop -----------------------------------------------------------------------------
    def _truncate_log(self, log):
        """On resume, drop log lines of steps after the checkpoint (they will be redone)."""
        path = log.name
        log.flush()
        with open(path, encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
        kept = []
        for line in lines:
            try:
                if json.loads(line).get("step", 0) <= self.state.step:
                    kept.append(line if line.endswith("\n") else line + "\n")
            except ValueError:      # a line cut short by a crash
                pass
        if len(kept) != len(lines):
            log.seek(0)
            log.truncate()
            log.writelines(kept)
            log.flush()

    def run(self, stream=None):
        args, dp = self.args, self.dp
        deadline = None if args.minutes is None else time.monotonic() + 60.0 * args.minutes
        max_steps = args.max_steps
        if self.state.schedule is None:
            self.plan_schedule(None if args.minutes is None else 60.0 * args.minutes)
            if args.minutes is not None:
                self.state.schedule["budget_seconds"] = 60.0 * args.minutes
            self.choose_dropout(stream)
        _log(self.describe_schedule(), stream)
        if self.precision != "fp32":
            _log(f"precision: {self.precision} (GEMM operands in bfloat16, float32 sums; weights, optimizer "
                 "and checkpoints float32)", stream)
        run_start, run_start_step = time.monotonic(), self.state.step
        from tqdm import tqdm

        bar = tqdm(total=max_steps, initial=min(self.state.step, max_steps or 0) if max_steps else 0,
                   unit="step", dynamic_ncols=True, file=stream or sys.stderr, disable=args.quiet or not self.leader,
                   mininterval=0.5)
        last_save = time.monotonic()
        window_tokens, window_start = 0, time.perf_counter()
        status = 0
        if self.leader:
            if self.replaces_run:   # --overwrite: the run or model in --out goes as this one begins
                clear_run(args.out)
                self.replaces_run = False
            log = open(os.path.join(args.out, LOG_FILE), "a", encoding="utf-8")
            self._truncate_log(log)
        else:
            log = open(os.devnull, "w", encoding="utf-8")
        with StopFlag() as stop, log:
            try:
                while True:
                    if max_steps is not None and self.state.step >= max_steps:
                        break
                    save_now = bool(args.save_minutes) and time.monotonic() - last_save >= 60 * args.save_minutes
                    out_of_time = deadline is not None and time.monotonic() >= deadline
                    if dp is not None:
                        # Ranks stop, and rank 0 saves, at the same step: rank 0's clock decides, and a
                        # signal to any rank stops them all. Only the agreed flag stops a rank: a
                        # signal that lands after the vote is in the next step's (a rank that read
                        # its own flag here stopped alone, and the others waited for it forever in
                        # the step's all-reduce while it sat in MPI_Finalize).
                        out_of_time, save_now, signum = dp.max_flags(
                            [self.leader and out_of_time, self.leader and save_now, stop.signal or 0])
                        if signum:
                            if stop.signal is None:
                                stop.signal, stop.remote = signum, True
                            status = self._stopped_by_signal(stop, bar, stream)
                            break
                    if out_of_time:
                        break
                    started = time.perf_counter()
                    loss, tokens, lr = self.step()
                    self.state.seconds += time.perf_counter() - started
                    log.write(json.dumps({"step": self.state.step, "loss": loss, "lr": lr, "tokens": tokens}) + "\n")
                    plan = self.state.schedule
                    if "replan_at" in plan and self.state.step >= plan["replan_at"] and deadline is not None:
                        now = time.monotonic()
                        per_step = (now - run_start) / max(self.state.step - run_start_step, 1)
                        self.replan_total(per_step, deadline - now)
                        if dp is not None:            # every rank follows rank 0's plan
                            self.state.schedule = plan = dp.bcast_object(plan)
                        bar.write(f"step {self.state.step}: {per_step:.2f} s a step so far: about "
                                  f"{plan['total']} steps in the budget; decay to step {plan['total']}")
                    log.flush()
                    window_tokens += tokens
                    bar.update(1)
                    elapsed = time.perf_counter() - window_start
                    if elapsed >= 1.0 or self.state.step == 1:
                        bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{window_tokens / elapsed:,.0f}",
                                        lr=f"{lr:.2e}", refresh=False)
                        window_tokens, window_start = 0, time.perf_counter()
                    if dp is not None and self.state.step % REPLICA_CHECK_EVERY == 0:
                        dp.check_replicas(self.state.step, self.optimizer)
                    if args.eval_every and self.state.step % args.eval_every == 0:
                        eval_started = time.monotonic()
                        if self.leader:
                            metrics = self.evaluate(limit=args.eval_limit)
                            metrics["seconds"] = round(self.state.seconds, 2)
                            if args.keep_best:
                                metrics["best"] = self.keep_if_best(metrics)
                            bar.write(f"step {self.state.step}: " + json.dumps(_rounded(metrics)))
                            log.write(json.dumps({"step": self.state.step, **metrics}) + "\n")
                        if dp is not None:
                            dp.sync("rank 0's evaluation")
                        if deadline is not None:     # periodic evaluation is not training time
                            deadline += time.monotonic() - eval_started
                    if args.average_last and self.snapshots and self.state.step % self.snapshot_every() == 0:
                        if self.leader:
                            save_snapshot(args.out, self.state.step, self.model, keep=args.average_last)
                        if dp is not None:
                            dp.sync("rank 0's snapshot")
                    if (args.save_every and self.state.step % args.save_every == 0) or save_now:
                        self.save()
                        if dp is not None:
                            dp.sync("rank 0's checkpoint")
                        last_save = time.monotonic()
                    if stop.signal is not None and dp is None:
                        status = self._stopped_by_signal(stop, bar, stream)
                        break
            except NonFiniteLoss as exc:
                bar.close()
                saved = os.path.exists(os.path.join(args.out, CHECKPOINT_FILE))
                advice = (f"the last checkpoint in {args.out} is left as it was: lower the learning rate "
                          "(--lr, --lr-scale) or clip gradients (--clip-norm) and --resume it"
                          if saved else "no checkpoint was written: lower the learning rate (--lr, "
                          "--lr-scale) or clip gradients (--clip-norm) and start again")
                # the command line's one-line form of an expected failure; run() returns its status
                _log(f"transformer train: error: training stopped: {exc}; {advice}")
                return 1
            finally:
                bar.close()
        self.save()
        if dp is not None and dp.stats["seconds"] > 0:
            st = dp.stats
            _log(f"data parallel over {dp.size} ranks: of the training passes, {st['wait_seconds'] / st['seconds']:.1%} "
                 f"waited for the gradient all-reduce (after the backward pass: {st['buckets'] // max(st['calls'], 1)} "
                 f"buckets a step) and {st['imbalance_seconds'] / st['seconds']:.1%} for slower ranks", stream)
        if self.checkpoints:
            _log(f"saved checkpoint at step {self.state.step} to {args.out}")
        if args.average_last and self.snapshots and status == 0 and self.leader:
            self.model_for_inference = self.write_average(stream)
        return status

    def _stopped_by_signal(self, stop, bar, stream):
        name = signal.Signals(stop.signal).name
        bar.close()
        where = " by another rank" if stop.remote else ""
        _log(f"{name} received{where}: saving a checkpoint at step {self.state.step} and stopping", stream)
        return 128 + stop.signal


def _rounded(metrics):
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in metrics.items()}


def score_translations(hyps, refs, signatures=False):
    """Corpus BLEU and chrF of hyps against one reference each (sacrebleu's defaults); with
    signatures, also sacrebleu's signature of each (tokenizer, smoothing, version: what makes a
    figure comparable with another) under "signature"."""
    from sacrebleu.metrics import BLEU, CHRF

    metrics = {"bleu": BLEU(), "chrf": CHRF()}
    scores = {name: metric.corpus_score(hyps, [refs]).score for name, metric in metrics.items()}
    if signatures:
        scores["signature"] = {name: str(metric.get_signature()) for name, metric in metrics.items()}
    return scores


# Where a text too long for the model's positions is cut (split_to_fit): after the end of a
# sentence, else after a clause, else before a word.
SENTENCE_ENDS = tuple(".!?\u0964\u3002\u061f")       # . ! ? and the danda, ideographic full stop, Arabic ?
CLAUSE_ENDS = tuple(",;:\u060c\u3001")
CLOSERS = "\u2581 \"')]}\u00bb\u201d\u2019"          # the word-start mark, closing quotes and brackets


def split_to_fit(ids, limit, tokenizer=None):
    """`ids` cut into pieces of at most `limit` ids, each cut after the last sentence punctuation
    that fits, else after the last clause punctuation, else before the last word start (with a
    tokenizer to read the subwords), else at `limit`. No ids, no pieces."""
    ids = list(ids)
    if len(ids) <= limit:
        return [ids] if ids else []
    tokens = tokenizer.tokens(ids) if hasattr(tokenizer, "tokens") else None
    pieces, start = [], 0
    while len(ids) - start > limit:
        cut = start + limit
        if tokens is not None:
            tests = (lambda c: tokens[c - 1].rstrip(CLOSERS).endswith(SENTENCE_ENDS),
                     lambda c: tokens[c - 1].rstrip(CLOSERS).endswith(CLAUSE_ENDS),
                     lambda c: tokens[c].startswith("\u2581") or tokens[c - 1].isspace())
            for test in tests:
                found = next((c for c in range(start + limit, start, -1) if test(c)), None)
                if found is not None:
                    cut = found
                    break
        pieces.append(ids[start:cut])
        start = cut
    pieces.append(ids[start:])
    return pieces


def text_pieces(model, src_tokenizer, text):
    """A text's source ids in the pieces that fit the model's positions (split_to_fit); none for a
    blank text. What translate_texts and the server (serve/scheduler.py) decode."""
    ids = src_tokenizer.encode(text) if text.strip() else []
    return split_to_fit(ids, model.cfg.max_len, src_tokenizer)


def decode_pieces(model, pieces, beam, max_len, no_repeat_ngram, precision):
    """(padded src, hypotheses) of source id lists decoded together: beam search for beam > 1,
    else greedy; max_len None: the model's own limit per sentence, relative to its source length."""
    src = collate([(ids, [], []) for ids in pieces], range(len(pieces)), model.cfg.pad_id)[0]
    if beam > 1:
        return src, model.beam_search(src, beam_size=beam, max_len=max_len, no_repeat_ngram=no_repeat_ngram,
                                      precision=precision)
    return src, model.greedy_decode(src, max_len=max_len, no_repeat_ngram=no_repeat_ngram, precision=precision)


def translate_texts(model, src_tokenizer, tgt_tokenizer, texts, beam=1, max_len=None, batch_size=64,
                    on_split=None, no_repeat_ngram=0, precision="fp32"):
    """Translate a list of strings, batching sentences of similar length; results in input order.

    An empty or blank text translates to "". A text of more subwords than the model has positions
    (cfg.max_len) is translated in pieces that fit (split_to_fit), joined by spaces, and
    on_split(index, subwords, pieces) is called for it. A batch holds batch_size sentences, fewer
    with more than 4 beams: at most batch_size * 4 decoder rows (sentences x beams), so that a
    wide beam does not multiply the caches' memory."""
    if beam > 4:
        batch_size = max(1, batch_size * 4 // beam)
    encoded, owner = [], []         # the pieces to translate, and the index of the text of each
    for index, text in enumerate(texts):
        pieces = text_pieces(model, src_tokenizer, text)
        if len(pieces) > 1 and on_split is not None:
            on_split(index, sum(map(len, pieces)), len(pieces))
        encoded += pieces
        owner += [index] * len(pieces)
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))
    results = [None] * len(encoded)
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        _, hyps = decode_pieces(model, [encoded[i] for i in chunk], beam, max_len, no_repeat_ngram, precision)
        for i, hyp in zip(chunk, hyps):
            results[i] = tgt_tokenizer.decode(hyp)
    joined = [[] for _ in texts]
    for index, result in zip(owner, results):
        joined[index].append(result)
    return [" ".join(parts) for parts in joined]


# -- entry points used by the CLI ------------------------------------------------------------------

# What a run's trajectory depends on: taken from the checkpoint when resuming, so that the resumed
# run repeats the uninterrupted one. Everything else (--max-steps, --minutes, --threads, --out,
# evaluation and checkpoint frequency) may change between runs.
TRAJECTORY_ARGS = ("data", "src_file", "tgt_file", "src_col", "tgt_col", "header", "bpe_sample", "src_lang",
                   "tgt_lang", "seed", "batch_size", "batch_tokens", "warmup",
                   "schedule", "lr", "lr_scale", "label_smoothing", "clip_norm", "vocab_size", "max_sentence_tokens",
                   "dev_fraction", "dev_max", "preset") + SIZE_FLAGS


# Flags that only the runs on --data read, and those that only the built-in task reads.
DATA_ONLY_ARGS = ("src_col", "tgt_col", "header", "bpe_sample", "src_lang", "tgt_lang", "batch_tokens", "vocab_size", "max_sentence_tokens", "dev_fraction",
                  "dev_max", "samples", "init_from")
BUILTIN_ONLY_ARGS = ("batch_size",)


def _flag(key):
    return "--" + key.replace("_", "-")


def refuse_flags_that_do_not_apply(args, data):
    """A flag the run would not read is refused (FlagError), not silently ignored."""
    for key in DATA_ONLY_ARGS:
        if not data and getattr(args, key, None) is not None:
            raise FlagError(f"{_flag(key)} applies only with --data (the built-in task generates its own "
                            "sentences, vocabulary and batches)")
    for key in BUILTIN_ONLY_ARGS:
        if data and getattr(args, key, None) is not None:
            raise FlagError(f"{_flag(key)} applies only to the built-in task; with --data, batches hold "
                            "--batch-tokens tokens")


def _started_with(ckpt, key):
    """The value of a trajectory argument in the run that wrote the checkpoint."""
    if key in SIZE_FLAGS:
        return getattr(ckpt.model.cfg, key)          # the preset's size when the flag was not given
    plan = ckpt.train_state.get("schedule") or {}
    if key == "warmup" and "warmup" in plan:
        return plan["warmup"]
    return ckpt.args[key]


def load_initial_model(args):
    """With --init-from DIR: the model and tokenizers to fine-tune (a model directory: one trained
    here, or imported with `transformer convert --from marian`). Its sizes and vocabularies are
    the run's, so the flags that would set them are refused."""
    from .checkpoint import load_for_inference

    for key in ("preset", "vocab_size") + tuple(k for k in SIZE_FLAGS if k != "dropout"):
        if getattr(args, key, None) is not None:
            raise FlagError(f"{_flag(key)}: the model's sizes and vocabularies come from --init-from "
                            f"{args.init_from} (leave the flag out)")
    with blame("--init-from", args.init_from):
        if not os.path.isdir(args.init_from):
            raise FileNotFoundError("no such model directory")
        if not os.path.exists(os.path.join(args.init_from, "config.json")):
            raise FileNotFoundError("no config.json in it: not a model directory (train --out, or "
                                    "transformer convert --out)")
        args.initial = load_for_inference(args.init_from)
    if args.initial[0].stored_precision != "fp32":
        raise FlagError(f"--init-from {args.init_from}: an int8 model (its weights rounded for decoding) "
                        "cannot be trained; start from the float32 model it was quantized from")
    positions = args.initial[0].cfg.max_len
    if args.max_sentence_tokens is not None and args.max_sentence_tokens > positions - 1:
        # left out, the default is cut to fit the model's positions (train_on_data); given, it is a
        # request the model cannot honour
        raise FlagError(f"--max-sentence-tokens {args.max_sentence_tokens}: the model in --init-from "
                        f"{args.init_from} has {positions} positions, so at most {positions - 1}")


def load_resume(args):
    """With --resume: load the checkpoint once and take the trajectory arguments from it. A
    trajectory flag given with another value than the interrupted run's is refused (FlagError),
    and so is any flag the run would not read (refuse_flags_that_do_not_apply)."""
    args.initial = None
    directory = prepared_dir(args) if args.data else None
    if directory is not None:
        held = check_prepared_flags(args, directory)
    if not args.resume:
        args.checkpoint = None
        refuse_flags_that_do_not_apply(args, has_data(args))
        if directory is not None:          # a new run takes the prepared split and vocabulary size
            for key, value in held.items():
                if getattr(args, key, None) is None and not (key == "vocab_size" and getattr(args, "init_from", None)):
                    setattr(args, key, value)
        if getattr(args, "init_from", None):
            load_initial_model(args)
        return
    if getattr(args, "init_from", None):
        raise FlagError(f"--init-from {args.init_from}: a resumed run continues the weights of its "
                        f"checkpoint ({args.resume}); --init-from starts a new run (with --out)")
    ckpt = load_checkpoint(args.resume)
    if "schedule" not in ckpt.args:
        ckpt.args["schedule"] = "noam"     # written before the budget schedule existed
    started_on_data = ckpt.args.get("data") or ckpt.args.get("src_file")
    if has_data(args) and "data" in ckpt.args and not started_on_data:
        raise FlagError(f"--data {describe_data(args)}: the run in {args.resume} trained on the built-in task; "
                        "start a new run (--out) to train on data")
    refuse_flags_that_do_not_apply(args, has_data(args) or started_on_data)
    moved = has_data(args)
    for key in TRAJECTORY_ARGS:
        if key in ("data", "src_file", "tgt_file") and moved:
            continue           # the same corpus may have moved (or been prepared meanwhile)
        if directory is not None and key in CORPUS_READING_FLAGS:
            continue           # how the files were read: the prepared directory's business
        if key in ckpt.args:
            given, started = getattr(args, key, None), _started_with(ckpt, key)
            if given is not None and given != started:
                was = "without it" if started is None else f"with {started}"
                raise FlagError(f"{_flag(key)} {given}: the run in {args.resume} started {was}, and a resumed "
                                "run keeps its settings (leave the flag out, or start a new run with --out)")
            setattr(args, key, ckpt.args[key])
    args.checkpoint = ckpt


def apply_defaults(args):
    """The defaults that depend on other flags (and, with --resume, on the checkpoint), and those
    left out of the parser so that a flag given can be told from one left out (cli.TRAIN_DEFAULTS)."""
    from .cli import TRAIN_DEFAULTS

    if args.eval_limit is not None and not args.eval_every:
        raise FlagError("--eval-limit sets how many dev sentences periodic evaluation translates: it "
                        "needs --eval-every N")
    if has_data(args) and args.dev_fraction == 0:   # no dev split: what reads one would do nothing
        for flag, value in (("--eval-every", args.eval_every), ("--dev-max", args.dev_max)):
            if value:
                raise FlagError(f"{flag} {value}: --dev-fraction 0 holds no pairs out, so there is no dev "
                                "split to evaluate on")
    for key, value in TRAIN_DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.schedule is None:
        args.schedule = "noam" if not has_data(args) else "budget"
    if args.norm_first is None and has_data(args) and args.checkpoint is None:
        # Pre-LN escapes the early unigram plateau sooner: on the Bible corpus, preset small, 150
        # steps of the budget schedule, dev loss 6.00 against post-LN's 6.28 (same data and seed).
        args.norm_first = True
    if args.precision is None:   # resume: the interrupted run's precision, unless another is asked for
        started = args.checkpoint.args.get("precision") if args.checkpoint is not None else None
        args.precision = started or "fp32"
    if args.precision == "int8":
        raise FlagError("--precision int8 is for decoding (translate, evaluate); train takes fp32 or bf16 "
                        "(bf16: every GEMM's operands in bfloat16, weights and optimizer in float32)")
    if args.minutes is None and args.max_steps is None:
        plan = args.checkpoint.train_state.get("schedule") if args.checkpoint is not None else None
        if plan and "budget_seconds" in plan:        # resume: finish the interrupted run's budget
            spent = args.checkpoint.train_state.get("seconds", 0.0)
            args.minutes = max(plan["budget_seconds"] - spent, 0.0) / 60.0
        elif plan and "total" in plan:
            args.max_steps = plan["total"]
        else:
            args.minutes = 2.0 if not has_data(args) else 10.0
    if args.warmup is None and args.schedule == "noam":
        args.warmup = 300 if not has_data(args) else 4000
    if args.checkpoint is None and getattr(args, "initial", None) is None:
        try:        # the sizes, checked before any data is read or vocabulary learned
            model_config_from_args(args, 16, 16, max_len=args.max_sentence_tokens + 1)
        except ValueError as exc:
            raise FlagError(f"model sizes: {exc}") from None
    if args.keep_best and not args.eval_every:
        raise FlagError("--keep-best keeps the model of the best dev loss: it needs --eval-every N")
    if args.schedule == "budget" and args.warmup is not None and args.max_steps is not None \
            and args.warmup > args.max_steps:
        raise FlagError(f"--warmup {args.warmup}: longer than the run (--max-steps {args.max_steps}); the budget "
                        "schedule would cut it short")
    if args.keep_best and args.max_steps is not None and args.eval_every > args.max_steps:
        raise FlagError(f"--keep-best with --eval-every {args.eval_every}: the run stops at --max-steps "
                        f"{args.max_steps}, before the first evaluation")
    if args.keep_best and has_data(args) and args.dev_fraction == 0:
        raise FlagError("--keep-best compares the dev loss, and --dev-fraction 0 holds no pairs out")
    if args.max_steps is not None and args.checkpoint is not None:
        done = args.checkpoint.train_state.get("step", 0)
        if args.max_steps <= done:
            raise FlagError(f"--max-steps {args.max_steps}: the run in {args.resume} has already trained "
                            f"{done} steps (--max-steps counts from the start of the run)")
    if args.snapshot_every and not args.average_last:
        raise FlagError("--snapshot-every only applies with --average-last K")
    if args.lr is not None and args.schedule != "budget":
        raise FlagError("--lr sets the peak of the budget schedule; with --schedule noam use --lr-scale")


def _world(args):
    """(rank, size) of this run: under mpirun with more than one rank, set by the command line."""
    return getattr(args, "world", None) or (0, 1)


def _agree(args, data_fingerprint):
    """Under mpirun: refuse to start unless every rank has the same settings, data and build."""
    if _world(args)[1] == 1:
        return
    from . import __version__
    from .distributed import agree, import_mpi

    keys = [k for k in TRAJECTORY_ARGS + SIZE_FLAGS + ("precision", "max_steps", "minutes", "preset",
                                                      "eval_every", "save_every", "save_minutes", "average_last",
                                                      "snapshot_every", "keep_best", "init_from")
            if k != "data"]
    description = {_flag(k): getattr(args, k, None) for k in dict.fromkeys(keys)}
    description.update({"data (fingerprint of the pairs)": data_fingerprint, "transformer version": __version__,
                        "SIMD level (TRANSFORMER_ISA)": _C.isa(),
                        "--resume (checkpoint step)": None if args.checkpoint is None else
                        args.checkpoint.train_state.get("step")})
    agree(import_mpi().COMM_WORLD, description)


def _data_parallel(args, model, optimizer):
    """Under mpirun with more than one rank: the model wrapped in a DataParallel, with rank 0's
    weights and optimizer state on every rank. None for one process."""
    if _world(args)[1] == 1:
        return None
    from .distributed import DataParallel

    dp = DataParallel(model)
    dp.broadcast_parameters()
    dp.broadcast_optimizer(optimizer)
    return dp


def _describe_world(dp):
    if dp is None:
        return ""
    return f"; data parallel over {dp.size} ranks, each on its part of every batch"


def _resume_or_new(args, make_model, src_tokenizer, tgt_tokenizer):
    if args.checkpoint is not None:
        ckpt = args.checkpoint
        model, optimizer = ckpt.model, ckpt.optimizer
        state = TrainState(**ckpt.train_state)
        return model, optimizer, ckpt.src_tokenizer, ckpt.tgt_tokenizer, state
    model = make_model()
    optimizer = Adam(model, lr=0.0, betas=(0.9, 0.98), eps=1e-9)
    return model, optimizer, src_tokenizer, tgt_tokenizer, TrainState()


def train_builtin(args):
    """The default run: learn the reverse task in a couple of minutes, then show it decoding."""
    task = ReverseTask()
    if args.dropout is None:
        args.dropout = 0.0   # every batch is fresh data: nothing to regularise, and it learns 3x faster
    _log("No --data given: training on the built-in task (reverse a word and capitalise it, "
         "'attention' -> 'NOITNETTA'), generated in process.")

    def make_model():
        cfg = model_config_from_args(args, task.src_tokenizer.vocab_size, task.tgt_tokenizer.vocab_size,
                                     max_len=task.max_len + 2)
        return Seq2SeqTransformer(cfg, seed=args.seed)

    _agree(args, "built-in task")
    model, optimizer, src_tok, tgt_tok, state = _resume_or_new(args, make_model, task.src_tokenizer,
                                                               task.tgt_tokenizer)
    dp = _data_parallel(args, model, optimizer)
    rng = np.random.default_rng([args.seed, 10**9])
    dev = task.sample(rng, 500)
    trainer = Trainer(args, model, optimizer, src_tok, tgt_tok, None, dev, state, task=task, dp=dp)
    _log(describe(model) + _describe_world(dp))
    status = trainer.run()
    if status or not trainer.leader:
        return status
    hyps = trainer.translate([s for s, _ in dev])
    exact = np.mean([h == t for h, (_, t) in zip(hyps, dev)])
    chars = np.mean([sum(a == b for a, b in zip(h, t)) / len(t) for h, (_, t) in zip(hyps, dev)])
    print(f"\nafter {trainer.state.step} steps ({trainer.state.seconds:.0f} s): exact-match accuracy on "
          f"{len(dev)} fresh words {exact:.1%}, character accuracy {chars:.1%}")
    for (src, tgt), hyp in list(zip(dev, hyps))[:6]:
        mark = "ok" if hyp == tgt else "  "
        print(f"  {mark} {src:<14} -> {hyp:<14} (expected {tgt})")
    examples = ["attention", "transformer", "encoder", "decoder"]
    for src, hyp in zip(examples, trainer.translate(examples)):
        print(f"     {src:<14} -> {hyp}")
    print(f"\nmodel saved in {args.out}; try: transformer translate --model {args.out} hello world")
    return 0


def choose_vocab_size(train_pairs):
    """The BPE vocabulary size (per language) for training pairs when --vocab-size is left out
    (config.VOCAB_WORDS_PER_ENTRY; a prepared corpus counts the words as it reads them)."""
    from .corpus.preparation import vocab_size_for_words

    return vocab_size_for_words(sum(len(s.split()) + len(t.split()) for s, t in train_pairs) / 2)


def data_specs(data):
    """--data's values as a list (a run written before --data took several has one str)."""
    if not data:
        return []
    return [data] if isinstance(data, str) else list(data)


def describe_data(args):
    """The corpus as the command line named it, for messages."""
    parts = data_specs(args.data)
    if getattr(args, "src_file", None):
        parts.append(f"--src-file {args.src_file} --tgt-file {args.tgt_file}")
    return " ".join(parts)


def corpus_blame(args):
    """blame() for the corpus's flag: --data (with its value when it is one file) or --src-file."""
    specs = data_specs(args.data)
    for flag, given in (("--src-file", getattr(args, "src_file", None)), ("--tgt-file", getattr(args, "tgt_file", None))):
        if given and not specs:
            return blame(flag)
    return blame("--data", specs[0] if len(specs) == 1 else None)


def prepared_dir(args):
    """The prepared directory that --data names alone, or None."""
    from .corpus import is_prepared

    specs = data_specs(args.data)
    if len(specs) == 1 and not getattr(args, "src_file", None) and os.path.isdir(specs[0]):
        with blame("--data", specs[0]):
            if not is_prepared(specs[0]):
                raise ValueError(f"{specs[0]}: a directory, and not a prepared corpus (no manifest.json; "
                                 "`transformer prepare --out DIR` writes one)")
        return specs[0]
    return None


# Flags that decide how a corpus is read and prepared: they cannot apply to one already prepared.
CORPUS_READING_FLAGS = ("src_col", "tgt_col", "header", "src_file", "tgt_file", "bpe_sample")


def check_prepared_flags(args, directory):
    """--data DIR (prepared): the flags that decide how a corpus is prepared are refused, or must
    say what DIR was prepared with (FlagError naming the flag)."""
    from .corpus import read_manifest

    with blame("--data", directory):
        manifest = read_manifest(directory)
    for key in CORPUS_READING_FLAGS:
        if getattr(args, key, None) is not None:
            raise FlagError(f"{_flag(key)}: --data {directory} is a prepared corpus, read and encoded already "
                            "(the flag applies to `transformer prepare`, or to --data FILE)")
    held = {"dev_fraction": manifest["settings"]["dev_fraction"], "dev_max": manifest["settings"]["dev_max"],
            "vocab_size": manifest.get("bpe", {}).get("vocab_size")}
    for key, value in held.items():
        given = getattr(args, key, None)
        if given is not None and value is not None and given != value:
            raise FlagError(f"{_flag(key)} {given}: --data {directory} was prepared with {_flag(key)} {value}")
    return held


def _one_rank_prepares(args, prepare, open_prepared):
    """prepare() on rank 0 alone under mpirun: the other ranks wait (asleep, not spinning on a
    core the preparation needs), then open_prepared(path) the very files rank 0 wrote, so that one
    host holds one copy in its page cache. One process: prepare()."""
    rank, size = _world(args)
    if size == 1:
        return prepare()
    from .distributed import import_mpi

    comm = import_mpi().COMM_WORLD
    corpus = None
    if rank == 0:
        others = f"the other {size - 1} ranks wait" if size > 2 else "the other rank waits"
        _log(f"rank 0 prepares the corpus (or finds it prepared); {others} for it, then every rank maps "
             "the same files")
        corpus = prepare()
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.05)
    path = comm.bcast(corpus.path if rank == 0 else None, root=0)
    if rank == 0:
        return corpus
    if not os.path.isdir(path):
        raise FileNotFoundError(f"rank {rank} cannot see {path}, the corpus rank 0 prepared: give every host "
                                "a file system they share, and pass a directory of `transformer prepare` as --data")
    return open_prepared(path)


def _code_of(name):
    """A language code named by a column header or a file's extension ("eng", "corpus.es"), or None."""
    from .checkpoint import is_language_code

    name = str(name)
    if "." in name:
        name = os.path.splitext(name[:-3] if name.endswith(".gz") else name)[1][1:]
    return name if is_language_code(name) else None


def choose_languages(args, manifest):
    """--src-lang / --tgt-lang, or by default the corpus's own names for its languages: the columns'
    header names (eng, hin) or the aligned files' extensions (corpus.en, corpus.es), when those are
    language codes. Kept in the run's flags and written beside the model (languages.json)."""
    if args.src_lang and args.tgt_lang:
        return
    first = manifest["inputs"][0]
    guess = (None, None)
    if first["kind"] == "tsv":
        columns = manifest["settings"]["inputs"][0]
        guess = (_code_of(columns["src_col"]), _code_of(columns["tgt_col"]))
        if first.get("header") is None:
            guess = (None, None)           # no header: the columns are numbers
    elif first["kind"] == "aligned":
        guess = tuple(_code_of(path) for path in first["path"].split(",", 1))
    args.src_lang = args.src_lang or guess[0]
    args.tgt_lang = args.tgt_lang or guess[1]
    if args.src_lang and args.tgt_lang:
        _log(f"languages: {args.src_lang} -> {args.tgt_lang} (written beside the model for `transformer serve`; "
             "--src-lang / --tgt-lang to choose)")


def open_corpus(args, tokenizers=None):
    """The PreparedCorpus the run trains on: --data DIR as it is, or --data FILE... (and
    --src-file/--tgt-file) prepared into the cache or found there. tokenizers: {"src", "tgt"} the
    run must encode with (a resumed run's, or the --init-from model's); None: BPE is learned."""
    from .corpus import PreparedCorpus, find_or_prepare, make_inputs
    from .corpus.preparation import tokenizers_digest

    directory = prepared_dir(args)
    if directory is not None:
        def prepare():
            with blame("--data", directory):
                return PreparedCorpus(directory)
        corpus = _one_rank_prepares(args, prepare, lambda path: PreparedCorpus(path, verify=False))
        settings = corpus.manifest["settings"]
        for key in ("dev_fraction", "dev_max"):
            if getattr(args, key) != settings[key]:
                raise FlagError(f"--data {directory}: prepared with {_flag(key)} {settings[key]}, and the run in "
                                f"{args.resume} has {getattr(args, key)}")
        if tokenizers is not None and corpus.manifest["tokenizers_sha256"] != tokenizers_digest(tokenizers):
            whose = f"the run in {args.resume}" if args.checkpoint is not None else f"the model in {args.init_from}"
            raise FlagError(f"--data {directory}: encoded with other vocabularies than {whose}'s (prepare it "
                            f"with `transformer prepare --tokenizers-from MODEL_DIR`, or give the corpus's files)")
        return corpus

    with corpus_blame(args):
        specs = [datasets.resolve(spec) if datasets.is_shortcut(spec) else spec for spec in data_specs(args.data)]
        if specs != data_specs(args.data):
            args.data = specs
        inputs = make_inputs(specs, args.src_col, args.tgt_col, HEADER_CHOICES[args.header],
                             getattr(args, "src_file", None), getattr(args, "tgt_file", None))

    def prepare():
        with corpus_blame(args):
            return find_or_prepare(inputs, dev_fraction=args.dev_fraction, dev_max=args.dev_max,
                                   vocab_size=args.vocab_size if tokenizers is None else None,
                                   bpe_sample=args.bpe_sample, tokenizers=tokenizers,
                                   progress=not args.quiet, log=_log)
    return _one_rank_prepares(args, prepare, lambda path: PreparedCorpus(path, verify=False))


def train_on_data(args, engine=None, result=None):
    """Train a translation model on a corpus (corpus.PreparedCorpus: prepared once, memory-mapped).

    `engine` (for comparisons) replaces our model: a callable cfg -> (model, optimizer, clip) whose
    model offers our training interface; it gets exactly the same data, batches and schedule.
    `result`, a dict, receives the final record and the trainer (for benchmarks)."""
    from .corpus import TrainingSet

    initial = getattr(args, "initial", None)
    given = None
    if args.checkpoint is not None:
        given = {"src": args.checkpoint.src_tokenizer, "tgt": args.checkpoint.tgt_tokenizer}
    elif initial is not None:            # fine-tuning: the model's own tokenizers, no new BPE
        given = {"src": initial[1], "tgt": initial[2]}
    corpus = open_corpus(args, given)
    fingerprint = corpus.pairs_fingerprint[:16]
    _agree(args, fingerprint)
    started = None if args.checkpoint is None else args.checkpoint.args.get("data_fingerprint")
    if started is not None and started != fingerprint:
        raise FlagError(f"--data {describe_data(args)}: not the pairs the run in {args.resume} trained on (their "
                        f"fingerprint {fingerprint}, the run's {started}; --src-col and --tgt-col are the run's). A "
                        "resumed run continues on its own data; a moved or renamed copy of it is fine. Start a new "
                        "run (--out, or --init-from) to train on other data")
    args.data_fingerprint = fingerprint   # kept in the checkpoint's args for that check
    choose_languages(args, corpus.manifest)
    if args.checkpoint is None and initial is None:     # the size chosen, kept with the run's flags
        args.vocab_size = corpus.manifest["bpe"].get("vocab_size", args.vocab_size)
    if initial is not None:
        _log(f"fine-tuning {args.init_from}: its vocabularies (source {initial[1].vocab_size}, "
             f"target {initial[2].vocab_size})")
    src_tok, tgt_tok = (given["src"], given["tgt"]) if given is not None else (corpus.src_tokenizer,
                                                                             corpus.tgt_tokenizer)

    # the ids of the model the run trains: a checkpoint's, the --init-from model's or a new one's
    known = args.checkpoint.model.cfg if args.checkpoint is not None else (
        initial[0].cfg if initial is not None else ModelConfig())
    max_tokens = args.max_sentence_tokens
    if args.checkpoint is not None or initial is not None:
        max_tokens = min(max_tokens, known.max_len - 1)
    data = TrainingSet(corpus, max_tokens, args.batch_tokens, args.seed, known.bos_id, known.eos_id, known.pad_id)
    if data.dropped:
        _log(f"skipped {data.dropped} training pairs that are empty after tokenisation or longer than "
             f"{max_tokens} subwords")
    if not len(data):
        with blame("--data", describe_data(args)):
            raise ValueError(f"no training pairs left after tokenisation (--max-sentence-tokens {max_tokens})")

    def make_model():
        if initial is not None:
            if args.dropout is not None:      # the model's stored rate otherwise (choose_dropout)
                initial[0].set_dropout(args.dropout)
            return initial[0]
        cfg = model_config_from_args(args, src_tok.vocab_size, tgt_tok.vocab_size, max_len=max_tokens + 1)
        return Seq2SeqTransformer(cfg, seed=args.seed)

    clip, dp = clip_grad_norm, None
    if engine is None:
        model, optimizer, src_tok, tgt_tok, state = _resume_or_new(args, make_model, src_tok, tgt_tok)
        dp = _data_parallel(args, model, optimizer)
    else:
        cfg = model_config_from_args(args, src_tok.vocab_size, tgt_tok.vocab_size, max_len=max_tokens + 1)
        (model, optimizer, clip), state = engine(cfg), TrainState()
    dev_pairs = corpus.dev
    trainer = Trainer(args, model, optimizer, src_tok, tgt_tok, data, dev_pairs, state, clip=clip,
                      checkpoints=engine is None, dp=dp)
    _log(describe(model) + _describe_world(dp))
    status = trainer.run()
    if status or not trainer.leader:
        return status
    metrics = trainer.evaluate()
    averaged = trainer.model_for_inference
    if averaged is not None:           # report the raw final weights and the average side by side
        with trainer.scoring(averaged):
            metrics = {"final": _rounded(metrics), **trainer.evaluate()}
    record = {"step": trainer.state.step, "seconds": round(trainer.state.seconds, 1),
              "tokens": trainer.state.tokens, **_rounded(metrics)}
    print(json.dumps(record))
    if result is not None:
        result.update(record=record, trainer=trainer)
    samples = [s for s, _ in dev_pairs[:5]] + list(args.samples or [])
    with trainer.scoring(trainer.model if averaged is None else averaged):   # the model saved in --out
        for src, hyp in zip(samples, trainer.translate(samples)):
            print(f"  {src}  ->  {hyp}")
    return 0


def has_data(args):
    """Whether the run trains on a corpus (--data, or --src-file and --tgt-file)."""
    return bool(data_specs(getattr(args, "data", None)) or getattr(args, "src_file", None)
                or getattr(args, "tgt_file", None))


def default_out_dir(args):
    """Where a run without --out (or --resume) writes: runs/builtin, or runs/<first data file's name>."""
    if not has_data(args):
        return "runs/builtin"
    first = (data_specs(args.data) or [args.src_file or args.tgt_file])[0]
    name = os.path.basename(os.path.normpath(first.split(",")[0]))
    for suffix in (".gz", ".tsv", ".txt"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[:-len(suffix)]
    return "runs/" + os.path.splitext(name)[0]


def prepare_out_dir(args):
    """Sets args.out (--resume's directory, or the default) and makes it; the directories this
    made, the deepest first."""
    if args.resume and not args.out:
        args.out = args.resume
    if not args.out:
        args.out = default_out_dir(args)
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise NotADirectoryError(f"{args.out}: a file, not a directory (--out is the directory a run writes "
                                 f"its checkpoint and model to)")
    created, path = [], os.path.abspath(args.out)
    while not os.path.isdir(path) and os.path.dirname(path) != path:
        created.append(path)
        path = os.path.dirname(path)
    os.makedirs(args.out, exist_ok=True)
    return created
