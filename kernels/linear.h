#pragma once
// The three GEMMs of a Linear layer with what can ride along in their epilogues, for any device.
//
//   forward  y = x·Wᵀ + b               fprop GEMM, bias fused: cuBLASLt BIAS
//   backward dx = dy·W                  dgrad GEMM
//            dW = dyᵀ·x                 wgrad GEMM, dbias = Σ_rows dy fused: cuBLASLt BGRADB
//
// The CPU composes kernels::gemm, the bias add and kernels::sum. On the GPU an epilogue is used only
// where its layout rules hold and cuBLASLt offers an algorithm for it; otherwise the same
// composition runs there.
#include "core/tensor.h"

namespace octet::kernels {

// x [..., in], weight [out, in], bias [out] or undefined. Returns y [..., out] in x's dtype (f32 for
// FP8 x). On the GPU a weight of another dtype than x is converted to x's dtype first (cuBLASLt
// multiplies operands of one dtype; this is what autocast does); the CPU widens both exactly and
// needs no copy.
Tensor linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias);

struct LinearGrads {
  Tensor dx;       // x's shape and dtype
  Tensor dweight;  // [out, in] in weight's dtype
  Tensor dbias;    // [out] in dweight's dtype; the caller converts to bias's
};
// dy: y's shape. Gradients not asked for come back undefined.
LinearGrads linear_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, bool need_dx, bool need_dweight,
                            bool need_dbias);

}  // namespace octet::kernels
