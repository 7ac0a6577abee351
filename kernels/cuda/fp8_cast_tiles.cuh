#pragma once
// The tiled FP8 cast kernel (cast + transpose + amax, + the bias gradient's per-tile column sums),
// shared by fp8.cu (fp8_cast, fp8_cast_dbias) and the GELU writing FP8 (gelu_fp8.cu).
//
// The kernel is a template over its Input: the values it casts, as fp8_cast reads stored elements.
// StoredInput reads x (fp8_cast itself); gelu_fp8.cu's inputs compute GELU (its backward) of x, round it
// to x's dtype as gelu_forward (gelu_backward) stores it, and widen it as StoredInput widens a stored
// element. Everything after the values -- the bytes, the transposed copy and its padding, the amax,
// scale_inv and the order of the column sums -- is this one kernel, so a fused cast writes the bits of
// the cast of the stored tensor whatever the Input. An Input is
//   struct Input {
//     using Element = ...;  // the element type of the kernel's pointers x and x2 (x2 may be unused)
//     static constexpr int kMinBlocksPerSm = ...;  // __launch_bounds__: the register budget
//     static constexpr bool kMaySumColumns = ...;  // whether a cast of it may sum columns (a bias
//                                                   // gradient): only then are those kernels compiled
//     struct Loaded { ... };  // what load() reads for 8 consecutive elements
//     // elements i .. i+7: i % 8 == 0, x and x2 16-byte aligned
//     static __device__ Loaded load(const Element* x, const Element* x2, int64_t i);
//     static __device__ void values(const Loaded& in, float v[8]);
//     // element i, any alignment
//     static __device__ float one(const Element* x, const Element* x2, int64_t i);
//   };
// An all-zero Loaded is never computed on: rows past the tensor take the value 0 without a load.
//
// Design. The cast is memory-bound only if it is cheap: at 4.3 TB/s a bf16 element with both copies
// (2 bytes read, 2 written) takes ~1 ps, while one instruction per element across the GPU takes ~0.5 ps
// at ViT-H's 16 M elements. So the kernel keeps the accesses wide and the per-element work to a handful
// of instructions:
//   - a block of 128 threads (4 warps) casts a 64 × 64 tile; thread (quad, seg) takes tile rows
//     4·quad .. 4·quad+3 and columns 8·seg .. 8·seg+7: one 16-byte load per row for a 2-byte input (two
//     for f32), all four issued before any arithmetic. A warp reads 4 rows × 128 bytes per load;
//   - four values become one word of FP8 bytes through two hardware conversions (quantise4); the
//     row-major copy is written as one 8-byte store per row (a warp: 4 rows × 64 bytes);
//   - for the transposed copy, each thread turns its two 4×4 byte blocks into words that each hold
//     four rows of one column (transpose_bytes_4x4, eight byte permutes), and stores them in a shared
//     64 × 64-byte tile kept as [tile column][4-row group] words; the tile is read back as 16-byte
//     chunks (16 rows of one column) and written with 16-byte stores, a warp writing 8 transposed rows
//     × 64 bytes. The word layout is swizzled so that neither the stores nor the 16-byte loads of shared
//     memory conflict on banks (tile_word below);
//   - amax is the largest magnitude bit pattern seen by the thread, reduced once per block at the end
//     (shuffles, then one atomicMax on the amax bits);
//   - column sums (fp8_cast_dbias): each thread adds its four rows in order, the four threads of a warp
//     sharing columns combine theirs with two xor-shuffles, and the four warps' sums are added in warp
//     order: column_partials[row tile, c], one f32 per column per 64 rows, then summed over the row tiles
//     in a fixed order by dbias_from_column_partials. Every step is in a fixed order, so dbias is the
//     same bits on every run and for the fused and unfused casts.
// Shapes the fast path does not fit fall back within the same kernel: cols not a multiple of 8 or an
// unaligned pointer take scalar loads and byte stores (kVector = false); a transposed copy whose rows
// are not a multiple of 16 bytes (padding to 1, 3, 7 rows) or not 16-byte aligned takes byte stores.
// Partial tiles (the last rows and columns) skip what lies outside the tensor; rows past `rows` are
// zeros, which are the transposed copy's padding.
// The grid: the blocks the SMs hold at once (at most kCastBlocksPerSm an SM), each taking tiles t,
// t + gridDim.x, ...: every block resident from the start, enough warps that their loads cover the
// memory latency, the tiles spread evenly, and at most that many amax atomics. A block loads a tile
// when it is done with the last one. Loading the next tile row by row into the registers of the row
// whose values were just computed (a refill) was tried and timed slower on an H200 (the dGELU cast
// 178.4 µs against 127.5, fp8_cast_dbias 114.6 against 81.7; probably spills, and reads among the
// writes).
// Included by .cu files only.
#include <algorithm>
#include <cstdint>

