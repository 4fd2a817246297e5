/* test_cuda_check: the parts of common/cuda_check.h that need no GPU: df_err (util.h, which it uses),
 * df_cuda_err_prefix (what CUDA_TRY_RC_AT puts in front of a callee's message, cut to
 * the caller's buffer), CUDA_LAYER_STEP (the decode and drafter forwards' steps) and the
 * rc-propagating macros, on buffers with guard bytes after
 * them so a write past errlen fails the test (and ASAN sees it). */
#include "cuda_check.h"
#include "test_helpers.h"

#include <errno.h>
#include <string.h>

#define GUARD 0x5a

static int fails_with(int rc, char *err, size_t errlen, const char *msg)
{
    return rc < 0 ? df_err(err, errlen, rc, "%s", msg) : 0;
}

/* a callee of the convention, and a caller that names its step */
static int step(int layer, int rc, char *err, size_t errlen)
{
    CUDA_TRY_RC_AT(fails_with(rc, err, errlen, "launch of k: unspecified launch failure"), err, errlen, "layer %d: %s",
                   layer, "attention");
    return 7;
}

static int chain(int rc, char *err, size_t errlen)
{
    CUDA_TRY_RC(fails_with(rc, err, errlen, "inner"));
    return 1;
}

static int chain_goto(int rc, char *err, size_t errlen, int *cleaned)
{
    int r = 0;
    CUDA_TRY_RC_GOTO(fails_with(rc, err, errlen, "inner"), r, out);
    r = 2;
out:
    *cleaned = 1;
    return r;
}

/* a forward over layers whose step `bad_step` of layer `bad_layer` fails with rc */
static int forward(int bad_layer, int rc, char *err, size_t errlen)
{
    char kerr[32];
    strcpy(kerr, "stale");
    for (int l = 0; l < 3; l++) {
        CUDA_LAYER_STEP(l == bad_layer ? fails_with(rc, kerr, sizeof kerr, "bad shape") : 0, "fwd", "gemm qkv");
        CUDA_LAYER_STEP(0, __func__, "norm"); /* a success leaves kerr cleared */
        T_ASSERT(kerr[0] == 0);
    }
    return 3;
}

static void check_guard(const char *buf, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        T_ASSERT((unsigned char)buf[i] == GUARD);
}

int main(void)
{
    char buf[64 + 16];

    /* df_err: writes and returns rc; NULL or 0-sized err is fine */
    memset(buf, GUARD, sizeof buf);
    T_ASSERT(df_err(buf, 64, -EIO, "a %d b", 5) == -EIO);
    T_ASSERT_STREQ(buf, "a 5 b");
    T_ASSERT(df_err(NULL, 64, -EINVAL, "x") == -EINVAL);
    T_ASSERT(df_err(buf, 0, -ENOMEM, "x") == -ENOMEM);

    /* the step's name goes in front of the callee's message */
    memset(buf, GUARD, sizeof buf);
    T_ASSERT(step(3, -EIO, buf, 64) == -EIO);
    T_ASSERT_STREQ(buf, "layer 3: attention: launch of k: unspecified launch failure");
    check_guard(buf, 64, sizeof buf);
    /* success: untouched */
    memset(buf, GUARD, sizeof buf);
    T_ASSERT(step(3, 0, buf, 64) == 7);
    check_guard(buf, 0, sizeof buf);

    /* a short buffer: the prefix wins, the message's end is cut, never past errlen */
    for (size_t len = 1; len <= 64; len++) {
        memset(buf, GUARD, sizeof buf);
        T_ASSERT(step(12, -EIO, buf, len) == -EIO);
        check_guard(buf, len, sizeof buf);
        const char *full = "layer 12: attention: launch of k: unspecified launch failure";
        size_t want = strlen(full) < len - 1 ? strlen(full) : len - 1;
        T_ASSERT(strlen(buf) == want && strncmp(buf, full, want) == 0);
    }
    /* a prefix longer than the buffer */
    memset(buf, GUARD, sizeof buf);
    strcpy(buf, "callee");
    df_cuda_err_prefix(buf, 8, "%s", "a very long step name");
    T_ASSERT_STREQ(buf, "a very ");
    check_guard(buf, 8, sizeof buf);
    /* NULL err: nothing happens */
    df_cuda_err_prefix(NULL, 8, "x");
    T_ASSERT(step(1, -EIO, NULL, 0) == -EIO);

    /* CUDA_LAYER_STEP: the step, the layer and the callee's cause; -EINVAL stays, the rest
     * is -EIO; on success nothing is written */
    memset(buf, GUARD, sizeof buf);
    T_ASSERT(forward(1, -EINVAL, buf, 64) == -EINVAL);
    T_ASSERT_STREQ(buf, "fwd: layer 1: gemm qkv failed (-22): bad shape");
    check_guard(buf, 64, sizeof buf);
    T_ASSERT(forward(2, -ENOSPC, buf, 64) == -EIO);
    T_ASSERT_STREQ(buf, "fwd: layer 2: gemm qkv failed (-28): bad shape");
    memset(buf, GUARD, sizeof buf);
    T_ASSERT(forward(-1, 0, buf, 64) == 3);
    check_guard(buf, 0, sizeof buf);

    /* rc propagation */
    T_ASSERT(chain(-ENOSPC, buf, 64) == -ENOSPC);
    T_ASSERT_STREQ(buf, "inner");
    T_ASSERT(chain(0, buf, 64) == 1);
    int cleaned = 0;
    T_ASSERT(chain_goto(-EIO, buf, 64, &cleaned) == -EIO && cleaned);
    cleaned = 0;
    T_ASSERT(chain_goto(0, buf, 64, &cleaned) == 2 && cleaned);

    printf("test_cuda_check: ok\n");
    return 0;
}
