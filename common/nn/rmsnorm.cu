/* rmsnorm.cu: the fused residual step of the target forward (nn_add_rmsnorm_cuda): residual
 * add, writing the captured layer output, and the next RMSNorm in one pass over a row,
 * so the fp32 residual stream is read twice and written once per sub-block instead of
 * once per small op. Semantics of nn_rmsnorm (mean of squares in fp32, weight after). */
#include "nn/nn_cuda_device.cuh"

/* One block per row. Pass 1: x += y, capture, sum of squares; pass 2 (re-reads the row
 * this block just wrote, from L1/L2): the normalised bf16 output. VEC = 4 when d % 4 == 0
 * and every pointer allows 16-byte fp32 / 8-byte bf16 vectors (the same arithmetic in the
 * same order as VEC = 1, only wider loads and stores). ocr > 0: out chunk-major over ocr
 * rows (nn_add_rmsnorm_xc_cuda): element (t, i) at ((i / 32) * ocr + t) * 32 + i % 32. */
template <int VEC>
__global__ void add_rmsnorm_kernel(float *__restrict__ x, const bf16 *__restrict__ y, const float *__restrict__ w,
                                   bf16 *__restrict__ out, bf16 *__restrict__ cap, long cap_stride, int d, float eps,
                                   int ocr)
{
    __shared__ float sh[32];
    pdl_launch_dependents(); /* a linear layer after us may fetch its weights now */
    pdl_wait();              /* launched early (nn_add_rmsnorm_pdl_cuda): the kernel ahead is done */
    int t = blockIdx.x;
    float *xr = x + (size_t)t * d;
    const bf16 *yr = y ? y + (size_t)t * d : nullptr;
    bf16 *cr = cap ? cap + (size_t)t * cap_stride : nullptr;
    float ss = 0.0f;
    for (int i = threadIdx.x * VEC; i < d; i += blockDim.x * VEC) {
        float v[VEC];
        if (VEC == 4) {
            float4 f = *reinterpret_cast<const float4 *>(xr + i);
            v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
        } else {
            v[0] = xr[i];
        }
        if (yr) {
            if (VEC == 4) {
                uint2 u = *reinterpret_cast<const uint2 *>(yr + i);
                const bf16 *b = reinterpret_cast<const bf16 *>(&u);
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    v[k] += bf2f(b[k]);
                *reinterpret_cast<float4 *>(xr + i) = make_float4(v[0], v[1], v[2], v[3]);
            } else {
                v[0] += bf2f(yr[i]);
                xr[i] = v[0];
            }
        }
#pragma unroll
        for (int k = 0; k < VEC; k++)
            ss += v[k] * v[k];
        if (cr) {
            if (VEC == 4) {
                uint2 u;
                bf16 *b = reinterpret_cast<bf16 *>(&u);
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    b[k] = f2bf(v[k]);
                *reinterpret_cast<uint2 *>(cr + i) = u;
            } else {
                cr[i] = f2bf(v[0]);
            }
        }
    }
    if (!out)
        return;
    float tot = block_sum(ss, sh);
    float r = rsqrtf(tot / (float)d + eps);
    bf16 *orow = out + (size_t)t * d;
    for (int i = threadIdx.x * VEC; i < d; i += blockDim.x * VEC) {
        /* a vector of 4 never crosses a chunk of 32 (i % 4 == 0) */
        bf16 *o = ocr ? out + ((size_t)(i / 32) * ocr + t) * 32 + i % 32 : orow + i;
        if (VEC == 4) {
            float4 xv = *reinterpret_cast<const float4 *>(xr + i), wv = *reinterpret_cast<const float4 *>(w + i);
            uint2 u;
            bf16 *b = reinterpret_cast<bf16 *>(&u);
            b[0] = f2bf(xv.x * r * wv.x), b[1] = f2bf(xv.y * r * wv.y);
            b[2] = f2bf(xv.z * r * wv.z), b[3] = f2bf(xv.w * r * wv.w);
            *reinterpret_cast<uint2 *>(o) = u;
        } else {
            *o = f2bf(xr[i] * r * w[i]);
        }
    }
}

