/* Counter-based random numbers: every draw is a pure function of (seed, counter).
 *
 * Draw number `d` of stream `seed` is SplitMix64's output number `d` when SplitMix64 starts from
 * the state tf_rng_key(seed):
 *     u64(seed, d) = mix64(key(seed) + d * GAMMA)          (all mod 2^64)
 * mix64 is Stafford's "variant 13" finaliser used by SplitMix64 (the generator passes BigCrush,
 * all 64 bits of it); the key is itself mixed, so nearby seeds (0, 1, 2, ...) give unrelated
 * streams. No state is carried between calls, so any thread can draw any element: the numbers
 * never depend on the thread count or the SIMD level (the vector versions in dropout.c compute
 * the same integers).
 *
 * Each draw serves two counters: counter c takes 24 bits of draw c >> 1, its top 24 (bits 40-63)
 * for an even c and bits 8-31 for an odd one. (One draw a counter, as before 2026-12-05, spent
 * half of a training step's dropout time mixing bits that were thrown away.)
 *     u24(seed, c) = c even ? u64(seed, c / 2) >> 40 : (u64(seed, c / 2) >> 8) mod 2^24
 * uniform(seed, c) = u24(seed, c) * 2^-24: exact in float, in [0, 1).
 */
#ifndef TF_RNG_H
#define TF_RNG_H

#include <stdint.h>

#define TF_RNG_GAMMA 0x9E3779B97F4A7C15ull   /* 2^64 / golden ratio, odd */
#define TF_RNG_MIX1 0xBF58476D1CE4E5B9ull
#define TF_RNG_MIX2 0x94D049BB133111EBull
#define TF_RNG_SEED_SALT 0x243F6A8885A308D3ull /* digits of pi: key(0) != 0 */

static inline uint64_t tf_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * TF_RNG_MIX1;
    z = (z ^ (z >> 27)) * TF_RNG_MIX2;
    return z ^ (z >> 31);
}

/* The stream key of a seed (compute once per call, not per element). */
static inline uint64_t tf_rng_key(uint64_t seed) { return tf_mix64(seed ^ TF_RNG_SEED_SALT); }

/* 64 random bits: draw `counter` of the stream with key `key`. */
static inline uint64_t tf_rng_u64(uint64_t key, uint64_t counter)
{
    return tf_mix64(key + counter * TF_RNG_GAMMA);
}

/* 24 random bits for `counter`, an integer in [0, 2^24): half of draw counter >> 1 (above). */
static inline uint32_t tf_rng_u24(uint64_t key, uint64_t counter)
{
    const uint64_t u = tf_rng_u64(key, counter >> 1);
    return (uint32_t)(counter & 1 ? (u >> 8) & 0xFFFFFFu : u >> 40);
}

/* Uniform float in [0, 1), multiples of 2^-24. */
static inline float tf_rng_uniform(uint64_t key, uint64_t counter)
{
    return (float)tf_rng_u24(key, counter) * 0x1p-24f;
}

#endif
