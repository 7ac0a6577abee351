#pragma once
// The column design of the GPU LayerNorm backward (kernels/layernorm_design.h kColumns), which
// layernorm.cu's backward launches in place of its row kernel when the design is chosen.
// Internal to kernels/cuda.
#include <cstdint>

#include "core/tensor.h"

namespace octet::kernels::cuda {

// Launches the column kernel on the current stream when it takes the rows (x's width a whole number
// of 16-byte packs, at most 256 of them; the caller has checked that dy, x, dx and dresidual are
// 16-byte aligned), and returns true: dx written and, with a weight, `partial` allocated as
// [blocks, 2, C] f32 and filled with the blocks' dweight and dbias sums, for layernorm.cu's column
// sums. Returns false, having done nothing, when it does not take them.
bool launch_backward_columns(const Tensor& dy, const Tensor& dresidual, const Tensor& x, const Tensor& weight,
                             const Tensor& mean, const Tensor& rstd, const Tensor& dx, Tensor& partial,
                             int64_t& blocks);

}  // namespace octet::kernels::cuda
