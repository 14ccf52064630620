"""The GEMMs' results, bit for bit: a fixed set of products at every instruction-set level this
CPU has, hashed (sha256 of the output bytes, first 16 hex digits) and compared with the hashes
recorded below.

Why: the other GEMM tests allow float32 rounding (a tolerance against float64), so a change that
reorders a sum, swaps a kernel or moves a K-block edge passes them. Reorganising the GEMM code
(splitting csrc/gemm.c into one file per concern) must change no bit; this test says so.

What is covered, per level: fp32 and bf16 gemm (every transposition, alpha, accumulate, edge tiles
in M, N and K, the dot path, batches with a broadcast operand and strided head views, an `out`
inside a larger array), the pre-packed path (gemm_pack_b's buffer and gemm_packed's result, fp32
and bf16), the int8 path (qgemm_quantize, qgemm_pack's buffer, qgemm_packed with and without bias,
past a 64-row block, odd K) and the naive reference. Each family runs under several thread counts
and forced schedules (tiles, shared, shared with lazy threads; int8 also its slow fallback): the
contract is that none of them changes a bit, so all must give the one recorded hash.

Inputs are made from integers (a 64-bit mixer, 24 significant bits per value) so that they are the
same on every machine and numpy version, and every product rounds.

Across CPUs: a level runs the same instructions everywhere, and fp32 FMAs and integer sums are
exact IEEE / integer arithmetic, so these hashes hold on any CPU that has the level. One exception
is noted and guarded: vdpbf16ps (the bf16 kernels at avx512_bf16, and amx's remaining pairs) adds
its two products into the accumulator in an order the vendor's hardware chooses (Intel's manual
gives one sum after the other), so the bf16 hashes of those levels are compared only on the vendors
they were measured on: avx512_bf16's, recorded on AMD Zen 4, came out the same on an Intel Xeon
(family 6 model 207, 2026-12-02); amx's on that Xeon alone. Record a level's hashes on a CPU that
has it with

    PYTHONPATH=. python tests/test_gemm_bits.py      # prints the table for this CPU
"""
import hashlib
import platform

import numpy as np
import pytest

from transformer import _C

LEVELS = tuple(_C.isa_levels())
BEST = _C.best_isa()
# The vendors each level's bf16-dependent hashes were measured on (see the module docstring): AMX
# exists on Intel's CPUs alone.
RECORDED_ON = {"avx512_bf16": ("AuthenticAMD", "GenuineIntel"), "amx": ("GenuineIntel",)}
VENDOR_DEPENDENT = {("avx512_bf16", "bf16"), ("avx512_bf16", "packed_bf16"),
                    ("amx", "bf16"), ("amx", "packed_bf16")}

