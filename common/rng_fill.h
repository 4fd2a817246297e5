/* rng_fill.h: many normal draws from one df_rng stream, fast and bit for bit.
 *
 * df_rng_fill_normal(r, out, n, std, threads) writes out[i] = (float)(std * df_rng_normal(r))
 * for i = 0 .. n-1, in that order, and leaves r where n calls of df_rng_normal would have
 * left it: the same bits as the plain loop whatever the thread count. The generator is one
 * sequential stream (xoshiro256** has no cheap jump by an arbitrary count), so the calling
 * thread draws the uniforms of the next chunk while worker threads turn the current chunk's
 * uniforms into values (log, sqrt, cos: about 45 ns a value, the expensive part).
 * threads <= 0: the online CPUs, at most DF_RNG_FILL_MAX_THREADS. A failed thread start or
 * allocation falls back to doing that work on the calling thread (same result). */
#ifndef DF_RNG_FILL_H
#define DF_RNG_FILL_H

#include "util.h"

#include <stddef.h>

#define DF_RNG_FILL_MAX_THREADS 32
#define DF_RNG_FILL_CHUNK ((size_t)1 << 20) /* values per chunk (2 uniforms each) */

void df_rng_fill_normal(df_rng *r, float *out, size_t n, double std, int threads);

#endif