#include "core/float_formats.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_elements.cuh"
#include "kernels/fp8.h"
#include "kernels/fp8_scale_rule.h"

namespace octet::kernels::cuda {

constexpr int kTile = 64;         // tile side in rows and columns; also the row band of column_partials
constexpr int kCastThreads = 128;
constexpr int kCastWarps = kCastThreads / 32;
constexpr int kSegment = 8;       // consecutive elements of a row per thread (16 bytes of bf16)
constexpr int kThreadRows = 4;    // rows per thread: the four bytes of a word of the transposed copy
constexpr int kSegmentsPerRow = kTile / kSegment;  // 8 threads across a tile row
constexpr int kTileWordsPerColumn = kTile / kThreadRows;  // 16 words of 4 rows per tile column
constexpr int kCastBlocksPerSm = 16;
static_assert(kCastThreads == (kTile / kThreadRows) * kSegmentsPerRow, "a thread per 4 × 8 block of the tile");
static_assert(kSegmentsPerRow * kThreadRows == 32, "a warp is 4 row groups × 8 segments");

struct CastArgs {
  int64_t rows, cols, padded_rows;  // padded_rows: rows of the tiles the transpose needs (>= rows)
  int64_t tiles_x, tiles;           // tiles across the columns; tiles in all
  const float* scale;
  uint8_t* data;        // [rows, cols] or null
  uint8_t* transposed;  // [cols, padded_rows] or null
  unsigned int* amax_bits;  // the amax tensor as bits, or null
  float* scale_inv;
  float* column_partials;    // [row tiles, cols] f32: each tile's column sums (fp8_cast_dbias), or null
  bool vector_transposed;    // transposed: 16-byte stores (padded_rows % 16 == 0, 16-byte aligned pointer)
};

// The shared word holding rows 4g .. 4g+3 of tile column c. Words 4q .. 4q+3 of a column (one 16-byte
// chunk, rows 16q .. 16q+15) stay together and in order; the chunk index is XORed with (c / 16) % 4.
// Banks (32 of 4 bytes, a column's 16 words fill half of them): a quarter-warp reading chunks reads
// 2 columns × 4 chunks = all 8 chunk positions; a warp storing words stores 4 row groups × 8 columns
// with the column order flipped for odd seg (the kernel), so the 32 words fall on 32 banks.
__device__ __forceinline__ int tile_word(int c, int g) {
  return c * kTileWordsPerColumn + (g ^ (((c >> 4) & 3) << 2));
}

// Eight consecutive elements of T as 16-byte packs (one for 2-byte types, two for f32).
template <class T>
struct Eight {
  static constexpr int kPacks = kSegment / Pack<T>::N;
  Pack<T> p[kPacks];
  __device__ __forceinline__ T operator[](int j) const { return p[j / Pack<T>::N].v[j % Pack<T>::N]; }
};
template <class T>
__device__ __forceinline__ Eight<T> load_eight(const T* p) {
  Eight<T> e;
#pragma unroll
  for (int k = 0; k < Eight<T>::kPacks; ++k) e.p[k] = load_pack(p + k * Pack<T>::N);
  return e;
}

// data = fp8(v·scale) row-major and/or transposed = its transpose with zero columns rows..padded_rows,
// amax ← max(amax, amax(v)), and scale_inv = 1/scale (block 0), for v the values Input gives for x
// (and x2). Reads each input once (rows·cols elements) and writes rows·cols bytes per copy plus the
// transposed padding; one atomic per block. With kColumnSums, also column_partials[row tile, c] = the
// f32 sum of the tile's rows of column c of v, in the fixed order of the file comment: 4 bytes written
// per column per 64 rows, no float atomics. kVector: cols % 8 == 0, x and x2 16-byte aligned, data
// 8-byte aligned (run_fp8_cast_kernel checks).
template <class Input, bool kE5M2, bool kColumnSums, bool kVector>
__global__ void __launch_bounds__(kCastThreads, Input::kMinBlocksPerSm)
    fp8_cast_kernel(const typename Input::Element* __restrict__ x, const typename Input::Element* __restrict__ x2,
                    CastArgs a) {
  __shared__ alignas(16) uint32_t tile[kTile * kTileWordsPerColumn];  // the transposed bytes, tile_word
  __shared__ float warp_sums[kColumnSums ? kCastWarps : 1][kTile];     // [warp][tile column]
  __shared__ uint32_t scratch[32];
  const float scale = *a.scale;
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.scale_inv = fp8_scale_inv(scale);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int seg = lane % kSegmentsPerRow;                            // tile columns 8·seg ..
  const int quad = warp * (32 / kSegmentsPerRow) + lane / kSegmentsPerRow;  // tile rows 4·quad ..
  const bool transposed = a.transposed != nullptr;
  const bool uses_tile = transposed || kColumnSums;
  uint32_t local = 0;
  // The block's tiles t = blockIdx.x, + gridDim.x, ...: tile t is (t / tiles_x, t % tiles_x) in tiles
  // down and across, stepped from one to the next without a division (a 64-bit one is a long routine).
  struct TileAt {
    int64_t row_tile, col_tile;
  };
  const int64_t tiles_x = a.tiles > 0 ? a.tiles_x : 1;  // no division by zero where there is no tile
  const int64_t step_down = gridDim.x / tiles_x, step_across = gridDim.x % tiles_x;
  auto next_tile = [&](TileAt p) {
    p.row_tile += step_down;
    p.col_tile += step_across;
    if (p.col_tile >= a.tiles_x) {
      p.col_tile -= a.tiles_x;
      ++p.row_tile;
    }
    return p;
  };
  // This thread's first element of a tile: row first_row(p), column first_col(p).
  auto first_row = [&](TileAt p) { return p.row_tile * kTile + kThreadRows * quad; };
  auto first_col = [&](TileAt p) { return p.col_tile * kTile + kSegment * seg; };
  // This thread's loads (the 16-byte path; the scalar path loads as it goes): its four rows of a tile,
  // row i into in[i], from its first element there (row r, column c) as the offset r · cols + c and
  // the rows and columns left from there. cols % 8 == 0 there, so a segment is wholly inside the
  // columns or wholly outside.
  typename Input::Loaded in[kThreadRows];
  bool inside[kThreadRows];
  auto load_rows = [&](int64_t r, int64_t c) {
    const int64_t offset = r * a.cols + c, rows_left = a.rows - r;
    const bool cols_inside = c < a.cols;
#pragma unroll
    for (int i = 0; i < kThreadRows; ++i) {
      inside[i] = i < rows_left && cols_inside;
      if (inside[i]) in[i] = Input::load(x, x2, offset + i * a.cols);
    }
  };
  TileAt at{blockIdx.x / tiles_x, blockIdx.x % tiles_x};
  for (int64_t t = blockIdx.x; t < a.tiles; t += gridDim.x, at = next_tile(at)) {
    const int64_t row_tile = at.row_tile, r0 = row_tile * kTile, c0 = at.col_tile * kTile;
    const int64_t r = first_row(at), c = first_col(at);
    // The four rows' loads, all issued before any arithmetic.
    if constexpr (kVector) load_rows(r, c);

    // Row by row (so that one row's values are live at a time): the values v[j] of (r + i, c + j), 0
    // outside the tensor; their FP8 bytes, columns 4h .. 4h+3 in word bytes[i][h]; the amax; the
    // row-major copy; and the column sums s[j], the four rows added in order.
    uint32_t bytes[kThreadRows][2];
    float s[kSegment];
#pragma unroll
    for (int i = 0; i < kThreadRows; ++i) {
      float v[kSegment];
      if constexpr (kVector) {
        if (inside[i]) {
          Input::values(in[i], v);
        } else {
#pragma unroll
          for (int j = 0; j < kSegment; ++j) v[j] = 0.f;
        }
      } else {
#pragma unroll
        for (int j = 0; j < kSegment; ++j) {
          v[j] = r + i < a.rows && c + j < a.cols ? Input::one(x, x2, (r + i) * a.cols + c + j) : 0.f;
        }
      }
      bytes[i][0] = quantise4<kE5M2>(&v[0], scale);
      bytes[i][1] = quantise4<kE5M2>(&v[4], scale);
#pragma unroll
      for (int j = 0; j < kSegment; ++j) {
        local = max(local, magnitude_bits(v[j]));
        if constexpr (kColumnSums) s[j] = i == 0 ? v[j] : __fadd_rn(s[j], v[j]);
      }
      if (a.data != nullptr && r + i < a.rows) {
        uint8_t* out = a.data + (r + i) * a.cols + c;
        if constexpr (kVector) {
          if (c < a.cols) *reinterpret_cast<uint2*>(out) = make_uint2(bytes[i][0], bytes[i][1]);
        } else {
#pragma unroll
          for (int j = 0; j < kSegment; ++j) {
            if (c + j < a.cols) out[j] = static_cast<uint8_t>(bytes[i][j / 4] >> (8 * (j % 4)));
          }
        }
      }
    }
    if (!uses_tile) continue;

    // The previous tile's reads of `tile` and `warp_sums` are done (this tile's loads are already out).
    __syncthreads();
    if (transposed) {
      uint32_t col[kSegment];  // col[j]: rows r .. r+3 of column c + j
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t rows4[kThreadRows] = {bytes[0][h], bytes[1][h], bytes[2][h], bytes[3][h]};
        transpose_bytes_4x4(rows4, &col[4 * h]);
      }
      // Odd segments store their columns in the order 1, 0, 3, 2, ... (see tile_word).
      const bool odd = seg & 1;
#pragma unroll
      for (int j = 0; j < kSegment; ++j) {
        const int lc = kSegment * seg + (j ^ static_cast<int>(odd));
        tile[tile_word(lc, quad)] = odd ? col[j ^ 1] : col[j];
      }
    }
    if constexpr (kColumnSums) {
#pragma unroll
      for (int j = 0; j < kSegment; ++j) {
        // Lanes seg, seg + 8, seg + 16, seg + 24 share column c + j; a + b = b + a, so the butterfly
        // leaves the same sum in all four.
        s[j] = __fadd_rn(s[j], __shfl_xor_sync(0xffffffffu, s[j], 8));
        s[j] = __fadd_rn(s[j], __shfl_xor_sync(0xffffffffu, s[j], 16));
      }
      if (lane < kSegmentsPerRow) {
#pragma unroll
        for (int j = 0; j < kSegment; ++j) warp_sums[warp][kSegment * seg + j] = s[j];
      }
    }
    __syncthreads();
    if constexpr (kColumnSums) {
      if (threadIdx.x < kTile && c0 + threadIdx.x < a.cols) {
        const int lc = threadIdx.x;
        float total = warp_sums[0][lc];
#pragma unroll
        for (int w = 1; w < kCastWarps; ++w) total = __fadd_rn(total, warp_sums[w][lc]);
        a.column_partials[row_tile * a.cols + c0 + lc] = total;
      }
    }
    if (transposed) {
      // 16-byte chunk k: rows 16q .. 16q+15 of tile column lc, i.e. bytes 16q .. of transposed row c0 + lc.
#pragma unroll
      for (int m = 0; m < kTile * kTile / 16 / kCastThreads; ++m) {
        const int k = threadIdx.x + m * kCastThreads;
        const int lc = k / 4, q = k % 4;
        const int64_t tc = c0 + lc, tr = r0 + 16 * q;
        if (tc >= a.cols || tr >= a.padded_rows) continue;
        const uint4 chunk = *reinterpret_cast<const uint4*>(&tile[tile_word(lc, 4 * q)]);
        uint8_t* out = a.transposed + tc * a.padded_rows + tr;
        if (a.vector_transposed) {  // padded_rows % 16 == 0: the chunk is wholly inside
          *reinterpret_cast<uint4*>(out) = chunk;
        } else {
          const uint32_t w[4] = {chunk.x, chunk.y, chunk.z, chunk.w};
#pragma unroll
          for (int e = 0; e < 16; ++e) {
            if (tr + e < a.padded_rows) out[e] = static_cast<uint8_t>(w[e / 4] >> (8 * (e % 4)));
          }
        }
      }
    }
  }
  publish_amax(local, scratch, a.amax_bits);
}

