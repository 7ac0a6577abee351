#pragma once
// CUDA implementations behind kernels/fp8.h (plain C++: no CUDA types). The entry points in
// kernels/fp8.cpp have checked every tensor (dtypes, shapes, one CUDA device) and the arguments;
// two_pow_margin is 2^margin rounded once to f32 on the host, as the CPU kernels take it. Every
// launch goes on the current stream of the tensors' device, and nothing is read back to the host.
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "kernels/fp8.h"

namespace octet::kernels::cuda {

// x read as [rows, cols]; amax may be undefined. One fused kernel (see fp8.cu).
Fp8Cast fp8_cast(const Tensor& x, int64_t rows, int64_t cols, const Tensor& scale, const Tensor& amax,
                 DType fp8_dtype, bool rowwise, bool transposed, int64_t padded_rows);
// fp8_cast's kernel with per-tile f32 column sums to a scratch buffer, then one small kernel that
// adds each column's tiles in order and rounds to x's dtype and then dbias_dtype (see fp8.cu).
Fp8CastWithBiasGrad fp8_cast_dbias(const Tensor& x, int64_t rows, int64_t cols, const Tensor& scale,
                                   const Tensor& amax, DType fp8_dtype, bool rowwise, bool transposed,
                                   int64_t padded_rows, DType dbias_dtype);
void fp8_amax_(const Tensor& x, const Tensor& amax);
// kernels/fp8.h's LayerNorm writing FP8, arguments checked; padded_rows as for fp8_cast. y is
// undefined for layernorm_fp8_forward, the residual for add_layernorm_fp8_forward. One kernel (see
// layernorm_fp8.cu).
LayerNormFp8 layernorm_fp8_forward(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                                   double eps, const Tensor& scale, const Tensor& amax, DType fp8_dtype, bool rowwise,
                                   bool transposed, int64_t padded_rows);
// kernels/fp8.h's GELU backward writing FP8, arguments checked: dbias when dbias_dtype is given.
Fp8CastWithBiasGrad dgelu_fp8_cast_dbias(const Tensor& dact, const Tensor& x, int64_t rows, int64_t cols,
                                         GeluApproximation approximation, const Tensor& scale, const Tensor& amax,
                                         DType fp8_dtype, bool rowwise, bool transposed,
                                         std::optional<DType> dbias_dtype, int64_t padded_rows);
// kernels/fp8.h's GELU writing FP8, arguments checked.
Fp8Cast gelu_fp8_forward(const Tensor& x, int64_t rows, int64_t cols, GeluApproximation approximation,
                         const Tensor& scale, const Tensor& amax, DType fp8_dtype, bool rowwise, bool transposed,
                         int64_t padded_rows);
// Every group in one launch per chunk of groups.
void fp8_update_scales_(const std::vector<Fp8ScalingTensors>& groups, float two_pow_margin, AmaxCompute algo);
void fp8_scale_from_amax_(const Tensor& amax, const Tensor& scale, const Tensor& scale_inv, DType fp8_dtype,
                          float two_pow_margin);

}  // namespace octet::kernels::cuda
