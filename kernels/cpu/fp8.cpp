// FP8 cast, amax and scale updates on the CPU (kernels/cpu/fp8_cpu.h).
//
// The cast works on tiles of kTileRows × kTileCols elements: each tile is quantised once into a small
// buffer that feeds both the row-major copy and the transposed one, so the transposed writes go out
// kTileRows bytes at a time instead of one byte per cache line. Threads take whole row tiles; the
// amax they find is combined with a max, which gives the same result for any split.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>
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

// The tile's nr × nc codes, rows r0.. and columns c0.. of the cast, into the transposed copy
// [cols, padded_rows].
void store_transposed(const uint8_t (*tile)[kTileCols], int64_t nr, int64_t nc, int64_t r0, int64_t c0,
                      int64_t padded_rows, uint8_t* transposed) {
  for (int64_t c = 0; c < nc; ++c) {
    uint8_t* out = transposed + (c0 + c) * padded_rows + r0;
    for (int64_t r = 0; r < nr; ++r) out[r] = tile[r][c];
  }
}

// Zeros in the transposed copy's padding columns rows..padded_rows (FP8 zero is the zero byte).
void zero_padding(int64_t rows, int64_t cols, int64_t padded_rows, uint8_t* transposed) {
  if (padded_rows <= rows) return;
  for (int64_t c = 0; c < cols; ++c) {
    std::memset(transposed + c * padded_rows + rows, 0, static_cast<size_t>(padded_rows - rows));
  }
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
        if (transposed) store_transposed(tile, nr, nc, r0, c0, padded_rows, transposed);
      }
    }
    merge_max(amax, local);
  });
  if (transposed) zero_padding(rows, cols, padded_rows, transposed);
  return amax.load();
}

// ---- cast + column sums (the bias gradient) ---------------------------------------------------------
//
// kernels::sum over dim 0 of a [rows, cols] tensor (cols > 1) sums each column by pairwise_rows
// (kernels/cpu/reduce.cpp): n <= kSumLeafRows rows are added in order to 0, and more are split into
// the first n/2 rows and the rest, whose sums are added, left + right. Every column follows the same
// tree, whatever the tile width or thread count. The cast below walks that same tree while it
// quantises, so each element is read once and the sums are bit for bit those of kernels::sum:
//   - the tree's top is cut into chunks, the subtrees of at most kSumChunkRows rows (contiguous row
//     ranges, in row order), and threads take whole chunks;
//   - within a chunk, column tile by column tile, the subtree is evaluated recursively, and each leaf's
//     rows are quantised and added to the leaf's sums in the same loop;
//   - the chunks' sums are then combined by the tree's top, left + right as pairwise_rows does.
// Extra memory: one f32 row of cols per chunk (under 4 bytes per 65 elements).
constexpr int64_t kSumLeafRows = 16;   // pairwise_rows' leaf; the two must agree (tests compare them)
constexpr int64_t kSumChunkRows = 128;  // a thread's unit of rows

// codes[c] = fp8(float(in[c])·scale) and sums[c] += float(in[c]) for c < n; returns max(local, amax bits).
template <class X, bool kE5M2>
OCTET_FP8_CAST_CLONES uint32_t quantise_and_add_row(const X* in, uint8_t* codes, float* sums, int64_t n,
                                                    float scale, uint32_t local) {
  for (int64_t c = 0; c < n; ++c) {
    const float v = static_cast<float>(in[c]);
    local = std::max(local, magnitude_bits(v));
    codes[c] = float_to_fp8_saturating<kE5M2>(v * scale);
    sums[c] += v;
  }
  return local;
}

// Levels of scratch rows that pairwise_rows' recursion over n rows needs below its top, where the
// recursion is cut off at `leaf_rows` rows.
int64_t pairwise_levels(int64_t n, int64_t leaf_rows) {
  int64_t levels = 0;
  for (; n > leaf_rows; n -= n / 2) ++levels;
  return levels;
}

// The chunks of the tree over [r0, r0 + n): subtrees of at most kSumChunkRows rows, in row order.
void list_chunks(int64_t r0, int64_t n, std::vector<std::pair<int64_t, int64_t>>& chunks) {
  if (n <= kSumChunkRows) {
    chunks.emplace_back(r0, n);
    return;
  }
  const int64_t half = n / 2;
  list_chunks(r0, half, chunks);
  list_chunks(r0 + half, n - half, chunks);
}

// What one column tile [c0, c0 + nc) of one chunk of rows needs.
template <class X>
struct ChunkTile {
  const X* x;
  int64_t cols, c0, nc, chunk_r0;
  float scale;
  uint8_t* data;                       // the row-major copy, or null
  uint8_t (*tile)[kTileCols];          // the chunk's quantised bytes of this column tile, row r - chunk_r0
};

