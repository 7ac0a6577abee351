// GELU (forward and backward) writing FP8 on the GPU (kernels/fp8.h): for now the two kernels back to
// back, the GELU (its backward) and then the FP8 cast of the result (with the column sums). Same bits
// as fused kernels must give; one-pass kernels replace these.
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/cuda/nn_ops_cuda.h"

namespace octet::kernels::cuda {

Fp8Cast gelu_fp8_forward(const Tensor& x, int64_t rows, int64_t cols, GeluApproximation approximation,
                         const Tensor& scale, const Tensor& amax, DType fp8_dtype, bool rowwise, bool transposed,
                         int64_t padded_rows) {
  return cuda::fp8_cast(cuda::gelu_forward(x, approximation), rows, cols, scale, amax, fp8_dtype, rowwise,
                        transposed, padded_rows);
}

Fp8CastWithBiasGrad dgelu_fp8_cast_dbias(const Tensor& dact, const Tensor& x, int64_t rows, int64_t cols,
                                         GeluApproximation approximation, const Tensor& scale, const Tensor& amax,
                                         DType fp8_dtype, bool rowwise, bool transposed,
                                         std::optional<DType> dbias_dtype, int64_t padded_rows) {
  const Tensor dy = cuda::gelu_backward(dact, x, approximation);
  if (dbias_dtype) {
    return cuda::fp8_cast_dbias(dy, rows, cols, scale, amax, fp8_dtype, rowwise, transposed, padded_rows,
                                *dbias_dtype);
  }
  Fp8CastWithBiasGrad out;
  static_cast<Fp8Cast&>(out) =
      cuda::fp8_cast(dy, rows, cols, scale, amax, fp8_dtype, rowwise, transposed, padded_rows);
  return out;
}

}  // namespace octet::kernels::cuda
