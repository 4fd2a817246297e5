/* isa.c: which vector instructions the CPU layers run with (nn_isa_*, nn.h).
 *
 * The build targets the x86-64 baseline (SSE2) and does not guess the machine; the hot
 * loops of matmul.c, matmul_backward.c and attention*.c are compiled a second time for
 * AVX and picked at run time. Both copies do the same operations in the same order on the
 * same lanes (no fused multiply-add: common/nn is built with -ffp-contract=off), so the
 * choice changes the speed and never a bit (tests/test_nn_exact.c runs every level the
 * CPU has against the plain loops).
 *
 * The level is read once per process: the best the CPU has, or lower when DF_NN_ISA says
 * so (base | avx); nn_isa_set changes it (tests, bench/nn/bench_nn_cpu.c). */
#include "nn/nn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_isa = -1; /* -1: not read yet */

static const char *const g_names[NN_ISA_COUNT] = {"base", "avx"};

const char *nn_isa_name(int isa)
{
    return isa >= 0 && isa < NN_ISA_COUNT ? g_names[isa] : "?";
}

int nn_isa_supported(int isa)
{
    switch (isa) {
    case NN_ISA_BASE: return 1;
#if defined(__x86_64__) || defined(__i386__)
    case NN_ISA_AVX: __builtin_cpu_init(); return __builtin_cpu_supports("avx");
#endif
    default: return 0;
    }
}

static int best(void)
{
    int isa = NN_ISA_COUNT - 1;
    while (isa > NN_ISA_BASE && !nn_isa_supported(isa))
        isa--;
    return isa;
}

/* The level at first use: the best supported, or DF_NN_ISA's when that is supported. A
 * value that is not a level, or one the CPU lacks, is said on stderr once and the best
 * supported level is used (the bits are the same either way). */
static int initial(void)
{
    const char *env = getenv("DF_NN_ISA");
    int isa = best();
    if (!env || !*env)
        return isa;
    for (int i = 0; i < NN_ISA_COUNT; i++)
        if (!strcmp(env, g_names[i])) {
            if (nn_isa_supported(i))
                return i;
            fprintf(stderr, "DF_NN_ISA=%s: this CPU does not have it; using %s\n", env, g_names[isa]);
            return isa;
        }
    fprintf(stderr, "DF_NN_ISA=%s: expected base or avx; using %s\n", env, g_names[isa]);
    return isa;
}

int nn_isa(void)
{
    int isa = __atomic_load_n(&g_isa, __ATOMIC_RELAXED);
    if (isa < 0) { /* two threads may both get here: they store the same value */
        isa = initial();
        __atomic_store_n(&g_isa, isa, __ATOMIC_RELAXED);
    }
    return isa;
}

int nn_isa_set(int isa)
{
    if (isa < 0 || isa >= NN_ISA_COUNT)
        return -EINVAL;
    if (!nn_isa_supported(isa))
        return -ENOTSUP;
    int prev = nn_isa();
    __atomic_store_n(&g_isa, isa, __ATOMIC_RELAXED);
    return prev;
}
