/* Arm dot-product micro-kernel (FEAT_DotProd, the neon_dotprod level): 4 rows x 16 columns, 16
 * int32x4 accumulators. SDOT multiplies four signed bytes by four signed bytes and adds the four
 * products into one int32 lane: the activations stay signed (qgemm_to_signed), so no +128 shift
 * and no compensation, unlike vpdpbusd. Each row's 16 bytes (four groups of four k) are loaded
 * once; the by-element form (vdotq_laneq_s32) takes group l from lane l for all 16 columns of the
 * panel's group, [16][4] bytes in four registers. The sum is exact (|product| <= 127 * 127), and
 * the dequantization is qgemm_isa.h's, one element at a time in the same order (vfmaq_f32 is
 * fmaf): the bits are the other kernels'.
 *
 * Native NEON, not SIMDe: SDOT has no x86 twin the AVX2 kernels could be translated from. Built
 * with the dot-product target for this file's functions only; dispatch.c runs it where the CPU
 * reports the feature (cpu.c). */
#include "qgemm_isa.h"

#if defined(QGEMM_NEON_DOTPROD)
#include <arm_neon.h>

#define DOT_MR 4
#define DOT_NR 16
#define TARGET_DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))

/* One group of four k for all rows: the panel's [16][4] bytes of group g against lane L of
 * each row's register x[i]. */
#define DOT_GROUP(L, w)                                                                      \
    do {                                                                                     \
        const int8x16_t w0 = vld1q_s8(w), w1 = vld1q_s8((w) + 16), w2 = vld1q_s8((w) + 32), \
                        w3 = vld1q_s8((w) + 48);                                             \
        for (int i = 0; i < DOT_MR; i++)                                                     \
            if (i < mr) {                                                                    \
                c[i][0] = vdotq_laneq_s32(c[i][0], w0, x[i], L);                             \
                c[i][1] = vdotq_laneq_s32(c[i][1], w1, x[i], L);                             \
                c[i][2] = vdotq_laneq_s32(c[i][2], w2, x[i], L);                             \
                c[i][3] = vdotq_laneq_s32(c[i][3], w3, x[i], L);                             \
            }                                                                                \
    } while (0)

static inline __attribute__((always_inline)) TARGET_DOTPROD void
tile_dot(long groups, const int8_t *restrict Xs, long lds, const float *xs,
         const int8_t *restrict panel, const float *ws, const float *bias, float *restrict C,
         long ldc, int nr, const int mr)
{
    int32x4_t c[DOT_MR][4];
    int8x16_t x[DOT_MR];
    for (int i = 0; i < DOT_MR; i++)
        if (i < mr)
            for (int q = 0; q < 4; q++) c[i][q] = vdupq_n_s32(0);
    long g = 0;
    for (; g + 4 <= groups; g += 4) {
        for (int i = 0; i < DOT_MR; i++)
            if (i < mr) x[i] = vld1q_s8(Xs + i * lds + 4 * g);
        const int8_t *w = panel + g * 4 * DOT_NR;
        DOT_GROUP(0, w);
        DOT_GROUP(1, w + 64);
        DOT_GROUP(2, w + 128);
        DOT_GROUP(3, w + 192);
    }
    if (g < groups) {   /* 1-3 groups left: the row's 16 bytes are inside its padded row (ldq) */
        for (int i = 0; i < DOT_MR; i++)
            if (i < mr) x[i] = vld1q_s8(Xs + i * lds + 4 * g);
        const int8_t *w = panel + g * 4 * DOT_NR;
        const long left = groups - g;
        DOT_GROUP(0, w);
        if (left > 1) DOT_GROUP(1, w + 64);
        if (left > 2) DOT_GROUP(2, w + 128);
    }
    for (int i = 0; i < mr; i++) {
        const float32x4_t xv = vdupq_n_f32(xs[i]);
        float *out = C + i * ldc;
        if (nr == DOT_NR) {
            for (int q = 0; q < 4; q++) {
                const float32x4_t s = vmulq_f32(xv, vld1q_f32(ws + 4 * q));
                const float32x4_t a = vcvtq_f32_s32(c[i][q]);
                vst1q_f32(out + 4 * q, bias ? vfmaq_f32(vld1q_f32(bias + 4 * q), a, s) : vmulq_f32(a, s));
            }
        } else {   /* the panel's last columns: the same operations, one at a time */
            float a[DOT_NR], sc[DOT_NR];
            for (int q = 0; q < 4; q++) {
                vst1q_f32(a + 4 * q, vcvtq_f32_s32(c[i][q]));
                vst1q_f32(sc + 4 * q, vmulq_f32(xv, vld1q_f32(ws + 4 * q)));   /* padded to NR */
            }
            for (int j = 0; j < nr; j++)
                out[j] = bias ? fmaf(a[j], sc[j], bias[j]) : a[j] * sc[j];
        }
    }
}

#define DOT_TILE(R)                                                                          \
    static TARGET_DOTPROD void tile_dot_##R(long groups, const int8_t *Xs, long lds,         \
                                            const float *xs, const int8_t *panel,            \
                                            const float *ws, const float *bias, float *C,    \
                                            long ldc, int nr)                                \
    {                                                                                        \
        tile_dot(groups, Xs, lds, xs, panel, ws, bias, C, ldc, nr, R);                       \
    }
DOT_TILE(1) DOT_TILE(2) DOT_TILE(3) DOT_TILE(4)

typedef void (*dot_tile_fn)(long, const int8_t *, long, const float *, const int8_t *,
                            const float *, const float *, float *, long, int);
static const dot_tile_fn tiles_dot[DOT_MR + 1] = {0, tile_dot_1, tile_dot_2, tile_dot_3, tile_dot_4};

/* Xq's rows hold int8 activations here (qgemm_to_signed): row i at (int8_t *)(Xq + i * ldq). */
void qgemm_kernel_neon_dotprod(long m, long K, const int16_t *Xq, long ldq, const float *xs,
                               const int8_t *panel, const float *ws, const int32_t *comp,
                               const float *bias, float *C, long ldc, int nr)
{
    (void)comp;
    const long groups = ceil_div(K, 4), lds = ldq * (long)sizeof(int16_t);
    const int8_t *Xs = (const int8_t *)Xq;
    for (long i = 0; i < m; i += DOT_MR) {
        int mr = (int)min_l(DOT_MR, m - i);
        tiles_dot[mr](groups, Xs + i * lds, lds, xs + i, panel, ws, bias, C + i * ldc, ldc, nr);
    }
}
#endif