// The stored tensor x itself (x2 unused). The host storage types of core/float_formats.h work on the
// device too (their conversions are OCTET_HD), so the GPU widens bf16 and f16 with the very code the
// CPU runs.
template <class X>
struct StoredInput {
  using Element = X;
  static constexpr int kMinBlocksPerSm = 6;  // at most 80 registers
  static constexpr bool kMaySumColumns = true;  // fp8_cast_dbias
  using Loaded = Eight<X>;
  static __device__ __forceinline__ Loaded load(const X* x, const X*, int64_t i) { return load_eight(x + i); }
  static __device__ __forceinline__ void values(const Loaded& in, float v[kSegment]) {
#pragma unroll
    for (int j = 0; j < kSegment; ++j) v[j] = static_cast<float>(in[j]);
  }
  static __device__ __forceinline__ float one(const X* x, const X*, int64_t i) { return static_cast<float>(x[i]); }
};

// ---- host side (defined in fp8.cu, but for the launch template) ------------------------------------

bool aligned_to(const void* p, size_t bytes);

// Allocates out's copies and scale_inv on `device` and fills the arguments of fp8_cast_kernel.
// column_partials: fp8_cast_dbias's scratch (column_partials_for), or null for no column sums.
CastArgs prepare_cast(Device device, int64_t rows, int64_t cols, const Tensor& scale, const Tensor& amax,
                      DType fp8_dtype, bool rowwise, bool transposed, int64_t padded_rows, float* column_partials,
                      Fp8Cast& out);

