/* The packed buffer (qgemm.h). */
#include "qgemm_isa.h"

#include <string.h>

typedef struct {
    char magic[8];         /* "TFQGEMM1" */
    int32_t isa, nr, kg, reserved;
    int64_t N, K;
    char pad[24];
} qgemm_header;

typedef char qgemm_header_is_64_bytes[sizeof(qgemm_header) == 64 ? 1 : -1];

static const char qgemm_magic[8] = {'T', 'F', 'Q', 'G', 'E', 'M', 'M', '1'};

/* Byte offsets of the sections; returns the total size. */
long qgemm_sections(int isa, long N, long K, long *scale_at, long *comp_at, long *panels_at)
{
    qgemm_layout L = qgemm_layout_of(isa);
    long np = ceil_div(N, L.nr) * L.nr;
    *scale_at = round64(sizeof(qgemm_header));
    *comp_at = *scale_at + round64(np * (long)sizeof(float));
    *panels_at = *comp_at + round64(np * (long)sizeof(int32_t));
    return *panels_at + round64(np * ceil_div(K, L.kg) * L.kg);
}

long qgemm_packed_bytes(int isa, long N, long K)
{
    long s, c, p;
    return qgemm_sections(isa, N, K, &s, &c, &p);
}

void qgemm_pack(int isa, long N, long K, const int8_t *Q, const float *scale, void *packed)
{
    const qgemm_layout L = qgemm_layout_of(isa);
    long scale_at, comp_at, panels_at;
    const long bytes = qgemm_sections(isa, N, K, &scale_at, &comp_at, &panels_at);
    const long np = ceil_div(N, L.nr), groups = ceil_div(K, L.kg);
    char *base = packed;
    qgemm_header h;
    memset(&h, 0, sizeof h);
    memcpy(h.magic, qgemm_magic, sizeof h.magic);
    h.isa = isa; h.nr = L.nr; h.kg = L.kg; h.N = N; h.K = K;
    memcpy(base, &h, sizeof h);
    memset(base + sizeof h, 0, (size_t)(bytes - (long)sizeof h));   /* padding included */
    float *ws = (float *)(base + scale_at);
    int32_t *comp = (int32_t *)(base + comp_at);
    int8_t *panels = (int8_t *)(base + panels_at);
#pragma omp parallel for num_threads(tf_team(N * K, QGEMM_GRAIN / 4)) schedule(static)
    for (long p = 0; p < np; p++) {
        int8_t *dst = panels + p * groups * L.nr * L.kg;
        for (int j = 0; j < L.nr && p * L.nr + j < N; j++) {
            const long n = p * L.nr + j;
            const int8_t *q = Q + n * K;
            int32_t sum = 0;
            for (long k = 0; k < K; k++) {
                dst[((k / L.kg) * L.nr + j) * L.kg + k % L.kg] = q[k];
                sum += q[k];
            }
            ws[n] = scale[n];
            comp[n] = 128 * sum;
        }
    }
}

int qgemm_packed_info(const void *packed, long bytes, int *isa, long *N, long *K)
{
    qgemm_header h;
    if (bytes < (long)sizeof h) return -1;
    memcpy(&h, packed, sizeof h);
    if (memcmp(h.magic, qgemm_magic, sizeof h.magic) != 0) return -1;
    if (h.isa < TF_ISA_GENERIC || h.isa >= TF_ISA_LEVELS || h.N < 0 || h.K < 0 || h.K > QGEMM_MAX_K
        || h.N > (1L << 40)) return -1;
    qgemm_layout L = qgemm_layout_of(h.isa);
    if (h.nr != L.nr || h.kg != L.kg || qgemm_packed_bytes(h.isa, h.N, h.K) != bytes) return -1;
    *isa = h.isa; *N = (long)h.N; *K = (long)h.K;
    return 0;
}