static bool aligned(const void *p, unsigned bytes)
{
    return ((uintptr_t)p & (bytes - 1)) == 0;
}

/* PDL needs compute capability 9.0 (else a plain launch). */
static bool pdl_ok(void)
{
    static int ok = -1;
    if (ok < 0) {
        int dev = 0, major = 0;
        ok = cudaGetDevice(&dev) == cudaSuccess &&
             cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
        cudaGetLastError();
    }
    return ok;
}

static int add_rmsnorm(bool pdl, bool xc, float *x, const nn_bf16_cuda *y, const float *w, nn_bf16_cuda *out,
                       nn_bf16_cuda *capture, long cap_stride, int T, int d, float eps, cudaStream_t s, char *err,
                       size_t errlen)
{
    if (T < 0 || d <= 0 || (!w) != (!out) || (capture && cap_stride < d) || (xc && d % 32))
        return df_err(err, errlen, -EINVAL, "%s: T %d, d %d%s, w and out %s, capture stride %ld",
                      xc ? "nn_add_rmsnorm_xc_cuda" : "nn_add_rmsnorm_cuda", T, d,
                      xc && d % 32 ? " (not a multiple of 32)" : "",
                      (!w) != (!out) ? "not both given or both NULL" : "ok", cap_stride);
    if (T == 0)
        return 0;
    int threads = d >= 2048 ? 256 : (d >= 512 ? 128 : 64);
    bool vec = d % 4 == 0 && aligned(x, 16) && aligned(y, 8) && aligned(w, 16) && aligned(out, 8) &&
               aligned(capture, 8) && cap_stride % 4 == 0;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)T), cfg.blockDim = dim3((unsigned)threads), cfg.stream = s;
    cudaLaunchAttribute at[1];
    if (pdl && pdl_ok()) {
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at, cfg.numAttrs = 1;
    }
    cudaError_t e = vec ? cudaLaunchKernelEx(&cfg, add_rmsnorm_kernel<4>, x, as_bf(y), w, as_bf(out), as_bf(capture),
                                             cap_stride, d, eps, xc ? T : 0)
                        : cudaLaunchKernelEx(&cfg, add_rmsnorm_kernel<1>, x, as_bf(y), w, as_bf(out), as_bf(capture),
                                             cap_stride, d, eps, xc ? T : 0);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return df_err(err, errlen, -EIO, "add_rmsnorm_kernel: launch: %s", cudaGetErrorString(e));
    }
    CUDA_LAUNCHED("add_rmsnorm_kernel", err, errlen);
    return 0;
}

int nn_add_rmsnorm_cuda(float *x, const nn_bf16_cuda *y, const float *w, nn_bf16_cuda *out, nn_bf16_cuda *capture,
                        long cap_stride, int T, int d, float eps, cudaStream_t s, char *err, size_t errlen)
{
    return add_rmsnorm(false, false, x, y, w, out, capture, cap_stride, T, d, eps, s, err, errlen);
}

int nn_add_rmsnorm_pdl_cuda(float *x, const nn_bf16_cuda *y, const float *w, nn_bf16_cuda *out, nn_bf16_cuda *capture,
                            long cap_stride, int T, int d, float eps, cudaStream_t s, char *err, size_t errlen)
{
    return add_rmsnorm(true, false, x, y, w, out, capture, cap_stride, T, d, eps, s, err, errlen);
}

int nn_add_rmsnorm_xc_cuda(float *x, const nn_bf16_cuda *y, const float *w, nn_bf16_cuda *outc, nn_bf16_cuda *capture,
                           long cap_stride, int T, int d, float eps, int pdl, cudaStream_t s, char *err, size_t errlen)
{
    return add_rmsnorm(pdl != 0, true, x, y, w, outc, capture, cap_stride, T, d, eps, s, err, errlen);
}
