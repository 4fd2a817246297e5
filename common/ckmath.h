/* ckmath.h: checked size arithmetic for sizes that come from files (prefix ckm_).
 *
 * Every size computed from an untrusted number (a config.json dimension, a shard header
 * count, a safetensors shape, a topology field) goes through these instead of a bare * or +,
 * so an overflow is an error the caller reports (naming the file and the field) rather than
 * a wrapped value that later passes a bounds check. Each returns 0 and stores the result,
 * or -EOVERFLOW and leaves *out unspecified. ckm_mul3 / ckm_mul4 chain ckm_mul.
 */
#ifndef DF_CKMATH_H
#define DF_CKMATH_H

#include <errno.h>
#include <stdint.h>

static inline int ckm_mul(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -EOVERFLOW : 0;
}

static inline int ckm_add(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_add_overflow(a, b, out) ? -EOVERFLOW : 0;
}

static inline int ckm_mul3(uint64_t a, uint64_t b, uint64_t c, uint64_t *out)
{
    uint64_t t;
    return ckm_mul(a, b, &t) || ckm_mul(t, c, out) ? -EOVERFLOW : 0;
}

static inline int ckm_mul4(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t *out)
{
    uint64_t t;
    return ckm_mul3(a, b, c, &t) || ckm_mul(t, d, out) ? -EOVERFLOW : 0;
}

/* a * b + c */
static inline int ckm_muladd(uint64_t a, uint64_t b, uint64_t c, uint64_t *out)
{
    uint64_t t;
    return ckm_mul(a, b, &t) || ckm_add(t, c, out) ? -EOVERFLOW : 0;
}

#endif
