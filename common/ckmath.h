/* ckmath.h: checked size arithmetic for sizes that come from files (prefix ckmath_).
 *
 * Every size computed from an untrusted number (a config.json dimension, a shard header
 * count, a safetensors shape, a topology field) goes through these instead of a bare * or +,
 * so an overflow is an error the caller reports (naming the file and the field) rather than
 * a wrapped value that later passes a bounds check. Each returns 0 and stores the result,
 * or -EOVERFLOW and leaves *out unspecified. ckmath_mul3 / ckmath_mul4 chain ckmath_mul.
 */
#ifndef DF_CKMATH_H
#define DF_CKMATH_H

#include <errno.h>
#include <stdint.h>

static inline int ckmath_mul(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -EOVERFLOW : 0;
}

static inline int ckmath_add(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_add_overflow(a, b, out) ? -EOVERFLOW : 0;
}

static inline int ckmath_mul3(uint64_t a, uint64_t b, uint64_t c, uint64_t *out)
{
    uint64_t t;
    return ckmath_mul(a, b, &t) || ckmath_mul(t, c, out) ? -EOVERFLOW : 0;
}

static inline int ckmath_mul4(uint64_t a, uint64_t b, uint64_t c, uint64_t d, uint64_t *out)
{
    uint64_t t;
    return ckmath_mul3(a, b, c, &t) || ckmath_mul(t, d, out) ? -EOVERFLOW : 0;
}

/* a * b + c */
static inline int ckmath_muladd(uint64_t a, uint64_t b, uint64_t c, uint64_t *out)
{
    uint64_t t;
    return ckmath_mul(a, b, &t) || ckmath_add(t, c, out) ? -EOVERFLOW : 0;
}

#endif