# Recorded on AMD EPYC (Zen 4, family 25 model 17), gcc 12.2.0, from csrc/gemm.c and csrc/qgemm.c
# before they were split into csrc/gemm/ (2026-11-29). int8 and reference are one hash at every
# level by contract (qgemm.h: bits independent of the instruction set; the reference has none);
# int8_packed differs per level (the layout, and the level in the header).
RECORDED = {
    "generic": {"fp32": "89a27df482c84dab", "bf16": "3c077ebee4522c5d",
                "packed_fp32": "7cbd53a17339a038", "packed_bf16": "3512742a0e3a05c6",
                "int8": "1749a00f26d2e1aa", "int8_packed": "797debd269111c6d",
                "reference": "50386964a6818fd6"},
    "avx2": {"fp32": "370046af960e2965", "bf16": "714a5da3fb0fc723",
             "packed_fp32": "64166ea9cb2826f6", "packed_bf16": "adb7a2675823cdd0",
             "int8": "1749a00f26d2e1aa", "int8_packed": "673bbf9eee92dd10",
             "reference": "50386964a6818fd6"},
    "avx512": {"fp32": "06e587fa0cca1e6d", "bf16": "c9ffa3691e9a0fe8",
               "packed_fp32": "4591c0db5d75944d", "packed_bf16": "24e8a724c14dbc70",
               "int8": "1749a00f26d2e1aa", "int8_packed": "2d35d30bb8465638",
               "reference": "50386964a6818fd6"},
    "avx512_vnni": {"fp32": "06e587fa0cca1e6d", "bf16": "c9ffa3691e9a0fe8",
                    "packed_fp32": "4591c0db5d75944d", "packed_bf16": "24e8a724c14dbc70",
                    "int8": "1749a00f26d2e1aa", "int8_packed": "e8413ed816fa7580",
                    "reference": "50386964a6818fd6"},
    "avx512_bf16": {"fp32": "06e587fa0cca1e6d", "bf16": "6f7635971a8bfdd7",
                    "packed_fp32": "4591c0db5d75944d", "packed_bf16": "011568ce15efa838",
                    "int8": "1749a00f26d2e1aa", "int8_packed": "3ec382f4fda54ae8",
                    "reference": "50386964a6818fd6"},
    # Intel Xeon (family 6 model 207), gcc 12.2.0, 2026-12-01, from csrc/gemm/: the AMX level, which
    # the Zen 4 above lacks (its fp32, int8 and reference rows equal avx512's, as they must)
    "amx": {"fp32": "06e587fa0cca1e6d", "bf16": "42b3cd19b8c0da3e",
            "packed_fp32": "4591c0db5d75944d", "packed_bf16": "1d2fbe27139ac40e",
            "int8": "1749a00f26d2e1aa", "int8_packed": "1eeac6cdd1a94e3b",
            "reference": "50386964a6818fd6"},
}

FAMILIES = ("fp32", "bf16", "packed_fp32", "packed_bf16", "int8", "int8_packed", "reference")


def values(shape, seed):
    """float32 in [-1, 1) with 24 significant bits, from a 64-bit integer mixer (splitmix64): the
    same bits on every machine."""
    n = int(np.prod(shape))
    with np.errstate(over="ignore"):
        u = (np.arange(n, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x100000001)) \
            * np.uint64(0x9E3779B97F4A7C15)
        u ^= u >> np.uint64(30)
        u *= np.uint64(0xBF58476D1CE4E5B9)
        u ^= u >> np.uint64(27)
        u *= np.uint64(0x94D049BB133111EB)
        u ^= u >> np.uint64(31)
    m = (u >> np.uint64(40)).astype(np.int64) - (1 << 23)    # in [-2^23, 2^23)
    return (m.astype(np.float64) / (1 << 23)).astype(np.float32).reshape(shape)


def operand(rows, cols, trans, seed):
    """op(x) is rows x cols; stored transposed when trans."""
    return values((cols, rows) if trans else (rows, cols), seed)


# (M, N, K): 1s, primes, just past the register tiles (generic 4 x 8, AVX2 6 x 16, AVX-512 14 x 32,
# amx 32 x 32), the K blocks (256; 512 for the bf16 kernels), the dot path (few rows of A @ B^T,
# K >= 64), an A block (MC: 128 .. 336 rows) and several NR panels. K = 1000 is four K blocks of
# 250, which a K block of any other size from 200 to 332 would cut differently (the smaller K
# here cut the same for a K block of 240 as of 256: checked by changing it).
SHAPES = [(1, 1, 1), (3, 5, 7), (7, 17, 33), (15, 33, 257), (33, 47, 513), (8, 200, 96),
          (24, 70, 300), (350, 40, 20), (61, 129, 64), (20, 40, 1000)]
TRANS = [(False, False), (False, True), (True, False), (True, True)]


