// Dropout, on the CPU. The mask is a pure function of (seed, offset, i), never stored:
//   word_i = philox::block_words(seed, offset + i/4).w[i % 4]
//   keep_i = philox::uniform(word_i) >= p       (the float uniform compared with p as a double)
//   out_i  = keep_i ? in_i / (1 - p) : 0         (1 - p rounded once to T, then a true division)
// Forward applies it to x, backward to dy: ∂out_i/∂x_i is keep_i / (1 - p), the same factor.
// The CUDA kernel must evaluate exactly these expressions so that either device can run the
// backward of the other's forward.
#include <algorithm>

#include "core/philox.h"
#include "kernels/cpu/nn_ops_cpu.h"

namespace octet::kernels::cpu {
namespace {

constexpr int64_t kParallelWork = int64_t{1} << 15;

}  // namespace

template <class T>
void dropout_apply(const T* in, T* out, int64_t n, double p, uint64_t seed, uint64_t offset) {
  const T keep_prob = static_cast<T>(1.0 - p);
  // One Philox call yields four words, so the loop runs over blocks of four elements.
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n > kParallelWork)
  for (int64_t b = 0; b < blocks; ++b) {
    const philox::Words words = philox::block_words(seed, offset + static_cast<uint64_t>(b));
    const int64_t end = std::min<int64_t>(4, n - 4 * b);
    for (int64_t k = 0; k < end; ++k) {
      const int64_t i = 4 * b + k;
      const bool keep = static_cast<double>(philox::uniform(words.w[k])) >= p;
      out[i] = keep ? in[i] / keep_prob : T(0);
    }
  }
}

template void dropout_apply<float>(const float*, float*, int64_t, double, uint64_t, uint64_t);
template void dropout_apply<double>(const double*, double*, int64_t, double, uint64_t, uint64_t);

}  // namespace octet::kernels::cpu