// fp8_cast_kernel's grid: a block per tile up to the blocks the SMs hold at once (resident_per_sm, at
// most kCastBlocksPerSm, each SM's share), so that every block starts at once and they loop over the
// tiles in step, the tiles spread evenly (which also bounds the atomics on amax to one per block); at
// least one block, which writes scale_inv. A grid larger than the SMs hold runs in waves of whole
// blocks, and each block of a GELU cast takes several tiles: ViT-H's GELU -> FP8 (6 blocks an SM)
// made 2112 blocks of 7-8 tiles, 2.7 waves with the last a third empty; now 792 blocks of 19-20.
unsigned cast_blocks(const CastArgs& a, int device_index, int resident_per_sm);

// How many blocks of `kernel` (kCastThreads threads, static shared memory only) an SM holds at once.
template <class Kernel>
int cast_blocks_per_sm(Kernel kernel) {
  return resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), kCastThreads, 0);
}

// The [row tiles, cols] f32 scratch of the per-tile column sums (the tiles span padded_rows when the
// transpose is written), zeroed when no tile runs.
Tensor column_partials_for(Device device, int64_t rows, int64_t cols, bool transposed, int64_t padded_rows);

// dbias[c] = dbias_dtype(x_dtype(Σ over the tiles of partials[t, c])), summed in a fixed order: the
// second step of fp8_cast_dbias, after fp8_cast_kernel with column sums has filled `partials`.
Tensor dbias_from_column_partials(const Tensor& partials, int64_t cols, DType x_dtype, DType dbias_dtype);

