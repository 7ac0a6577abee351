// Dropout on the GPU, with the CPU kernel's mask (kernels/cpu/dropout.cpp), regenerated from
// (seed, offset) and never stored:
//   word_i = philox::block_words(seed, offset + i/4).w[i % 4]    (core/philox.h, shared source)
//   keep_i = double(philox::uniform(word_i)) >= p
//   out_i  = keep_i ? in_i / (1 - p) : 0       (1 - p rounded once to f32, an exactly rounded division)
// uniform(word) is (word >> 8) / 2^24 exactly, so keep_i is the integer test (word >> 8) >= ceil(p·2^24)
// (p·2^24 is exact in double): the same decisions without double arithmetic on the GPU. Each thread
// handles the four elements of one Philox block. Bytes per element: reads in, writes out (2·sizeof(T)).
#include <cmath>

#include "core/philox.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/nn_ops_cuda.h"

namespace octet::kernels::cuda {
namespace {

template <class T>
__global__ void dropout_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n, uint32_t keep_threshold,
                               float keep_prob, uint64_t seed, uint64_t offset) {
  for_each_philox_word(n, seed, offset, [&](int64_t i, uint32_t word) {
    const bool keep = (word >> 8) >= keep_threshold;
    out[i] = from_float<T>(keep ? __fdiv_rn(to_float(in[i]), keep_prob) : 0.f);
  });
}

}  // namespace

Tensor dropout_apply(const Tensor& in, double p, uint64_t seed, uint64_t offset) {
  constexpr const char* op = "dropout";
  Tensor out = empty(in.shape(), in.dtype(), in.device());
  const int64_t n = in.numel();
  if (n == 0) return out;
  const auto keep_threshold = static_cast<uint32_t>(std::ceil(p * 16777216.0));
  const auto keep_prob = static_cast<float>(1.0 - p);
  dispatch_floating(in.dtype(), op, [&]<class T>() {
    dropout_kernel<T><<<blocks_for((n + 3) / 4), kThreads, 0, stream_for(in)>>>(
        ptr<T>(in), ptr<T>(out), n, keep_threshold, keep_prob, seed, offset);
    check_launch(op);
  });
  return out;
}

}  // namespace octet::kernels::cuda
