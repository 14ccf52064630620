/* A 64-bit fingerprint of a block of memory, at memory speed on every thread.
 *
 * Decoding keeps weights converted for its kernels (packed, rounded to bf16, quantized to int8)
 * from one call to the next and must notice when the float32 weights changed since, including
 * changes made in place through numpy views. The fingerprint is a sum over 8-byte words of
 * (word ^ i * golden) * odd, mod 2^64, per fixed 1 MiB chunk, the chunks combined in order: any
 * change of a single word changes it (an odd multiplier is a bijection mod 2^64), and the value
 * does not depend on the thread count. Not a cryptographic hash: it guards against stale caches,
 * not against an adversary.
 */
#ifndef TF_CHECKSUM_H
#define TF_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

uint64_t checksum64(const void *data, size_t bytes);

#endif
