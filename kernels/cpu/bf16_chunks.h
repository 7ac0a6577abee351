#pragma once
// Elementwise f32 kernels over bf16 arrays, a chunk at a time. A bf16 op on the CPU computes in f32
// and rounds once; widening each input whole first and rounding the whole output after moves
// 2 + 4 + 4 bytes per element per input and 4 + 4 + 2 for the output through memory, for arrays
// that no longer fit in cache (a ViT block's activations are megabytes). Here each thread widens a
// chunk of every input into buffers on its stack (L1), runs the f32 kernel on them, and rounds the
// chunk of output straight into place: 2 bytes per element in and 2 out. The widening and rounding
// are plain loops here, not convert_elements (core/dtype.h): that one's OpenMP construct, entered
// per chunk or row from inside a parallel region, made the bf16 step 3.5× slower when tried. The
// LayerNorm rows (kernels/cpu/layernorm.cpp) and attention heads (kernels/cpu/attention.cpp) loop
// the same way for the same reason.
#include <algorithm>
#include <cstdint>
#include <utility>

#include "core/float_formats.h"
#include "kernels/cpu/parallel.h"

namespace octet::kernels::cpu {

inline constexpr int64_t kBf16Chunk = 1024;  // elements per chunk: 4 KB of f32 per input, and the output's

// out[i] = bf16(f(f32(in[0][i]), ..., f32(in[K-1][i]))) for i < n, with f an elementwise f32 kernel
// called as f(const float* in_0, ..., const float* in_K-1, float* out, int64_t count) on one chunk. The
// same bits as widening every input whole, running f once over them and rounding its result: element
// i of f's output depends on element i of its inputs alone. Threads take consecutive ranges
// (parallel_ranges), each in chunks.
template <size_t K, class F>
void map_bf16_in_f32(const bfloat16* const (&in)[K], bfloat16* out, int64_t n, F&& f) {
  parallel_ranges(n, kParallelElements, [&](int64_t lo, int64_t hi) {
    float buf[K + 1][kBf16Chunk];
    for (int64_t c0 = lo; c0 < hi; c0 += kBf16Chunk) {
      const int64_t count = std::min(kBf16Chunk, hi - c0);
      for (size_t j = 0; j < K; ++j) {
        const bfloat16* src = in[j] + c0;
        float* dst = buf[j];
        for (int64_t i = 0; i < count; ++i) dst[i] = bf16_bits_to_float(src[i].bits);
      }
      [&]<size_t... J>(std::index_sequence<J...>) {
        f(static_cast<const float*>(buf[J])..., buf[K], count);
      }(std::make_index_sequence<K>{});
      const float* result = buf[K];
      bfloat16* dst = out + c0;
      for (int64_t i = 0; i < count; ++i) dst[i].bits = float_to_bf16_bits(result[i]);
    }
  });
}

}  // namespace octet::kernels::cpu