def gemm_outputs(bf16):
    """Every product of the fp32 (or bf16) gemm, as bytes, in a fixed order."""
    seed = 0
    for M, N, K in SHAPES:
        for ta, tb in TRANS:
            seed += 1
            a, b = operand(M, K, ta, 3 * seed), operand(K, N, tb, 3 * seed + 1)
            out = np.empty((M, N), np.float32)
            yield _C.gemm(a, b, out, ta, tb, bf16=bf16).tobytes()
            out = values((M, N), 3 * seed + 2)
            yield _C.gemm(a, b, out, ta, tb, alpha=0.75, accumulate=True, bf16=bf16).tobytes()
    # an out inside a larger array (ldc > N), accumulating
    big = values((40, 90), 1000)
    a, b = operand(37, 130, False, 1001), operand(130, 81, True, 1002)
    yield np.ascontiguousarray(_C.gemm(a, b, big[1:38, 3:84], False, True, alpha=-1.5, accumulate=True,
                                       bf16=bf16)).tobytes()
    # batches: many small products (by batch), a broadcast weight, attention-head views
    a, b = values((12, 9, 30), 1003), values((12, 30, 25), 1004)
    yield _C.gemm(a, b, np.empty((12, 9, 25), np.float32), bf16=bf16).tobytes()
    a = values((3, 40, 64), 1005)
    w = np.broadcast_to(values((48, 64), 1006), (3, 48, 64))
    yield _C.gemm(a, w, np.empty((3, 40, 48), np.float32), False, True, bf16=bf16).tobytes()
    B, T, H, dh = 2, 19, 4, 16
    q = values((B, T, H * dh), 1007).reshape(B, T, H, dh).transpose(0, 2, 1, 3)
    k = values((B, T, H * dh), 1008).reshape(B, T, H, dh).transpose(0, 2, 1, 3)
    scores = _C.gemm(q, k, np.empty((B, H, T, T), np.float32), False, True, alpha=0.25, bf16=bf16)
    yield scores.tobytes()
    yield _C.gemm(scores, k, np.empty((B, H, T, dh), np.float32), bf16=bf16).tobytes()


PACKED_SHAPES = [(1, 1, 1), (3, 33, 7), (8, 70, 257), (14, 65, 513), (40, 96, 600), (350, 31, 40),
                 (5, 40, 1000)]


def packed_outputs(bf16):
    """gemm_pack_b's buffer and gemm_packed's products, as bytes, in a fixed order."""
    seed = 2000
    for M, N, K in PACKED_SHAPES:
        for tb in (False, True):
            seed += 1
            b = operand(K, N, tb, 3 * seed)
            packed = _C.gemm_pack_b(b, trans_b=tb, bf16=bf16)
            yield packed.data.tobytes()
            a = values((M, K), 3 * seed + 1)
            yield _C.gemm_packed(a, packed, np.empty((M, N), np.float32)).tobytes()
            out = values((M, N), 3 * seed + 2)
            yield _C.gemm_packed(a, packed, out, alpha=1.25, accumulate=True).tobytes()


# (M, N, K): odd K (pairs, quads), K past whole amx steps of 64, M past a 64-row block and the
# register tiles (AVX2 6 x 16, VNNI 12 x 32, amx 32 x 32), N past a panel.
INT8_SHAPES = [(1, 1, 1), (5, 17, 3), (13, 33, 65), (7, 100, 130), (70, 40, 257), (33, 65, 64)]


def int8_runs():
    """(packed buffer, products) of every int8 case, in a fixed order."""
    seed = 3000
    for M, N, K in INT8_SHAPES:
        seed += 1
        w = values((N, K), 3 * seed)
        w[0] *= 1e-3   # rows of different magnitudes: different scales
        q, scale = _C.qgemm_quantize(w)
        packed = _C.qgemm_pack(q, scale)
        x = values((M, K), 3 * seed + 1)
        x[-1] *= 37.0
        bias = values((N,), 3 * seed + 2)
        products = [q.tobytes(), scale.tobytes(),
                    _C.qgemm_packed(x, packed, None, np.empty((M, N), np.float32)).tobytes(),
                    _C.qgemm_packed(x, packed, bias, np.empty((M, N), np.float32)).tobytes()]
        yield packed.tobytes(), products


