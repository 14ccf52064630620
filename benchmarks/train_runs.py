"""Real training runs, alternated: the step time `transformer train` itself reports, for several
builds or settings, at several thread counts, in one run of this script (issue 57's measure).

Each run is `transformer train --data BIBLE --preset tiny --max-steps N --eval-every 0` in a fresh
process; its step time is the final line's seconds over steps (the first step's allocations
included, as a user's run has them). The variants take turns (A, B, C, A, B, C, ...) `--rounds`
times, so a drift of the machine's speed hits every variant alike; the record gives each
variant's median, its spread, and the median ratio of the first variant's step time to each variant's over
the rounds (paired: each round's runs ran within a minute or two of each other).

    python benchmarks/train_runs.py --variant base=/path/to/old/checkout \\
        --variant new=. --variant new-whole=.:TRANSFORMER_SHARDS=1 \\
        --threads 1,2 --precision bf16 --rounds 3 --json benchmarks/results/....json

A variant is NAME=DIR[:VAR=VALUE,...]: the checkout whose `transformer` package (with its compiled
module) is imported (the process runs in DIR, so DIR's package comes first on the path), and
environment variables for its runs. --variant-args NAME=FLAGS adds `transformer train` flags to
one variant's runs (after --train-args), e.g. `--variant-args bpe='--bpe-dropout 0.1'` beside a
variant of the same checkout without them.

--load K: K other processes spin on the CPU during every run (a machine shared with other work,
as a laptop or a small VM often is); each record then says so.

--cpu-limit CPUS: every run in a cgroup of its own whose CPU quota is CPUS (a container's `--cpus`;
needs root and a writable cgroup v1 cpu or v2 hierarchy). `--threads default` runs without
--threads: the thread count the engine picks for itself (transformer/cores.py).
"""
import argparse
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BIBLE = os.path.join(HERE, "..", "..", "shared", "data", "bible-eng-spa.tsv.gz")


def parse_variant(text):
    name, _, rest = text.partition("=")
    where, _, env = rest.partition(":")
    extra = dict(item.split("=", 1) for item in env.split(",") if item)
    return name, os.path.abspath(where or "."), extra


def cpu_model():
    try:
        info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        return "unknown"
    fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
    get = lambda k: fields.get(k, "").strip()  # noqa: E731
    return f"{get('Model name')} (family {get('CPU family')} model {get('Model')})"


def _cgroup_mounts():
    """(version, mount point) of the cgroup hierarchies that hold the cpu controller."""
    from transformer import cgroups

    found = []
    for fstype, _, point, options in cgroups.cgroup_mounts():
        if fstype == "cgroup" and "cpu" in options:
            found.append(("v1", point))
        elif fstype == "cgroup2":
            try:
                with open(os.path.join(point, "cgroup.controllers")) as c:
                    if "cpu" in c.read().split():
                        found.append(("v2", point))
            except OSError:
                pass
    return found


@contextlib.contextmanager
def cpu_limited_group(cpus):
    """A fresh cgroup whose CPU quota is `cpus` CPUs (period 100 ms): yields its cgroup.procs file,
    into which a run writes its own pid; removed afterwards."""
    period = 100000
    for version, mount in _cgroup_mounts():
        group = os.path.join(mount, f"train-runs-{os.getpid()}")
        settings = ({"cpu.cfs_period_us": str(period), "cpu.cfs_quota_us": str(round(cpus * period))}
                    if version == "v1" else {"cpu.max": f"{round(cpus * period)} {period}"})
        try:
            os.mkdir(group)
        except OSError:
            continue
        try:
            for name, value in settings.items():
                with open(os.path.join(group, name), "w") as f:
                    f.write(value)
        except OSError:      # a v2 parent without the cpu controller in its subtree_control
            os.rmdir(group)
            continue
        try:
            yield os.path.join(group, "cgroup.procs")
        finally:
            os.rmdir(group)
        return
    raise SystemExit("--cpu-limit: no writable cgroup hierarchy with the cpu controller (it needs root)")


