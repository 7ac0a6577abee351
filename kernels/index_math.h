#pragma once
// Host-side index arithmetic that the CPU and CUDA kernels share.
//
// A permute reduced to its essentials. Out dim k has `extent[k]` and steps the input by `in_stride[k]` elements. Size-1 dims are
// dropped and neighbouring out dims that are also neighbours in the input are merged, so
// [B, N, 3, H, D] -> (2, 0, 3, 1, 4) walks 4 dims and an identity permute walks one.
#include <cstdint>
#include <vector>

#include "core/shape.h"

namespace octet::kernels {

struct PermuteWalk {
  std::vector<int64_t> extent, in_stride;
};

// dims is a permutation of 0..ndim-1, already checked and made non-negative.
inline PermuteWalk simplify_permute(const Shape& in_shape, const std::vector<int64_t>& dims) {
  const int64_t n = in_shape.ndim();
  std::vector<int64_t> stride(n);
  int64_t s = 1;
  for (int64_t d = n - 1; d >= 0; --d) {
    stride[d] = s;
    s *= in_shape[d];
  }
  PermuteWalk w;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t e = in_shape[dims[k]], st = stride[dims[k]];
    if (e == 1) continue;
    if (!w.extent.empty() && w.in_stride.back() == st * e) {
      w.extent.back() *= e;
      w.in_stride.back() = st;
    } else {
      w.extent.push_back(e);
      w.in_stride.push_back(st);
    }
  }
  return w;
}

// Element strides of a contiguous tensor of shape s read as if it had the broadcast shape out:
// 0 along dims that s lacks or has as 1.
inline std::vector<int64_t> broadcast_strides(const Shape& s, const Shape& out) {
  std::vector<int64_t> strides(out.size(), 0);
  int64_t stride = 1;
  for (int64_t d = s.ndim() - 1, od = out.ndim() - 1; d >= 0; --d, --od) {
    strides[od] = s[d] == 1 ? 0 : stride;
    stride *= s[d];
  }
  return strides;
}

}  // namespace octet::kernels
