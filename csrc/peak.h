/* The instruction ceilings of this core, measured: what "fraction of peak" in the benchmarks is
 * a fraction of.
 *
 * peak_fma_gflops(isa): fp32 FMAs of the ISA's widest vector (AVX-512: zmm, AVX2: ymm, generic:
 * scalar multiply-add), 12-16 independent chains, counted as 2 flops a lane: the ceiling of the fp32 GEMM.
 * peak_bf16_gflops(isa): the bf16 GEMM's instruction: amx: tdpbf16ps on four C tiles, 16 x 16 x 32
 * products each; avx512_bf16: vdpbf16ps, 32 products a zmm, 2 flops each; below that the fp32
 * FMAs the bf16-rounded operands are multiplied with.
 * peak_int8_gops(isa): the int8 kernel's instruction (amx: tdpbusd on four C tiles, 16 x 16 x 64
 * products each; avx512_vnni: vpdpbusd, 64 u8 x s8 products;
 * AVX2: vpmaddwd + vpaddd, 16 int16 products per pair; generic: 32-bit multiply-adds), counted
 * as 2 ops per product.
 * Both run on the calling thread only, for about `seconds`, and return per-core figures.
 */
#ifndef TF_PEAK_H
#define TF_PEAK_H

double peak_fma_gflops(int isa, double seconds);
double peak_bf16_gflops(int isa, double seconds);
double peak_int8_gops(int isa, double seconds);

#endif
