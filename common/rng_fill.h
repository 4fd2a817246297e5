/* rng_fill.h: many normal draws from one df_rng stream, fast and bit for bit (prefix
 * df_rng_fill, df_rng_jump).
 *
 * df_rng_fill_normal(r, out, n, std, threads) writes out[i] = (float)(std * df_rng_normal(r))
 * for i = 0 .. n-1, in that order, and leaves r where n calls of df_rng_normal would have
 * left it: the same bits as the plain loop whatever the thread count. Each thread takes a
 * contiguous range of values and a copy of the generator jumped to that range's first draw
 * (df_rng_normal takes exactly 2 uniforms, so value i starts 2i steps on), so both the draws
 * and the arithmetic (log, sqrt, cos) run on every thread. threads <= 0: the online CPUs,
 * at most DF_RNG_FILL_MAX_THREADS, and at most one per DF_RNG_FILL_CHUNK values. A failed
 * thread start falls back to doing that range on the calling thread (same result).
 *
 * df_rng_jump(r, lo, hi) moves r on by hi * 2^64 + lo steps, as that many df_rng_next calls
 * would, in about 256 steps' time plus some polynomial arithmetic (rng_fill.c says how).
 * 0, or -1 if the generator's polynomial could not be found (never expected; the fill then
 * runs on one thread). */
#ifndef DF_RNG_FILL_H
#define DF_RNG_FILL_H

#include "util.h"

#include <stddef.h>

#define DF_RNG_FILL_MAX_THREADS 32
#define DF_RNG_FILL_CHUNK ((size_t)1 << 20) /* values per chunk (2 uniforms each) */

void df_rng_fill_normal(df_rng *r, float *out, size_t n, double std, int threads);
int df_rng_jump(df_rng *r, uint64_t steps_lo, uint64_t steps_hi);

#endif
