/* decode_linear_swiglu_w8_cuda.cu: the small-row linear kernel instantiated for
 * x = the SwiGLU of a gate/up row, 8 warps a block (every row count, with and without the
 * weight prefetch and PDL). decode_linear_cuda.cuh holds the kernel and says why the
 * instantiations are spread over six files. */
#include "target/decode_linear_cuda.cuh"

LIN_ROWS_INST4(, true, 8, false)