// sums[0, nc) = the column sums of rows [r0, r0 + n) of the tile, in pairwise_rows' order, quantising
// each row as its leaf reaches it. scratch: one row of nc floats per level below this one.
template <class X, bool kE5M2>
uint32_t cast_and_sum_subtree(const ChunkTile<X>& t, int64_t r0, int64_t n, float* sums, float* scratch,
                              uint32_t local) {
  if (n <= kSumLeafRows) {
    std::fill(sums, sums + t.nc, 0.f);
    for (int64_t r = r0; r < r0 + n; ++r) {
      uint8_t* codes = t.tile[r - t.chunk_r0];
      local = quantise_and_add_row<X, kE5M2>(t.x + r * t.cols + t.c0, codes, sums, t.nc, t.scale, local);
      if (t.data) std::memcpy(t.data + r * t.cols + t.c0, codes, static_cast<size_t>(t.nc));
    }
    return local;
  }
  const int64_t half = n / 2;
  local = cast_and_sum_subtree<X, kE5M2>(t, r0, half, sums, scratch + t.nc, local);
  local = cast_and_sum_subtree<X, kE5M2>(t, r0 + half, n - half, scratch, scratch + t.nc, local);
  for (int64_t j = 0; j < t.nc; ++j) sums[j] += scratch[j];
  return local;
}

// sums[0, cols) = the sum of the tree over n rows whose chunks' sums start at chunk_sums[next]
// (advancing next), left + right as pairwise_rows adds them.
void combine_chunks(const float* chunk_sums, int64_t n, int64_t cols, int64_t& next, float* sums, float* scratch) {
  if (n <= kSumChunkRows) {
    std::copy(chunk_sums + next * cols, chunk_sums + (next + 1) * cols, sums);
    ++next;
    return;
  }
  const int64_t half = n / 2;
  combine_chunks(chunk_sums, half, cols, next, sums, scratch + cols);
  combine_chunks(chunk_sums, n - half, cols, next, scratch, scratch + cols);
  for (int64_t j = 0; j < cols; ++j) sums[j] += scratch[j];
}

template <class X, bool kE5M2>
uint32_t cast_and_sum_chunks(const X* x, int64_t rows, int64_t cols, float scale, uint8_t* data, uint8_t* transposed,
                             int64_t padded_rows, float* column_sums) {
  std::vector<std::pair<int64_t, int64_t>> chunks;
  list_chunks(0, rows, chunks);
  const int64_t n_chunks = static_cast<int64_t>(chunks.size());
  std::vector<float> chunk_sums(static_cast<size_t>(n_chunks * cols));
  std::atomic<uint32_t> amax{0};
  const int64_t min_parallel_chunks =
      std::max<int64_t>(1, kParallelElements / std::max<int64_t>(1, kSumChunkRows * cols));
  const int64_t levels = pairwise_levels(std::min(rows, kSumChunkRows), kSumLeafRows);
  parallel_ranges(n_chunks, min_parallel_chunks, [&](int64_t chunk_begin, int64_t chunk_end) {
    std::vector<uint8_t> tile_bytes(static_cast<size_t>(kSumChunkRows * kTileCols));
    auto* tile = reinterpret_cast<uint8_t (*)[kTileCols]>(tile_bytes.data());
    std::vector<float> scratch(static_cast<size_t>((levels + 1) * kTileCols));
    uint32_t local = 0;
    for (int64_t i = chunk_begin; i < chunk_end; ++i) {
      const auto [r0, nr] = chunks[static_cast<size_t>(i)];
      for (int64_t c0 = 0; c0 < cols; c0 += kTileCols) {
        const ChunkTile<X> t{x, cols, c0, std::min(kTileCols, cols - c0), r0, scale, data, tile};
        local = cast_and_sum_subtree<X, kE5M2>(t, r0, nr, chunk_sums.data() + i * cols + c0, scratch.data(), local);
        if (transposed) store_transposed(tile, nr, t.nc, r0, c0, padded_rows, transposed);
      }
    }
    merge_max(amax, local);
  });
  if (transposed) zero_padding(rows, cols, padded_rows, transposed);
  std::vector<float> scratch(static_cast<size_t>((pairwise_levels(rows, kSumChunkRows) + 1) * cols));
  int64_t next = 0;
  combine_chunks(chunk_sums.data(), rows, cols, next, column_sums, scratch.data());
  return amax.load();
}

}  // namespace

template <class X>
uint32_t fp8_cast_column_sums(const X* x, int64_t rows, int64_t cols, float scale, DType fp8_dtype, uint8_t* data,
                              uint8_t* transposed, int64_t padded_rows, float* column_sums) {
  if (fp8_dtype == DType::e5m2) {
    return cast_and_sum_chunks<X, true>(x, rows, cols, scale, data, transposed, padded_rows, column_sums);
  }
  return cast_and_sum_chunks<X, false>(x, rows, cols, scale, data, transposed, padded_rows, column_sums);
}

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
template uint32_t fp8_cast_column_sums<float>(const float*, int64_t, int64_t, float, DType, uint8_t*, uint8_t*,
                                              int64_t, float*);
template uint32_t fp8_cast_column_sums<bfloat16>(const bfloat16*, int64_t, int64_t, float, DType, uint8_t*,
                                                 uint8_t*, int64_t, float*);
template uint32_t fp8_cast_column_sums<float16>(const float16*, int64_t, int64_t, float, DType, uint8_t*, uint8_t*,
                                                int64_t, float*);
template uint32_t fp8_amax_bits<float>(const float*, int64_t);
template uint32_t fp8_amax_bits<bfloat16>(const bfloat16*, int64_t);
template uint32_t fp8_amax_bits<float16>(const float16*, int64_t);

}  // namespace octet::kernels::cpu
