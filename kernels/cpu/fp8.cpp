// FP8 cast, amax and scale updates on the CPU (kernels/cpu/fp8_cpu.h).
//
// The cast works on tiles of kTileRows × kTileCols elements: each tile is quantised once into a small
// buffer that feeds both the row-major copy and the transposed one, so the transposed writes go out
// kTileRows bytes at a time instead of one byte per cache line. Threads take whole row tiles; the
// amax they find is combined with a max, which gives the same result for any split.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "core/float_formats.h"
#include "kernels/cpu/fp8_cpu.h"
#include "kernels/cpu/parallel.h"
#include "kernels/fp8_scale_rule.h"

namespace octet::kernels::cpu {
namespace {

constexpr int64_t kTileRows = 32;
constexpr int64_t kTileCols = 64;

// |v| as bits: for non-negative floats the unsigned order is the numeric one, inf above every finite
// value and NaN above inf.
inline uint32_t magnitude_bits(float v) { return detail::float_bits(v) & 0x7FFFFFFFu; }


// Raises `shared` to at least `bits`.
void merge_max(std::atomic<uint32_t>& shared, uint32_t bits) {
  uint32_t seen = shared.load(std::memory_order_relaxed);
  while (bits > seen && !shared.compare_exchange_weak(seen, bits, std::memory_order_relaxed)) {
  }
}

// On x86-64 the quantising loop is compiled twice, for AVX2 and for the baseline, and the loader
// picks one by the CPU: the same integer and f32 operations (no FMA, so nothing is fused) in either,
// hence the same bits, with twice the lanes on AVX2 (half the cast's time).
#if defined(__x86_64__) && defined(__GNUC__)
#define OCTET_FP8_CAST_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define OCTET_FP8_CAST_CLONES
#endif

// codes[c] = fp8(float(in[c])·scale) for c < n; returns max(local, the largest |float(in[c])| bits).
template <class X, bool kE5M2>
OCTET_FP8_CAST_CLONES uint32_t quantise_row(const X* in, uint8_t* codes, int64_t n,
                                                                         float scale, uint32_t local) {
  for (int64_t c = 0; c < n; ++c) {
    const float v = static_cast<float>(in[c]);
    local = std::max(local, magnitude_bits(v));
    codes[c] = float_to_fp8_saturating<kE5M2>(v * scale);
  }
  return local;
}

template <class X, bool kE5M2>
uint32_t cast_tiles(const X* x, int64_t rows, int64_t cols, float scale, uint8_t* data, uint8_t* transposed,
                    int64_t padded_rows) {
  std::atomic<uint32_t> amax{0};
  const int64_t row_tiles = (rows + kTileRows - 1) / kTileRows;
  // A row tile is kTileRows·cols elements; go parallel once there are kParallelElements of them.
  const int64_t min_parallel_tiles = std::max<int64_t>(1, kParallelElements / std::max<int64_t>(1, kTileRows * cols));
  parallel_ranges(row_tiles, min_parallel_tiles, [&](int64_t tile_begin, int64_t tile_end) {
    uint8_t tile[kTileRows][kTileCols];
    uint32_t local = 0;
    for (int64_t t = tile_begin; t < tile_end; ++t) {
      const int64_t r0 = t * kTileRows, nr = std::min(kTileRows, rows - r0);
      for (int64_t c0 = 0; c0 < cols; c0 += kTileCols) {
        const int64_t nc = std::min(kTileCols, cols - c0);
        for (int64_t r = 0; r < nr; ++r) {
          const X* in = x + (r0 + r) * cols + c0;
          local = quantise_row<X, kE5M2>(in, tile[r], nc, scale, local);
          if (data) std::memcpy(data + (r0 + r) * cols + c0, tile[r], static_cast<size_t>(nc));
        }
        if (transposed) {
          for (int64_t c = 0; c < nc; ++c) {
            uint8_t* out = transposed + (c0 + c) * padded_rows + r0;
            for (int64_t r = 0; r < nr; ++r) out[r] = tile[r][c];
          }
        }
      }
    }
    merge_max(amax, local);
  });
  if (transposed && padded_rows > rows) {
    for (int64_t c = 0; c < cols; ++c) {
      std::memset(transposed + c * padded_rows + rows, 0, static_cast<size_t>(padded_rows - rows));
    }
  }
  return amax.load();
}

}  // namespace

template <class X>
uint32_t fp8_cast(const X* x, int64_t rows, int64_t cols, float scale, DType fp8_dtype, uint8_t* data,
                  uint8_t* transposed, int64_t padded_rows) {
  if (fp8_dtype == DType::e5m2) return cast_tiles<X, true>(x, rows, cols, scale, data, transposed, padded_rows);
  return cast_tiles<X, false>(x, rows, cols, scale, data, transposed, padded_rows);
}

template <class X>
uint32_t fp8_amax_bits(const X* x, int64_t n) {
  std::atomic<uint32_t> amax{0};
  parallel_ranges(n, kParallelElements, [&](int64_t begin, int64_t end) {
    uint32_t local = 0;
    for (int64_t i = begin; i < end; ++i) local = std::max(local, magnitude_bits(static_cast<float>(x[i])));
    merge_max(amax, local);
  });
  return amax.load();
}

void fp8_update_scales(float* history, float* scale, float* scale_inv, int64_t L, int64_t n, float fp8_max,
                       float two_pow_margin, bool most_recent) {
  if (n == 0) return;
  for (int64_t j = 0; j < n; ++j) {
    float amax = history[j];
    if (!most_recent) {
      for (int64_t i = 1; i < L; ++i) amax = fp8_amax_max(amax, history[i * n + j]);
    }
    scale[j] = fp8_scale_for_amax(amax, scale[j], fp8_max, two_pow_margin);
    scale_inv[j] = fp8_scale_inv(scale[j]);
  }
  // The roll: row i ← row i+1, row L-1 ← row 0, then row 0 ← 0.
  const std::vector<float> row0(history, history + n);
  std::memmove(history, history + n, static_cast<size_t>((L - 1) * n) * sizeof(float));
  std::copy(row0.begin(), row0.end(), history + (L - 1) * n);
  std::fill(history, history + n, 0.f);
}

void fp8_scale_from_amax(const float* amax, float* scale, float* scale_inv, int64_t n, float fp8_max,
                         float two_pow_margin) {
  for (int64_t j = 0; j < n; ++j) {
    scale[j] = fp8_scale_for_amax(amax[j], scale[j], fp8_max, two_pow_margin);
    scale_inv[j] = fp8_scale_inv(scale[j]);
  }
}

template uint32_t fp8_cast<float>(const float*, int64_t, int64_t, float, DType, uint8_t*, uint8_t*, int64_t);
template uint32_t fp8_cast<bfloat16>(const bfloat16*, int64_t, int64_t, float, DType, uint8_t*, uint8_t*, int64_t);
template uint32_t fp8_cast<float16>(const float16*, int64_t, int64_t, float, DType, uint8_t*, uint8_t*, int64_t);
template uint32_t fp8_amax_bits<float>(const float*, int64_t);
template uint32_t fp8_amax_bits<bfloat16>(const bfloat16*, int64_t);
template uint32_t fp8_amax_bits<float16>(const float16*, int64_t);

}  // namespace octet::kernels::cpu