def one_run(directory, env, threads, precision, steps, preset, data, load=0, extra=(), procs=None):
    out = tempfile.mkdtemp(prefix="train-run-")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(load)]
    try:
        return _run(directory, env, threads, precision, steps, preset, data, out, extra, procs)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _run(directory, env, threads, precision, steps, preset, data, out, extra=(), procs=None):
    """(seconds a step, the threads the run used). threads "default": no --threads flag; procs: the
    cgroup.procs file the run enters before it starts."""
    code = ("import sys; import transformer as T; from transformer.cli import main; code = main(sys.argv[1:]); "
            "print('{\"threads_used\": %d}' % T.get_num_threads()); sys.exit(code)")
    argv = [sys.executable, "-c", code, "train", "--data", data, "--src-col", "eng", "--tgt-col", "spa",
            "--preset", preset, "--max-steps", str(steps), "--precision", precision,
            "--eval-every", "0", "--quiet", "--overwrite", "--out", out, *extra]
    if threads != "default":
        argv[argv.index("--precision"):argv.index("--precision")] = ["--threads", str(threads)]
    if procs is not None:
        argv = ["sh", "-c", f'echo $$ > "{procs}" && exec "$@"', "sh", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=directory, env={**os.environ, **env},
                          timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"run failed in {directory}: {done.stderr[-2000:]}")
    final = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{") and '"seconds"' in line]
    used = [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"threads_used"')]
    record = final[-1]
    return record["seconds"] / record["step"], used[-1]["threads_used"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", required=True, help="NAME=DIR[:VAR=VALUE,...]")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16"])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data", default=BIBLE)
    parser.add_argument("--load", type=int, default=0, help="processes spinning on the CPU during each run")
    parser.add_argument("--train-args", default="", help="more `transformer train` flags for every run, e.g. "
                        "'--eval-every 100' (a later flag wins over the same flag before it)")
    parser.add_argument("--variant-args", action="append", default=[], help="NAME=FLAGS: more flags for one variant")
    parser.add_argument("--cpu-limit", type=float, help="run every run in a cgroup with this CPU quota (root)")
    parser.add_argument("--json", help="also write the records to this file")
    args = parser.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant]
    own_flags = {name: shlex.split(flags) for name, _, flags in (v.partition("=") for v in args.variant_args)}
    unknown = set(own_flags) - {name for name, _, _ in variants}
    if unknown:
        parser.error(f"--variant-args names no --variant: {sorted(unknown)}")
    threads = [t if t == "default" else int(t) for t in args.threads.split(",")]
    extra = shlex.split(args.train_args)
    times = {(name, t): [] for name, _, _ in variants for t in threads}
    used = {(name, t): [] for name, _, _ in variants for t in threads}
    with (cpu_limited_group(args.cpu_limit) if args.cpu_limit else contextlib.nullcontext()) as procs:
        for _ in range(args.rounds):
            for t in threads:
                for name, directory, env in variants:
                    step, n = one_run(directory, env, t, args.precision, args.steps, args.preset, args.data,
                                      args.load, extra + own_flags.get(name, []), procs)
                    times[(name, t)].append(step)
                    used[(name, t)].append(n)
                    print(f"{name} threads {t} ({n} used): {step * 1e3:.1f} ms a step", file=sys.stderr)
    records = []
    first = variants[0][0]
    for name, directory, env in variants:
        for t in threads:
            own = times[(name, t)]
            record = {"bench": "train_run_step", "variant": name, "env": env, "threads": t,
                      "precision": args.precision, "preset": args.preset, "steps": args.steps, "cpu": cpu_model(),
                      "threads_used": sorted(set(used[(name, t)])), "cpu_limit": args.cpu_limit,
                      "spinning_processes": args.load, "train_args": args.train_args,
                      "variant_args": " ".join(own_flags.get(name, [])),
                      "step_s_median": statistics.median(own), "step_s_all": own,
                      "speedup_vs_" + first: statistics.median(b / a for a, b in zip(own, times[(first, t)]))}
            if 1 in threads and t not in (1, "default"):
                single = times[(name, 1)]
                record["efficiency"] = statistics.median(s / m / t for s, m in zip(single, own))
            records.append(record)
            print(json.dumps(record))
    if args.json:
        with open(args.json, "w") as f:
            for record in records:
                f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