// Launches fp8_cast_kernel<Input> over x (and x2, or null) with the arguments of prepare_cast: the
// format and the column sums (a.column_partials non-null) pick the instantiation, and the 16-byte path
// is taken when cols % 8 == 0 and every pointer allows it.
template <class Input>
void run_fp8_cast_kernel(const typename Input::Element* x, const typename Input::Element* x2, const CastArgs& a,
                         DType fp8_dtype, int device_index, cudaStream_t stream, const char* op) {
  const bool vector = a.cols % kSegment == 0 && aligned_to(x, 16) && (x2 == nullptr || aligned_to(x2, 16)) &&
                      (a.data == nullptr || aligned_to(a.data, 8));
  auto launch = [&]<bool kE5M2, bool kColumnSums>() {
    auto run = [&](auto kernel) {
      kernel<<<cast_blocks(a, device_index, cast_blocks_per_sm(kernel)), kCastThreads, 0, stream>>>(x, x2, a);
    };
    if (vector) {
      run(fp8_cast_kernel<Input, kE5M2, kColumnSums, true>);
    } else {
      run(fp8_cast_kernel<Input, kE5M2, kColumnSums, false>);
    }
  };
  const bool e5m2 = fp8_dtype == DType::e5m2;
  if (a.column_partials == nullptr) {
    if (e5m2) launch.template operator()<true, false>();
    else launch.template operator()<false, false>();
  } else if constexpr (Input::kMaySumColumns) {
    if (e5m2) launch.template operator()<true, true>();
    else launch.template operator()<false, true>();
  } else {
    OCTET_FAIL(op, ": column sums asked of a cast that has none (an internal error)");
  }
  check_launch(op);
}

}  // namespace octet::kernels::cuda
