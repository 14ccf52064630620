"""Where the hostile load's cost goes on 2 cores: ours alone, ours attacked, and ours while the same
hostile clients attack a second server (a decoy) instead: does their traffic cost the decoding
through the server that answers it, or through the machine it shares?

    python benchmarks/serve_decoy.py THREADS ROUNDS   (e.g. 2 6; prints one JSON line)

The well-formed load is `bench --what serve --hostile`'s (64 clients, 512 verses, tiny model, int8,
beam 4); the decoy is another `transformer serve` of the same model at 1 thread.
"""
import asyncio
import json
import statistics
import sys
import tempfile
import time

from transformer.bench import serve as S

threads, rounds = int(sys.argv[1]), int(sys.argv[2])
d = tempfile.mkdtemp()
texts = S.build_model("tiny", d, S._pairs(S.BIBLE))
sample = (texts * (512 // len(texts) + 1))[:512]
a = S.ours(d, threads, "int8", 4, 64, checkout=S._checkout())
b = S.ours(d, 1, "int8", 4, 64, checkout=S._checkout())
res = {"alone": [], "attacked": [], "decoy": []}
try:
    for srv in (a, b):
        asyncio.run(S._drive(srv.url, sample[:8], 2))
    for r in range(rounds):
        order = list(res) if r % 2 == 0 else list(res)[::-1]
        for kind in order:
            attack = None
            if kind != "alone":
                attack = S.HostileClients((a if kind == "attacked" else b).url, 8, S.HOSTILE_RATE)
                time.sleep(1.0)
            secs, _, _ = asyncio.run(S._drive(a.url, sample, 64))
            if attack:
                attack.stop()
            res[kind].append(len(sample) / secs)
finally:
    for srv in (a, b):
        srv.stop()
ratio = lambda k: [round(x / y, 3) for x, y in zip(res[k], res["alone"])]
print(json.dumps({"threads": threads, "rounds": rounds, **{k: [round(v, 1) for v in vals] for k, vals in res.items()},
                  "attacked_vs_alone": ratio("attacked"), "decoy_vs_alone": ratio("decoy"),
                  "attacked_median": statistics.median(ratio("attacked")), "decoy_median": statistics.median(ratio("decoy"))}))
