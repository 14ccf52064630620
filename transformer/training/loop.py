"""The training loop: teacher forcing, Adam with the warm-up schedule (section 5.3), label smoothing
(section 5.4), periodic evaluation and resumable checkpoints.

Every source of randomness is a function of (seed, step) or of state stored in the checkpoint,
so `--resume` continues with exactly the losses an uninterrupted run would have had."""
import contextlib
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass

import numpy as np

from .. import _C
from ..checkpoint import (BEST_DIR, CHECKPOINT_FILE, LOG_FILE, average_weights, clear_run, list_snapshots,
                          save_checkpoint, save_inference_files, save_snapshot, snapshot_path)
from ..data import collate, length_batches, make_example
from ..model import Seq2SeqTransformer
from ..optim import clip_grad_norm
from ..shards import step_threads
from ..translation import score_translations, translate_texts
from . import curriculum, precision, schedule
from .report import rounded, say


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


REPLICA_CHECK_EVERY = 200   # data parallel: steps between checks that every rank holds the same weights


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
        # a run that stops once it is good enough (the built-in task: builtin.Goal), checked every
        # goal.every steps by goal.reached(trainer); None: the budget alone decides
        self.goal = None
        self.goal_reached = False
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
        steps = self.curriculum_steps()
        if steps is not None and self.state.step < steps:   # the epoch's position waits for its end
            positions = self._shard(self.data.curriculum_batch(
                self.state.step, curriculum.competence(self.state.step, steps)))
            # BPE-dropout: curriculum step t draws its segmentations as "pass" -(t + 1), its own
            return self.data.collate(positions, epoch=-1 - self.state.step) if len(positions) else (None, None, None)
        batches = self.data.batches(self.state.epoch)
        if self.state.batch_in_epoch >= len(batches):
            self.state.epoch += 1
            self.state.batch_in_epoch = 0
            batches = self.data.batches(self.state.epoch)
        positions = self._shard(batches[self.state.batch_in_epoch])
        self.state.batch_in_epoch += 1
        if not len(positions):
            return None, None, None
        return self.data.collate(positions, epoch=self.state.epoch)   # the pass draws BPE-dropout's segmentations

    def curriculum_steps(self):
        """The length curriculum's steps (--curriculum, fixed in the plan), or None. Before the plan
        exists (measure_step_seconds times the batches most of the run reads) there is none."""
        plan = self.state.schedule
        return None if plan is None or self.task is not None else plan.get("curriculum")

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
        """Fix the learning-rate plan (schedule.plan) before step 1 and keep it in the train state,
        so that the checkpoint carries it and a resumed run follows it exactly."""
        planned = schedule.plan(self.args, self.model.cfg.d_model, budget_seconds, self.measure_step_seconds)
        if self.task is None:
            curriculum.fix(planned, getattr(self.args, "curriculum", None), self.args.max_steps)
        self.state.schedule = planned
        return planned

    def measure_step_seconds(self):
        """Seconds per training step, timed on the next batches without training on them: the
        gradients are cleared and the data position and dropout stream are put back."""
        state = (self.state.epoch, self.state.batch_in_epoch)
        stream = getattr(self.model, "stream", None)
        calls = stream.calls if stream is not None else None
        times = []
        try:
            for _ in range(schedule.PROBE_STEPS + 1):     # the first pass also allocates: not timed
                src, tgt_in, tgt_out = self.next_batch()
                started = time.perf_counter()
                with step_threads(self.model):
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
        schedule.replan_total(self.state.schedule, self.state.step, seconds_per_step, seconds_left,
                              self.args.max_steps)
        if self.task is None and isinstance(getattr(self.args, "curriculum", None), float):
            curriculum.fix(self.state.schedule, self.args.curriculum, self.args.max_steps)

    def choose_dropout(self, stream=None):
        """A new run on data without --dropout: the rate the plan calls for (schedule.dropout_for)."""
        plan = self.state.schedule
        if getattr(self.args, "dropout", 0.0) is not None or self.task is not None or "total" not in plan:
            return
        passes = plan["total"] / max(len(self.data.batches(self.state.epoch)), 1)
        rate, why = schedule.dropout_for(passes, self.model.cfg.dropout)
        if rate is not None:
            self.model.set_dropout(rate)
        cfg = self.model.cfg
        given = [f"{flag} {value:g}" for flag, value in (("--attention-dropout", cfg.attention_dropout),
                                                         ("--activation-dropout", cfg.activation_dropout))
                 if value is not None]
        if given:      # the rule sets the residual rate only (set_dropout): say what it left alone
            why += f"; {' and '.join(given)} as given"
        say(why, stream)

    def learning_rate(self, step):
        return schedule.learning_rate(self.state.schedule, step, self.args.lr_scale, self.model.cfg.d_model)

    def describe_schedule(self):
        return schedule.describe(self.state.schedule)

    def describe_curriculum(self):
        return curriculum.describe(self.state.schedule, self.state.step, getattr(self.args, "curriculum", None))

    # -- one step -----------------------------------------------------------------------------

    def step(self):
        with step_threads(self.model):
            return self._step()

    def _step(self):
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
        args = {k: v for k, v in vars(self.args).items() if k not in ("checkpoint", "initial", "func", "precision_why", "size_why")}
        save_checkpoint(self.args.out, self.model, self.optimizer, self.state.__dict__,
                        self.src_tokenizer, self.tgt_tokenizer, args)
        save_inference_files(self.args.out, self.model, self.src_tokenizer, self.tgt_tokenizer,
                             languages=self.languages)

    # -- checkpoint averaging and the best model -----------------------------------------------
    def snapshot_every(self):
        return schedule.snapshot_every(self.state.schedule, self.args.snapshot_every)

    def write_average(self, stream=None):
        """The inference model in --out becomes the mean of the last --average-last snapshots (the
        final weights among them); the checkpoint keeps the raw weights, for --resume."""
        k = self.args.average_last
        if self.state.step and not os.path.isdir(snapshot_path(self.args.out, self.state.step)):
            save_snapshot(self.args.out, self.state.step, self.model, keep=k)
        snapshots = list_snapshots(self.args.out)[-k:]
        model = average_weights([Seq2SeqTransformer.load(path) for path in snapshots])
        save_inference_files(self.args.out, model, self.src_tokenizer, self.tgt_tokenizer, languages=self.languages)
        say(f"the model in {self.args.out} is the average of {len(snapshots)} snapshots (steps "
             + ", ".join(str(int(os.path.basename(p)[5:])) for p in snapshots) + ")", stream)
        if len(snapshots) < k:
            say(f"warning: --average-last {k} found only {len(snapshots)} snapshot"
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
        say(self.describe_schedule(), stream)
        if self.curriculum_steps() is not None:
            say(self.describe_curriculum(), stream)
        say(precision.describe(self.precision, getattr(args, "precision_why", None) or "--precision"), stream)
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
                                  f"{plan['total']} steps in the budget; decay to step {plan['total']}"
                                  + (f"; length curriculum to step {plan['curriculum']}"
                                     if isinstance(getattr(args, "curriculum", None), float) else ""))
                    if self.state.step == self.curriculum_steps() and self.leader:
                        bar.write(f"step {self.state.step}: the length curriculum ends; batches from all the "
                                  "training pairs, in the usual order")
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
                            bar.write(f"step {self.state.step}: " + json.dumps(rounded(metrics)))
                            log.write(json.dumps({"step": self.state.step, **metrics}) + "\n")
                        if dp is not None:
                            dp.sync("rank 0's evaluation")
                        if deadline is not None:     # periodic evaluation is not training time
                            deadline += time.monotonic() - eval_started
                    if self.goal is not None and self.state.step % self.goal.every == 0:
                        checked = time.monotonic()
                        reached = self.goal.reached(self) if self.leader else False
                        if dp is not None:                # rank 0 decides for every rank
                            reached = dp.bcast_object(reached)
                        if deadline is not None:          # checking is not training time
                            deadline += time.monotonic() - checked
                        if reached:
                            self.goal_reached = True
                            break
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
                say(f"transformer train: error: training stopped: {exc}; {advice}")
                return 1
            finally:
                bar.close()
        self.save()
        if dp is not None and dp.stats["seconds"] > 0:
            st = dp.stats
            say(f"data parallel over {dp.size} ranks: of the training passes, {st['wait_seconds'] / st['seconds']:.1%} "
                 f"waited for the gradient all-reduce (after the backward pass: {st['buckets'] // max(st['calls'], 1)} "
                 f"buckets a step) and {st['imbalance_seconds'] / st['seconds']:.1%} for slower ranks", stream)
        if self.checkpoints:
            say(f"saved checkpoint at step {self.state.step} to {args.out}")
        if args.average_last and self.snapshots and status == 0 and self.leader:
            self.model_for_inference = self.write_average(stream)
        return status

    def _stopped_by_signal(self, stop, bar, stream):
        name = signal.Signals(stop.signal).name
        bar.close()
        where = " by another rank" if stop.remote else ""
        say(f"{name} received{where}: saving a checkpoint at step {self.state.step} and stopping", stream)
        return 128 + stop.signal
