/* test_rng_fill: df_rng_jump moves the generator as that many steps would (counts around the
 * polynomial's 256, 2^128 as the published jump); df_rng_fill_normal gives the plain
 * df_rng_normal loop's values bit for bit,
 * and leaves the generator where that loop leaves it, for sizes around the chunk boundary and
 * any thread count; dflash_params_init_random (which uses it) gives what its definition says:
 * norms 1, every other tensor std * df_rng_normal in tensor order. */
#include "dflash/dflash_model.h"
#include "rng_fill.h"
#include "test_helpers.h"
#include "util.h"

static float *ref_fill(uint64_t seed, size_t n, double std, uint64_t *next)
{
    float *v = malloc((n ? n : 1) * sizeof *v);
    T_ASSERT(v);
    df_rng r;
    df_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(std * df_rng_normal(&r));
    *next = df_rng_next(&r);
    return v;
}

/* df_rng_jump == that many df_rng_next calls; 2^128 == the authors' published jump */
static void jumps(void)
{
    const uint64_t counts[] = {0, 1, 2, 255, 256, 257, 1000, 65537, (1u << 20) + 3, 2000003};
    for (size_t i = 0; i < DF_ARRAY_LEN(counts); i++) {
        df_rng a, b;
        df_rng_seed(&a, 7 + i);
        b = a;
        for (uint64_t k = 0; k < counts[i]; k++)
            (void)df_rng_next(&a);
        T_ASSERT(df_rng_jump(&b, counts[i], 0) == 0);
        if (memcmp(a.s, b.s, sizeof a.s)) {
            fprintf(stderr, "test_rng_fill: a jump of %llu is not %llu steps\n", (unsigned long long)counts[i],
                    (unsigned long long)counts[i]);
            exit(1);
        }
    }
    static const uint64_t JUMP[4] = {0x180ec6d33cfd0abaull, 0xd5a61266f0c9392cull, 0xa9582618e03fc9aaull,
                                     0x39abdc4529b1661cull}; /* xoshiro256's jump(): 2^128 steps */
    df_rng a;
    df_rng_seed(&a, 99);
    uint64_t acc[4] = {0};
    for (int w = 0; w < 4; w++)
        for (int bit = 0; bit < 64; bit++) {
            if (JUMP[w] & (1ull << bit))
                for (int k = 0; k < 4; k++)
                    acc[k] ^= a.s[k];
            (void)df_rng_next(&a);
        }
    df_rng c;
    df_rng_seed(&c, 99);
    T_ASSERT(df_rng_jump(&c, 0, 1ull << 63) == 0 && df_rng_jump(&c, 0, 1ull << 63) == 0); /* 2 x 2^127 */
    T_ASSERT(memcmp(c.s, acc, sizeof acc) == 0);
}

int main(void)
{
    jumps();
    const size_t CH = DF_RNG_FILL_CHUNK;
    const size_t sizes[] = {0, 1, 1000, CH - 1, CH, CH + 1, 2 * CH + 12345};
    const int threads[] = {1, 2, 3, 5, 0, DF_RNG_FILL_MAX_THREADS + 7};
    for (size_t si = 0; si < DF_ARRAY_LEN(sizes); si++) {
        size_t n = sizes[si];
        uint64_t seed = 1000 + si, want_next;
        float *want = ref_fill(seed, n, 0.02, &want_next);
        float *got = malloc((n ? n : 1) * sizeof *got);
        T_ASSERT(got);
        for (size_t ti = 0; ti < DF_ARRAY_LEN(threads); ti++) {
            memset(got, 0xff, (n ? n : 1) * sizeof *got); /* NaNs where nothing was written */
            df_rng r;
            df_rng_seed(&r, seed);
            df_rng_fill_normal(&r, got, n, 0.02, threads[ti]);
            if (n && memcmp(got, want, n * sizeof *got)) {
                size_t i = 0;
                while (i < n && !memcmp(&got[i], &want[i], sizeof *got))
                    i++;
                fprintf(stderr, "test_rng_fill: n %zu threads %d: value %zu is %a, the plain loop gives %a\n", n,
                        threads[ti], i, (double)got[i], (double)want[i]);
                exit(1);
            }
            T_ASSERT(df_rng_next(&r) == want_next);
        }
        free(got);
        free(want);
    }

    /* the drafter's init at a size that spans chunks: 2 layers of d 512, I 1024 */
    dflash_config c;
    dflash_config_tiny(&c);
    c.hidden = 512, c.intermediate = 1024, c.n_layers = 2, c.n_heads = 8, c.n_kv_heads = 2, c.head_dim = 64;
    dflash_params p;
    T_ASSERT_RC(dflash_params_alloc(&p, &c));
    T_ASSERT(p.n > 2 * CH);
    dflash_params_init_random(&p, &c, 77, 0.05f);
    float *want = malloc(p.n * sizeof *want);
    T_ASSERT(want);
    df_rng r;
    df_rng_seed(&r, 77);
    for (int i = 0; i < dflash_tensor_count(&c); i++) {
        dflash_tensor t;
        dflash_tensor_info(&c, i, &t);
        for (size_t e = 0; e < t.numel; e++)
            want[t.offset + e] = t.is_norm ? 1.0f : (float)(0.05f * df_rng_normal(&r));
    }
    T_ASSERT(memcmp(want, p.data, p.n * sizeof *want) == 0);
    free(want);
    printf("test_rng_fill: ok (%zu sizes x %zu thread counts; the drafter init of %zu floats)\n", DF_ARRAY_LEN(sizes),
           DF_ARRAY_LEN(threads), p.n);
    dflash_params_free(&p);
    return 0;
}
