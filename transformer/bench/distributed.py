"""Data-parallel training step: ranks x threads, ours (DataParallel over MPI) against PyTorch
DistributedDataParallel (gloo backend) on the same network and the same global batch.

For every (ranks, threads) with ranks x threads <= the cores present, both engines run as ranks
started by `mpiexec` from the virtual environment (one process, no launcher, for 1 rank): each rank
takes its part of the base training step's global batch (bench/train.py's CONFIGS), the gradients
are summed (ours) or averaged (DDP) over ranks, and every rank takes the Adam step. The figure is
target tokens of the global batch per second of rank 0's median step; parallel efficiency is
tokens/s over (ranks x threads x tokens/s at 1x1) of the same engine; ours also reports the share
of the step spent waiting for the gradient all-reduce after the backward pass (the part the
bucketed Iallreduce did not hide). Engines alternate grid point by grid point.

    python -m transformer.bench.distributed --worker ours|torch --config base --steps 4   # one rank
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from .harness import free_port
from .train import CONFIGS, LABEL_SMOOTHING, _batch, _config

WARMUP_STEPS = 1
# Ring all-reduce projection (benchmarks/notes/2026-11-25-data-parallel.md): link speeds in Gb/s
# and node counts.
LINKS_GBPS = (10, 25, 100)
NODES = (2, 4, 8, 16, 32, 64)
NODE_SPEEDUPS = (1, 8)       # the measured node, and one 8x faster (16 cores instead of 2, say)
LINK_LATENCY_S = 25e-6       # per message and hop: TCP over Ethernet (RDMA is ~10x less)


def grid(threads, cores=None):
    """(ranks, threads) pairs from the --threads values whose product fits the cores (those this
    process may use: transformer/cores.py)."""
    from .. import cores as usable

    cores = cores or usable.usable_cores()
    values = sorted(set(threads))
    return [(r, t) for r in values for t in values if r * t <= cores]


def _mpiexec():
    path = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if path is None:
        raise RuntimeError('--what distributed needs mpiexec: pip install "transformer-cpu[mpi]"')
    return path


def run(threads=(1, 2), configs=("base",), against="torch", steps=None, stream=None):
    """One record per (config, ranks, threads), and one projection record per config."""
    from .. import cores as usable
    from .harness import cpu_model

    records = []
    cores = usable.usable_cores()
    for name in configs:
        points = grid(threads, cores)
        n_steps = steps or max(3, CONFIGS[name]["repeats"])
        base = {}
        for ranks, nthreads in points:
            record = {"bench": "distributed", "kernel": f"train_step data-parallel {name}", "config": name,
                      "ranks": ranks, "threads_per_rank": nthreads, "threads": ranks * nthreads,
                      "global_batch": CONFIGS[name]["batch"], "length": CONFIGS[name]["length"],
                      "cpu": cpu_model(), "cores": cores}
            engines = ("ours", "torch") if against == "torch" else ("ours",)
            for engine in engines:
                got = _launch(engine, name, ranks, nthreads, n_steps)
                record[f"{engine}_tokens_per_s"] = got["tokens_per_s"]
                record[f"{engine}_step_s"] = got["step_s"]
                record[f"{engine}_step_spread_s"] = got["spread_s"]
                if "comm_wait_share" in got:
                    record["ours_comm_wait_share"] = got["comm_wait_share"]
                    record["ours_imbalance_share"] = got["imbalance_share"]
                    record["ours_buckets_per_step"] = got["buckets_per_step"]
                    record["gradient_mb"] = got["gradient_mb"]
                if (ranks, nthreads) == (1, 1):
                    base[engine] = got["tokens_per_s"]
                if engine in base:
                    record[f"{engine}_efficiency"] = round(got["tokens_per_s"] / (ranks * nthreads * base[engine]), 3)
            if "torch_tokens_per_s" in record:
                record["ours_vs_ddp"] = record["ratio"] = round(record["ours_tokens_per_s"] /
                                                                record["torch_tokens_per_s"], 3)
            records.append(record)
            if stream is not None:
                print(json.dumps(record), file=stream, flush=True)
        records.append(projection(records, name, stream))
    return records


def _launch(engine, name, ranks, nthreads, steps):
    cmd = [sys.executable, "-m", "transformer.bench.distributed", "--worker", engine, "--config", name,
           "--sizes", json.dumps(CONFIGS[name]), "--threads", str(nthreads), "--steps", str(steps)]
    env = {**os.environ, "OMP_NUM_THREADS": str(nthreads), "MASTER_PORT": str(free_port())}
    if ranks > 1:
        cmd = [_mpiexec(), "-n", str(ranks), *cmd]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{engine} at {ranks}x{nthreads} failed:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])


def projection(records, name, stream=None):
    """Ring all-reduce of the gradient buffer against a node's step time, weak scaling (every node
    keeps the measured batch; the global batch grows with the nodes): a ring moves 2 (N-1)/N of the
    buffer through every link, in 2 (N-1) messages per bucket of LINK_LATENCY_S each. The bucketed all-reduce can hide behind the backward pass, about
    two thirds of the step: efficiency = step / (step + max(0, allreduce - 2/3 step)); without
    overlap, step / (step + allreduce). Node steps: the measured one (this machine, all its cores in
    one rank) and, for a bigger node, the same divided by NODE_SPEEDUPS."""
    single = max((r for r in records if r.get("config") == name and r.get("ranks") == 1),
                 key=lambda r: r["threads"])
    measured = single["ours_step_s"]
    mb = next((r["gradient_mb"] for r in records if r.get("config") == name and "gradient_mb" in r), None)
    if mb is None:
        mb = _gradient_mb(name)
    buckets = next((r["ours_buckets_per_step"] for r in records
                    if r.get("config") == name and r.get("ours_buckets_per_step")), 16)
    rows = []
    for speedup in NODE_SPEEDUPS:
        step = measured / speedup
        for gbps in LINKS_GBPS:
            for nodes in NODES:
                comm = (2.0 * (nodes - 1) / nodes * mb * 8e6 / (gbps * 1e9)
                        + 2 * (nodes - 1) * buckets * LINK_LATENCY_S)
                rows.append({"node_speedup": speedup, "node_step_s": round(step, 4), "gbps": gbps, "nodes": nodes,
                             "allreduce_s": round(comm, 4),
                             "efficiency": round(step / (step + max(0.0, comm - 2.0 / 3.0 * step)), 3),
                             "efficiency_no_overlap": round(step / (step + comm), 3)})
    record = {"bench": "distributed_projection", "config": name, "gradient_mb": round(mb, 1), "buckets": buckets,
              "link_latency_s": LINK_LATENCY_S,
              "node_step_s": measured, "node_threads": single["threads"], "rows": rows}
    if stream is not None:
        print(json.dumps(record), file=stream, flush=True)
    return record


def _gradient_mb(name):
    import transformer as T
    return T.Seq2SeqTransformer(_config(name)).params.size * 4 / 1e6


def table(records):
    lines = ["config  ranks x threads  ours tok/s  eff   comm wait  imbalance  DDP tok/s  eff   ours/DDP"]
    for r in records:
        if r.get("bench") != "distributed":
            continue
        lines.append(f"{r['config']:<7} {r['ranks']} x {r['threads_per_rank']:<12} "
                     f"{r['ours_tokens_per_s']:>10,.0f}  {r.get('ours_efficiency', float('nan')):.2f}  "
                     f"{r.get('ours_comm_wait_share', 0):>8.1%}  {r.get('ours_imbalance_share', 0):>9.1%}  "
                     f"{r.get('torch_tokens_per_s', float('nan')):>9,.0f}  {r.get('torch_efficiency', float('nan')):.2f}  "
                     f"{r.get('ours_vs_ddp', float('nan')):.2f}x")
    return "\n".join(lines)


# -- one rank ---------------------------------------------------------------------------------------

def _worker(engine, name, nthreads, steps):
    from ..distributed import launched_ranks

    rank, size = launched_ranks()
    src, tgt_in, tgt_out = (x[rank::size] for x in _batch(name))
    global_tokens = CONFIGS[name]["batch"] * CONFIGS[name]["length"]
    if engine == "ours":
        step, finish, barrier = _ours(name, nthreads, size, (src, tgt_in, tgt_out))
    else:
        step, finish, barrier = _ddp(name, nthreads, rank, size, (src, tgt_in, tgt_out))
    times = []
    for i in range(WARMUP_STEPS + steps):
        barrier()
        started = time.perf_counter()
        step(i >= WARMUP_STEPS)
        times.append(time.perf_counter() - started)
    extra = finish()
    if rank == 0:
        timed = times[WARMUP_STEPS:]
        median = statistics.median(timed)
        print(json.dumps({"tokens_per_s": round(global_tokens / median, 1), "step_s": round(median, 4),
                          "spread_s": [round(min(timed), 4), round(max(timed), 4)], **extra}), flush=True)


def _ours(name, nthreads, size, batch):
    import transformer as T

    T.set_num_threads(nthreads)
    model = T.Seq2SeqTransformer(_config(name), seed=0)
    opt = T.Adam(model, lr=1e-4)
    dp = T.DataParallel(model) if size > 1 else None
    if dp is not None:
        dp.broadcast_parameters()
    counted = {"seconds": 0.0, "wait": 0.0, "imbalance": 0.0, "buckets": 0, "calls": 0}

    def step(timed):
        model.zero_grad()
        if dp is None:
            model.forward_backward(*batch, label_smoothing=LABEL_SMOOTHING)
        else:
            dp.reset_stats()
            dp.forward_backward(*batch, label_smoothing=LABEL_SMOOTHING)
            if timed:
                counted["seconds"] += dp.stats["seconds"]
                counted["wait"] += dp.stats["wait_seconds"]
                counted["imbalance"] += dp.stats["imbalance_seconds"]
                counted["buckets"] += dp.stats["buckets"]
                counted["calls"] += 1
        opt.step()

    def finish():
        out = {"gradient_mb": round(model.params.size * 4 / 1e6, 1)}
        if dp is not None and counted["calls"]:
            dp.check_replicas()
            out["comm_wait_share"] = round(counted["wait"] / counted["seconds"], 4)
            out["imbalance_share"] = round(counted["imbalance"] / counted["seconds"], 4)
            out["buckets_per_step"] = counted["buckets"] // counted["calls"]
        else:
            out["comm_wait_share"] = out["imbalance_share"] = 0.0
            out["buckets_per_step"] = 0
        return out

    barrier = dp.sync if dp is not None else (lambda *a: None)
    return step, finish, (lambda: barrier("the step barrier"))


def _ddp(name, nthreads, rank, size, batch):
    import torch

    from transformer.torch_compat import build_torch_model

    torch.set_num_threads(nthreads)
    model = build_torch_model(_config(name), seed=0)
    model.train()
    dist = None
    if size > 1:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                                rank=rank, world_size=size)
        model = DistributedDataParallel(model)
    module = model.module if dist is not None else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    tensors = [torch.from_numpy(x.copy()) for x in batch]

    def step(timed):
        opt.zero_grad(set_to_none=True)
        logits = model(tensors[0], tensors[1])        # through DDP's forward, whose hooks sync the backward
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tensors[2].reshape(-1),
                                                 ignore_index=module.cfg.pad_id, label_smoothing=LABEL_SMOOTHING)
        loss.backward()
        opt.step()

    def finish():
        if dist is not None:
            dist.destroy_process_group()
        return {}

    return step, finish, ((lambda: dist.barrier()) if dist is not None else (lambda: None))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=["ours", "torch"], required=True)
    parser.add_argument("--config", default="base")
    parser.add_argument("--sizes", help="the config's CONFIGS entry as JSON (a custom --config)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    if args.sizes:
        CONFIGS[args.config] = json.loads(args.sizes)
    _worker(args.worker, args.config, args.threads, args.steps)


if __name__ == "__main__":
    main()