def reference_outputs():
    """gemm_reference (no instruction set of its own: one hash everywhere), small shapes."""
    seed = 4000
    for M, N, K in SHAPES[:5]:
        for ta, tb in TRANS:
            seed += 1
            a, b = operand(M, K, ta, 3 * seed), operand(K, N, tb, 3 * seed + 1)
            out = values((M, N), 3 * seed + 2)
            yield _C.gemm_reference(a, b, out, ta, tb, alpha=0.5, accumulate=True).tobytes()


def digest(chunks):
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()[:16]


def family_digest(family):
    """The hash of one family at the current level and settings."""
    if family in ("fp32", "bf16"):
        return digest(gemm_outputs(family == "bf16"))
    if family in ("packed_fp32", "packed_bf16"):
        return digest(packed_outputs(family == "packed_bf16"))
    if family == "int8":
        return digest(chunk for _, products in int8_runs() for chunk in products)
    if family == "int8_packed":
        return digest(packed for packed, _ in int8_runs())
    if family == "reference":
        return digest(reference_outputs())
    raise ValueError(family)


# The settings a family runs under; the first is the plain one. None of them may change a bit.
# (threads, forced gemm schedule, all threads however small, lazy shared threads, slow int8 path)
SETTINGS = [(1, "auto", False, False, False), (2, "auto", True, False, False),
            (3, "auto", True, False, False), (2, "tiles", True, False, False),
            (3, "shared", True, False, False), (3, "shared", True, True, False)]
INT8_SETTINGS = [(1, "auto", False, False, False), (2, "auto", True, False, False),
                 (3, "auto", True, False, False), (1, "auto", False, False, True)]


def digests(level, family):
    """{setting: hash} of one family at `level` under every setting."""
    before_isa, before_threads = _C.isa(), _C.get_num_threads()
    settings = INT8_SETTINGS if family.startswith("int8") else SETTINGS
    if family == "reference":
        settings = SETTINGS[:2]
    found = {}
    try:
        assert _C.set_isa(level) == level
        for setting in settings:
            threads, schedule, all_threads, lazy, slow = setting
            _C.set_num_threads(threads)
            _C._gemm_force_schedule(schedule, all_threads, lazy)
            _C._qgemm_force(all_threads, slow)
            found[setting] = family_digest(family)
    finally:
        _C._gemm_force_schedule("auto")
        _C._qgemm_force(False, False)
        _C.set_num_threads(before_threads)
        _C.set_isa(before_isa)
    return found


def cpu_vendor():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("level", LEVELS)
def test_gemm_results_keep_their_recorded_bits(level, family):
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("recorded on x86-64: elsewhere the compiler may contract the plain C kernels' "
                    "a * b + c into FMAs (aarch64 has them in its baseline)")
    if LEVELS.index(level) > LEVELS.index(BEST):
        pytest.skip(f"this CPU has no {level} (best: {BEST})")
    if family not in RECORDED.get(level, {}):
        pytest.skip(f"no hash recorded for {level} / {family} (recorded on a CPU without {level})")
    if (level, family) in VENDOR_DEPENDENT and cpu_vendor() not in RECORDED_ON[level]:
        pytest.skip(f"{level} / {family}: the bf16 dot product's order of additions is the vendor's; measured "
                    f"on {' and '.join(RECORDED_ON[level])}, this CPU is {cpu_vendor()}")
    found = digests(level, family)
    plain = next(iter(found.values()))
    differ = {s: h for s, h in found.items() if h != plain}
    assert not differ, f"{level} / {family}: settings change bits: {found}"
    assert plain == RECORDED[level][family], \
        f"{level} / {family}: hash {plain}, recorded {RECORDED[level][family]}"


if __name__ == "__main__":
    # The table for RECORDED, from this build on this CPU (every level it has).
    print("RECORDED = {")
    for level in LEVELS[:LEVELS.index(BEST) + 1]:
        row = {}
        for family in FAMILIES:
            found = digests(level, family)
            hashes = set(found.values())
            assert len(hashes) == 1, f"{level} / {family}: settings change bits: {found}"
            row[family] = hashes.pop()
        print(f"    {level!r}: {{" + ", ".join(f"{f!r}: {h!r}" for f, h in row.items()) + "},")
    print("}")
