// GELU writing FP8 on the GPU (kernels/fp8.h): for now the two kernels back to back, the GELU and then
// the FP8 cast of its output. Same bits as a fused kernel must give; a one-pass kernel replaces this.
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/cuda/nn_ops_cuda.h"

namespace octet::kernels::cuda {

Fp8Cast gelu_fp8_forward(const Tensor& x, int64_t rows, int64_t cols, GeluApproximation approximation,
                         const Tensor& scale, const Tensor& amax, DType fp8_dtype, bool rowwise, bool transposed,
                         int64_t padded_rows) {
  return cuda::fp8_cast(cuda::gelu_forward(x, approximation), rows, cols, scale, amax, fp8_dtype, rowwise,
                        transposed, padded_rows);
}

}  // namespace octet::kernels::cuda
