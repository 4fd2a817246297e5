/* test_helpers.h: assertion macros for the C tests. A failed assertion prints
 * file:line and the expression and exits 1; T_SKIP exits 77 (run_tests.sh: skipped). */
#ifndef DF_TEST_HELPERS_H
#define DF_TEST_HELPERS_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T_ASSERT(expr)                                                                   \
    do {                                                                                 \
        if (!(expr)) {                                                                   \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #expr); \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)
/* rc_expr must return >= 0 (0 or -errno convention) */
#define T_ASSERT_RC(expr)                                                                                              \
    do {                                                                                                               \
        long t_rc_ = (long)(expr);                                                                                     \
        if (t_rc_ < 0) {                                                                                               \
            fprintf(stderr, "%s:%d: %s returned %ld (%s)\n", __FILE__, __LINE__, #expr, t_rc_, strerror((int)-t_rc_)); \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)
#define T_ASSERT_STREQ(a, b)                                                                               \
    do {                                                                                                   \
        const char *t_a_ = (a), *t_b_ = (b);                                                               \
        if (strcmp(t_a_, t_b_) != 0) {                                                                     \
            fprintf(stderr, "%s:%d: expected\n  \"%s\"\ngot\n  \"%s\"\n", __FILE__, __LINE__, t_b_, t_a_); \
            exit(1);                                                                                       \
        }                                                                                                  \
    } while (0)
#define T_SKIP(...)                      \
    do {                                 \
        printf("SKIPPED: " __VA_ARGS__); \
        printf("\n");                    \
        exit(77);                        \
    } while (0)
#endif
