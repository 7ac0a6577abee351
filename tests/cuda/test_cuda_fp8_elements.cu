// The device pieces of the FP8 cast kernel (kernels/cuda/fp8_elements.cuh, fp8_cast_tiles.cuh), each
// against what it replaces or promises:
//   - quantise4, the hardware conversion of four values, against quantise (core/float_formats.h's
//     integer code, the CPU's) for every one of the 2^32 floats, in both formats and in every byte
//     position: the cast kernels' bytes equal the CPU's only if these agree everywhere;
//   - transpose_bytes_4x4 against the transposition it names;
//   - tile_word: a permutation of the shared tile's words that keeps each 16-byte chunk whole and in
//     order, so the transposed copy reads back what was stored.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cuda/fp8_cast_tiles.cuh"
#include "kernels/cuda/fp8_elements.cuh"
#include "tests/cuda/cuda_testing.h"

namespace octet {
namespace {

using kernels::cuda::quantise;
using kernels::cuda::quantise4;

constexpr int kMaxReported = 16;

struct Mismatches {
  unsigned long long count;
  uint32_t bits[kMaxReported];       // the input's bits
  uint32_t got[kMaxReported];        // quantise4's byte
  uint32_t want[kMaxReported];       // quantise's byte
};

// Every float bit pattern u (u = 0 .. 2^32-1) goes through quantise4 once, in byte position u % 4 of a
// word whose other three values are patterns derived from u (so every pattern also meets the others'
// positions): each byte of each word is compared with quantise of its own value. The scale is 1, so
// the product is the value itself and every float reaches the conversion.
template <bool kE5M2>
__global__ void compare_every_float(Mismatches* m) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t u = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; u < (uint64_t{1} << 32); u += stride) {
    const uint32_t b = static_cast<uint32_t>(u);
    // b at position b % 4: the other three rotate through the remaining positions.
    uint32_t bits[4] = {b ^ 0x80000000u, ~b, b + 0x01234567u, b - 0x00765433u};
    const int at = static_cast<int>(b % 4);
    bits[at] = b;
    float v[4];
    for (int j = 0; j < 4; ++j) v[j] = __uint_as_float(bits[j]);
    const uint32_t word = quantise4<kE5M2>(v, 1.0f);
    for (int j = 0; j < 4; ++j) {
      const uint32_t got = (word >> (8 * j)) & 0xFFu, want = quantise<kE5M2>(v[j], 1.0f);
      if (got != want) {
        const unsigned long long n = atomicAdd(&m->count, 1ull);
        if (n < kMaxReported) {
          m->bits[n] = bits[j];
          m->got[n] = got;
          m->want[n] = want;
        }
      }
    }
  }
}

template <bool kE5M2>
void expect_quantise4_equals_quantise(const char* format) {
  Mismatches* m;
  ASSERT_EQ(cudaMalloc(&m, sizeof(Mismatches)), cudaSuccess);
  ASSERT_EQ(cudaMemset(m, 0, sizeof(Mismatches)), cudaSuccess);
  compare_every_float<kE5M2><<<4096, 256>>>(m);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Mismatches h;
  ASSERT_EQ(cudaMemcpy(&h, m, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(m);
  EXPECT_EQ(h.count, 0u) << format << ": values whose hardware conversion differs from quantise";
  for (unsigned long long i = 0; i < h.count && i < kMaxReported; ++i) {
    ADD_FAILURE() << format << " input bits 0x" << std::hex << h.bits[i] << ": quantise4 0x" << h.got[i]
                  << ", quantise 0x" << h.want[i];
  }
}

TEST(CudaFp8Elements, HardwareConversionEqualsQuantiseForEveryFloat) {
  SKIP_WITHOUT_GPU();
  expect_quantise4_equals_quantise<false>("e4m3");
  expect_quantise4_equals_quantise<true>("e5m2");
}

// The products quantise4 converts are __fmul_rn(v, scale), as quantise's: a few scales over values
// that round differently after the product (ties, saturation, subnormal results).
__global__ void quantise_scaled(const float* v, int n, float scale, uint32_t* words, uint8_t* bytes4,
                                uint8_t* bytes5) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (4 * i >= n) return;
  float q[4];
  for (int j = 0; j < 4; ++j) q[j] = 4 * i + j < n ? v[4 * i + j] : 0.f;
  words[2 * i] = quantise4<false>(q, scale);
  words[2 * i + 1] = quantise4<true>(q, scale);
  for (int j = 0; j < 4 && 4 * i + j < n; ++j) {
    bytes4[4 * i + j] = quantise<false>(q[j], scale);
    bytes5[4 * i + j] = quantise<true>(q[j], scale);
  }
}

TEST(CudaFp8Elements, HardwareConversionTakesTheSameProductsForAnyScale) {
  SKIP_WITHOUT_GPU();
  std::vector<float> v;
  for (uint32_t k = 0; k < (1u << 16); ++k) {  // every bf16 value, as the casts mostly see them
    const uint32_t bits = k << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    v.push_back(f);
  }
  const int n = static_cast<int>(v.size()), words = (n + 3) / 4;
  float* dv;
  uint32_t* dw;
  uint8_t *d4, *d5;
  cudaMalloc(&dv, n * 4);
  cudaMalloc(&dw, words * 8);
  cudaMalloc(&d4, n);
  cudaMalloc(&d5, n);
  cudaMemcpy(dv, v.data(), n * 4, cudaMemcpyHostToDevice);
  for (float scale : {37.0f, 0.001953125f, 3.0e-5f, 1.7e30f, 448.0f / 3.0f}) {
    SCOPED_TRACE(::testing::Message() << "scale " << scale);
    quantise_scaled<<<(words + 255) / 256, 256>>>(dv, n, scale, dw, d4, d5);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint32_t> w(2 * words);
    std::vector<uint8_t> b4(n), b5(n);
    cudaMemcpy(w.data(), dw, w.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(b4.data(), d4, n, cudaMemcpyDeviceToHost);
    cudaMemcpy(b5.data(), d5, n, cudaMemcpyDeviceToHost);
    int mismatches = 0;
    for (int i = 0; i < n && mismatches < 10; ++i) {
      const uint32_t g4 = (w[2 * (i / 4)] >> (8 * (i % 4))) & 0xFFu, g5 = (w[2 * (i / 4) + 1] >> (8 * (i % 4))) & 0xFFu;
      // And both equal the host's conversion of the host's product.
      const uint8_t h4 = float_to_e4m3(v[i] * scale, true), h5 = float_to_e5m2(v[i] * scale, true);
      if (g4 != b4[i] || g5 != b5[i] || b4[i] != h4 || b5[i] != h5) {
        ++mismatches;
        ADD_FAILURE() << "value " << v[i] << ": quantise4 " << g4 << " / " << g5 << ", quantise " << int{b4[i]}
                      << " / " << int{b5[i]} << ", host " << int{h4} << " / " << int{h5};
      }
    }
  }
  cudaFree(dv);
  cudaFree(dw);
  cudaFree(d4);
  cudaFree(d5);
}

__global__ void transpose_words(const uint32_t* rows, uint32_t* cols, int blocks) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= blocks) return;
  const uint32_t r[4] = {rows[4 * i], rows[4 * i + 1], rows[4 * i + 2], rows[4 * i + 3]};
  uint32_t c[4];
  kernels::cuda::transpose_bytes_4x4(r, c);
  for (int j = 0; j < 4; ++j) cols[4 * i + j] = c[j];
}

