/* test_par.c: the threaded loop (common/par.h) and what runs on it.
 *  - par_for: the parts cover [0, n) exactly once, in order, none smaller than asked
 *    (except when n itself is), at most par_threads() of them; n = 0 runs nothing;
 *  - safetensors_tensor_to_f32 on tensors large enough to be split over threads (BF16, F16,
 *    F32, at an odd byte address) equals the element-by-element conversion bit for bit;
 *  - target_check_finite on a large tensor names the lowest bad element whatever part it
 *    falls in (NaN planted late in the last part and early in a later block of the first;
 *    an Inf alone near the end; none at all). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "par.h"
#include "target/target_model.h"
#include "test_helpers.h"
#include "util.h"

static uint8_t *seen;
static int part_count;
static uint64_t part_lo[PAR_MAX_THREADS], part_hi[PAR_MAX_THREADS];

static void mark(void *ctx, uint64_t lo, uint64_t hi, int part)
{
    (void)ctx;
    for (uint64_t i = lo; i < hi; i++)
        __atomic_add_fetch(&seen[i], 1, __ATOMIC_RELAXED);
    part_lo[part] = lo, part_hi[part] = hi;
    __atomic_add_fetch(&part_count, 1, __ATOMIC_RELAXED);
}

static void check_cover(uint64_t n, uint64_t min_per)
{
    memset(seen, 0, n ? n : 1);
    part_count = 0;
    int k = par_for(n, min_per, mark, NULL);
    T_ASSERT(k == part_count && k <= par_threads());
    if (n == 0) {
        T_ASSERT(k == 0);
        return;
    }
    for (uint64_t i = 0; i < n; i++)
        T_ASSERT(seen[i] == 1);
    for (int p = 0; p < k; p++) {
        T_ASSERT(part_lo[p] == (p ? part_hi[p - 1] : 0));
        T_ASSERT(part_hi[p] - part_lo[p] >= (n < min_per ? n : min_per) || k == 1);
    }
    T_ASSERT(part_hi[k - 1] == n);
}

int main(void)
{
    seen = malloc(1 << 24);
    T_ASSERT(seen);
    uint64_t ns[] = {0, 1, 7, 1000, 4096, 100003, (1 << 24) - 5};
    for (size_t i = 0; i < DF_ARRAY_LEN(ns); i++) {
        check_cover(ns[i], 1);
        check_cover(ns[i], 1000);
        check_cover(ns[i], 1ull << 22);
    }
    printf("ok: par_for covers [0, n) once, in order, %d threads here\n", par_threads());

    /* conversion: 9 M elements (3 parts of at least 4 M would need more; 2 here on 2 cores) */
    uint64_t n = 9u << 20;
    df_rng r;
    df_rng_seed(&r, 21);
    unsigned char *raw = malloc(n * 4 + 1);
    float *got = malloc(n * 4), *want = malloc(n * 4);
    T_ASSERT(raw && got && want);
    unsigned char *odd = raw + 1; /* a foreign file's data need not be aligned */
    for (uint64_t i = 0; i < n * 4; i++)
        odd[i] = (unsigned char)df_rng_next(&r);
    safetensors_dtype dts[] = {SAFETENSORS_BF16, SAFETENSORS_F16, SAFETENSORS_F32};
    for (int d = 0; d < 3; d++) {
        size_t es = safetensors_dtype_size(dts[d]);
        safetensors_tensor t = {.dtype = dts[d], .ndim = 1, .nbytes = n * es, .data = odd};
        t.shape[0] = (int64_t)n;
        T_ASSERT_RC(safetensors_tensor_to_f32(&t, got));
        for (uint64_t i = 0; i < n; i++) {
            if (dts[d] == SAFETENSORS_F32) {
                memcpy(&want[i], odd + 4 * i, 4);
            } else {
                uint16_t v;
                memcpy(&v, odd + 2 * i, 2);
                want[i] = dts[d] == SAFETENSORS_BF16 ? safetensors_bf16_to_f32(v) : safetensors_f16_to_f32(v);
            }
        }
        T_ASSERT(memcmp(got, want, n * 4) == 0);
    }
    printf("ok: BF16, F16, F32 -> fp32 over %llu elements (threaded) == one element at a time, bit for bit\n",
           (unsigned long long)n);

    /* the finite scan */
    uint16_t *h = malloc(n * 2);
    T_ASSERT(h);
    for (uint64_t i = 0; i < n; i++)
        h[i] = 0x3f80; /* bf16 1.0 */
    safetensors_tensor t = {.dtype = SAFETENSORS_BF16, .ndim = 1, .nbytes = n * 2, .data = h};
    strcpy(t.name, "w");
    t.shape[0] = (int64_t)n;
    char err[300];
    T_ASSERT(target_check_finite(&t, "f", err, sizeof err) == 0);
    h[n - 3] = 0x7f80; /* +Inf near the end */
    T_ASSERT(target_check_finite(&t, "f", err, sizeof err) == -EINVAL);
    T_ASSERT(strstr(err, "element 9437181 is +Inf"));
    h[n - 10] = 0x7fc1; /* a NaN before it, same part */
    h[5000] = 0xffc0;   /* and one in the second block of the first part: the lowest */
    T_ASSERT(target_check_finite(&t, "f", err, sizeof err) == -EINVAL);
    T_ASSERT(strstr(err, "element 5000 is NaN"));
    printf("ok: the finite scan names the lowest bad element (%s)\n", err);
    free(h), free(raw), free(got), free(want), free(seen);
    printf("test_par: passed\n");
    return 0;
}
