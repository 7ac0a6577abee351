// LayerNorm writing FP8 on the GPU (kernels/fp8.h): for now the two kernels back to back, the
// LayerNorm (or the residual add and LayerNorm) and then the FP8 cast of its output. Same bits as the
// fused kernel must give; the one-pass kernel replaces this.
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/cuda/nn_ops_cuda.h"

namespace octet::kernels::cuda {

LayerNormFp8 layernorm_fp8_forward(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                                   double eps, const Tensor& scale, const Tensor& amax, DType fp8_dtype, bool rowwise,
                                   bool transposed, int64_t padded_rows) {
  LayerNormFp8 out;
  Tensor normed;
  if (y.defined()) {
    AddLayerNormOutput r = add_layernorm_forward(x, y, weight, bias, eps);
    out.h = r.h;
    normed = r.y;
    out.mean = r.mean;
    out.rstd = r.rstd;
  } else {
    LayerNormOutput r = layernorm_forward(x, weight, bias, eps);
    normed = r.y;
    out.mean = r.mean;
    out.rstd = r.rstd;
  }
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  out.cast = fp8_cast(normed, rows, cols, scale, amax, fp8_dtype, rowwise, transposed, padded_rows);
  return out;
}

}  // namespace octet::kernels::cuda