TEST(CudaFp8Elements, TransposeBytes4x4) {
  SKIP_WITHOUT_GPU();
  const int blocks = 1000;
  std::vector<uint32_t> rows(4 * blocks);
  uint32_t state = 12345;
  for (uint32_t& r : rows) r = state = state * 1664525u + 1013904223u;
  uint32_t *dr, *dc;
  cudaMalloc(&dr, rows.size() * 4);
  cudaMalloc(&dc, rows.size() * 4);
  cudaMemcpy(dr, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice);
  transpose_words<<<(blocks + 255) / 256, 256>>>(dr, dc, blocks);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint32_t> cols(rows.size());
  cudaMemcpy(cols.data(), dc, cols.size() * 4, cudaMemcpyDeviceToHost);
  cudaFree(dr);
  cudaFree(dc);
  for (int b = 0; b < blocks; ++b) {
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 4; ++j) {
        const uint32_t row_byte = (rows[4 * b + i] >> (8 * j)) & 0xFFu;  // row i, column j
        const uint32_t col_byte = (cols[4 * b + j] >> (8 * i)) & 0xFFu;  // column j, row i
        ASSERT_EQ(row_byte, col_byte) << "block " << b << " row " << i << " column " << j;
      }
    }
  }
}

__global__ void tile_words(int* out) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  constexpr int kWords = kernels::cuda::kTile * kernels::cuda::kTileWordsPerColumn;
  constexpr int kPerColumn = kernels::cuda::kTileWordsPerColumn;
  if (k < kWords) out[k] = kernels::cuda::tile_word(k / kPerColumn, k % kPerColumn);
}

TEST(CudaFp8Elements, TileWordIsAPermutationKeepingChunksWhole) {
  SKIP_WITHOUT_GPU();
  constexpr int per_column = kernels::cuda::kTileWordsPerColumn, words = kernels::cuda::kTile * per_column;
  int* d;
  cudaMalloc(&d, words * sizeof(int));
  tile_words<<<(words + 255) / 256, 256>>>(d);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int> w(words);
  cudaMemcpy(w.data(), d, words * sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  std::vector<int> seen(words, 0);
  for (int c = 0; c < kernels::cuda::kTile; ++c) {
    for (int g = 0; g < per_column; ++g) {
      const int at = w[c * per_column + g];
      ASSERT_GE(at, c * per_column) << "column " << c << " word " << g << " leaves its column";
      ASSERT_LT(at, (c + 1) * per_column) << "column " << c << " word " << g << " leaves its column";
      ++seen[at];
      // Words 4q .. 4q+3 are consecutive from a 16-byte boundary.
      EXPECT_EQ(at - w[c * per_column + (g & ~3)], g % 4) << "column " << c << " word " << g;
      EXPECT_EQ(w[c * per_column + (g & ~3)] % 4, 0) << "column " << c << " chunk " << g / 4;
    }
  }
  for (int k = 0; k < words; ++k) EXPECT_EQ(seen[k], 1) << "word " << k;
}

}  // namespace
}  // namespace octet
