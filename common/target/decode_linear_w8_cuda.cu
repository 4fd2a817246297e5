/* decode_linear_w8_cuda.cu: the small-row linear kernel instantiated for
 * plain x rows, 8 warps a block (every row count, with and without the
 * weight prefetch and PDL). decode_linear_cuda.cuh holds the kernel and says why the
 * instantiations are spread over six files. */
#include "target/decode_linear_cuda.cuh"

LIN_ROWS_INST4(, false, 8, false)
