/* rng_fill.c: df_rng_fill_normal and df_rng_jump (rng_fill.h).
 *
 * The jump. xoshiro256's state update s -> T s is linear over GF(2) (xors, shifts and a
 * rotation of the 256 state bits; the ** scrambler only shapes the output). So T^J is p(T)
 * for the polynomial q(x) = x^J mod c(x), c the characteristic polynomial of T, and
 * T^J s = sum of T^j s over the bits j of q: 256 steps of the generator and a xor per set
 * bit. c is found once per process by Berlekamp-Massey over 512 bits of one state bit's
 * sequence (c is primitive of degree 256, so any non-zero sequence has it as its minimal
 * polynomial), and checked: x^(2^128) mod c must be the jump polynomial xoshiro's authors
 * publish for 2^128 steps. */
#include "rng_fill.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- polynomials over GF(2) of degree <= 256: bit j of w[j / 64] is the coefficient of x^j */

#define PW 5 /* words: 257 bits */
typedef struct gf2poly {
    uint64_t w[PW];
} gf2poly;

static int bit_of(const uint64_t *w, int j)
{
    return (int)((w[j >> 6] >> (j & 63)) & 1u);
}

static void flip(uint64_t *w, int j)
{
    w[j >> 6] ^= 1ull << (j & 63);
}

static gf2poly charpoly; /* c(x), degree 256 */
static int charpoly_ok;  /* 1 when found and checked */
static pthread_once_t charpoly_once = PTHREAD_ONCE_INIT;

/* a * b mod c, a and b of degree < 256 */
static gf2poly mulmod(const gf2poly *a, const gf2poly *b)
{
    uint64_t prod[2 * PW] = {0}; /* degree <= 510 */
    for (int j = 0; j < 256; j++) {
        if (!bit_of(b->w, j))
            continue;
        int wsh = j >> 6, bsh = j & 63; /* prod ^= a << j */
        for (int k = 0; k < 4; k++) {
            prod[k + wsh] ^= a->w[k] << bsh;
            if (bsh)
                prod[k + wsh + 1] ^= a->w[k] >> (64 - bsh);
        }
    }
    for (int j = 510; j >= 256; j--) /* reduce: x^256 = c(x) - x^256 */
        if (bit_of(prod, j))
            for (int k = 0; k <= 256; k++)
                if (bit_of(charpoly.w, k))
                    flip(prod, j - 256 + k);
    gf2poly r = {{0}};
    memcpy(r.w, prod, 4 * sizeof(uint64_t));
    return r;
}

/* x^e mod c for an exponent of up to 192 bits (e[0] the low word) */
static gf2poly xpow(const uint64_t e[3])
{
    gf2poly r = {{1}};
    int top = 191;
    while (top >= 0 && !bit_of(e, top))
        top--;
    for (int j = top; j >= 0; j--) {
        r = mulmod(&r, &r);
        if (bit_of(e, j)) { /* r *= x */
            uint64_t carry = 0;
            for (int k = 0; k < PW; k++) {
                uint64_t nc = r.w[k] >> 63;
                r.w[k] = (r.w[k] << 1) | carry;
                carry = nc;
            }
            if (bit_of(r.w, 256))
                for (int k = 0; k < PW; k++)
                    r.w[k] ^= charpoly.w[k];
        }
    }
    return r;
}

/* s = q(T) s */
static void apply(df_rng *r, const gf2poly *q)
{
    uint64_t acc[4] = {0};
    df_rng t = *r;
    for (int j = 0; j < 256; j++) {
        if (bit_of(q->w, j))
            for (int k = 0; k < 4; k++)
                acc[k] ^= t.s[k];
        (void)df_rng_next(&t);
    }
    memcpy(r->s, acc, sizeof acc);
}

