#pragma once
// The FP8 GEMM on CUDA tensors through cuBLASLt (kernels/cuda/gemm_fp8_cublaslt.cpp). Plain C++ (no
// CUDA types): kernels/fp8_gemm.cpp calls it after checking the rules of kernels/fp8_gemm.h.
#include "core/tensor.h"

namespace octet::kernels::cuda {

// out[m, n] = scale_inv_a·scale_inv_b·(a[m, k]·b[n, k]ᵀ) (+ bias[n]) (+ out with accumulate), on
// out's device and current stream. Throws an error naming the shapes and dtypes when the device is
// older than sm_89 or cuBLASLt has no algorithm for the problem.
// With an addend ([m, n], out's dtype; not with accumulate): + addend, read as cuBLASLt's C.
void fp8_gemm(const Tensor& a, const Tensor& scale_inv_a, const Tensor& b, const Tensor& scale_inv_b, const Tensor& out,
              const Tensor& bias, bool accumulate, bool fast_accumulate, const Tensor& addend);

}  // namespace octet::kernels::cuda