static void find_charpoly(void)
{
    enum { N = 512 };
    uint8_t s[N];
    df_rng r;
    df_rng_seed(&r, 1);
    for (int n = 0; n < N; n++) {
        s[n] = (uint8_t)(r.s[0] & 1u);
        (void)df_rng_next(&r);
    }
    /* Berlekamp-Massey: C(x) = 1 + c_1 x + ... + c_L x^L with s_n = sum_i c_i s_(n-i) */
    uint8_t C[N + 1] = {1}, B[N + 1] = {1}, T[N + 1];
    int L = 0, m = 1;
    for (int n = 0; n < N; n++) {
        int d = s[n];
        for (int i = 1; i <= L; i++)
            d ^= C[i] & s[n - i];
        if (!d) {
            m++;
            continue;
        }
        memcpy(T, C, sizeof T);
        for (int i = 0; i + m <= N; i++)
            C[i + m] ^= B[i];
        if (2 * L <= n) {
            L = n + 1 - L;
            memcpy(B, T, sizeof B);
            m = 1;
        } else {
            m++;
        }
    }
    if (L != 256)
        return;
    memset(&charpoly, 0, sizeof charpoly);
    for (int j = 0; j <= 256; j++) /* c(x) = x^L C(1/x) */
        if (C[256 - j])
            flip(charpoly.w, j);
    static const uint64_t jump128[4] = {0x180ec6d33cfd0abaull, 0xd5a61266f0c9392cull, 0xa9582618e03fc9aaull,
                                        0x39abdc4529b1661cull};
    const uint64_t e[3] = {0, 0, 1}; /* 2^128 */
    gf2poly q = xpow(e);
    charpoly_ok = memcmp(q.w, jump128, sizeof jump128) == 0 && q.w[4] == 0;
}

int df_rng_jump(df_rng *r, uint64_t steps_lo, uint64_t steps_hi)
{
    pthread_once(&charpoly_once, find_charpoly);
    if (!charpoly_ok)
        return -1;
    const uint64_t e[3] = {steps_lo, steps_hi, 0};
    gf2poly q = xpow(e);
    apply(r, &q);
    return 0;
}

/* ---- the fill: each thread its own range of values, its generator jumped there -------- */

typedef struct normal_job {
    df_rng r; /* at the job's first value */
    float *out;
    size_t n;
    double std;
} normal_job;

static void *normal_work(void *arg)
{
    const normal_job *j = arg;
    df_rng r = j->r;                    /* a local copy: the jobs sit side by side, so stepping j->r in place
                      * made the threads fight over one cache line (2 threads ran 2.7x slower
                      * than one) */
    for (size_t i = 0; i < j->n; i++) { /* df_rng_normal, inlined: u1 then u2 */
        double u1 = df_rng_uniform(&r), u2 = df_rng_uniform(&r);
        j->out[i] = (float)(j->std * df_normal_of(u1, u2));
    }
    return NULL;
}

void df_rng_fill_normal(df_rng *r, float *out, size_t n, double std, int threads)
{
    if (threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        threads = c < 1 ? 1 : (int)DF_MIN(c, (long)DF_RNG_FILL_MAX_THREADS);
    }
    threads = (int)DF_MIN((size_t)DF_MIN(threads, DF_RNG_FILL_MAX_THREADS), n / DF_RNG_FILL_CHUNK);
    df_rng end = *r;
    /* 2 uniforms a value: the end of the fill is 2n steps on (n < 2^63: no carry) */
    if (threads < 2 || df_rng_jump(&end, 2 * (uint64_t)n, 0) < 0) { /* small, one thread, or no jump */
        for (size_t i = 0; i < n; i++)
            out[i] = (float)(std * df_rng_normal(r));
        return;
    }
    pthread_t th[DF_RNG_FILL_MAX_THREADS];
    normal_job job[DF_RNG_FILL_MAX_THREADS];
    int started[DF_RNG_FILL_MAX_THREADS] = {0};
    size_t per = (n + (size_t)threads - 1) / (size_t)threads;
    int nj = 0;
    for (size_t a = 0; a < n; a += per, nj++) {
        job[nj] = (normal_job){*r, out + a, DF_MIN(per, n - a), std};
        if (a)
            (void)df_rng_jump(&job[nj].r, 2 * (uint64_t)a, 0); /* charpoly found above: cannot fail */
        if (nj > 0)
            started[nj] = pthread_create(&th[nj], NULL, normal_work, &job[nj]) == 0;
    }
    normal_work(&job[0]); /* the first range on this thread */
    for (int k = 1; k < nj; k++) {
        if (started[k])
            pthread_join(th[k], NULL);
        else
            normal_work(&job[k]);
    }
    *r = end;
}
