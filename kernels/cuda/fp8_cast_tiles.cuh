#pragma once
// The tiled FP8 cast kernel (cast + transpose + amax, + the bias gradient's per-tile column sums),
// shared by fp8.cu (fp8_cast, fp8_cast_dbias) and the GELU writing FP8 (gelu_fp8.cu).
//
// The kernel is a template over its Input: the value it casts for element i, as fp8_cast reads a
// stored element. StoredInput reads x[i] (fp8_cast itself); gelu_fp8.cu's inputs compute GELU (its
// backward) of x[i], round it to x's dtype as gelu_forward (gelu_backward) stores it, and widen it as
// StoredInput widens a stored element. Everything after the element -- the bytes, the transposed copy
// and its padding, the amax, scale_inv and the order of the column sums -- is this one kernel, so a
// fused cast writes the bits of the cast of the stored tensor whatever the Input. An Input is
//   struct Input {
//     using Element = ...;  // the element type of the kernel's pointers x and x2 (x2 may be unused)
//     // element i; elements i .. i+3 (i % 4 == 0, every pointer 4-element aligned)
//     static __device__ float one(const Element* x, const Element* x2, int64_t i);
//     static __device__ void quad(const Element* x, const Element* x2, int64_t i, float v[4]);
//   };
// Included by .cu files only.
#include <algorithm>
#include <cstdint>

#include "core/float_formats.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_elements.cuh"
#include "kernels/fp8.h"
#include "kernels/fp8_scale_rule.h"

namespace octet::kernels::cuda {

// A tile of kTile × kTile elements per iteration of a block of kCastThreads threads: thread (tx, ty)
// handles the 4 consecutive columns 4·tx.. of rows ty, ty + 16, ty + 32, ty + 48. A warp thus reads
// two 64-element row segments, and writes them back as two 64-byte segments of the row-major copy.
// The quantised bytes go through shared memory so that the transposed copy is written the same way:
// a warp writes two 64-byte segments of two rows of the transpose.
constexpr int kTile = 64;
constexpr int kCastThreads = 256;
constexpr int kQuadsPerRow = kTile / 4;                 // 16 threads across a tile row
constexpr int kRowStride = kCastThreads / kQuadsPerRow;  // 16 tile rows per pass

struct CastArgs {
  int64_t rows, cols, padded_rows;  // padded_rows: rows of the tiles the transpose needs (>= rows)
  int64_t tiles_x, tiles;           // tiles across the columns; tiles in all
  const float* scale;
  uint8_t* data;        // [rows, cols] or null
  uint8_t* transposed;  // [cols, padded_rows] or null
  unsigned int* amax_bits;  // the amax tensor as bits, or null
  float* scale_inv;
  float* column_partials;  // [row tiles, cols] f32: each tile's column sums (fp8_cast_dbias), or null
  bool quad_rows;        // x, data: 4-element loads and 4-byte stores (cols % 4 == 0, aligned pointers)
  bool quad_transposed;  // transposed: 4-byte stores (padded_rows % 4 == 0, aligned pointer)
};

// data = fp8(v·scale) row-major and/or transposed = its transpose with zero columns rows..padded_rows,
// amax ← max(amax, amax(v)), and scale_inv = 1/scale (block 0), for v the elements Input reads from x
// (and x2). Reads each input once (rows·cols elements) and writes rows·cols bytes per copy plus the
// transposed padding; one atomic per block.
// With kColumnSums, also column_partials[tile row, c] = the f32 sum of the tile's rows of column c of v,
// in a fixed order (each thread adds its 4 rows of the tile in order, then thread lc adds the 16 threads'
// sums of column lc in order): 4 bytes written per column per 64 rows, no float atomics.
template <class Input, bool kE5M2, bool kColumnSums>
__global__ void __launch_bounds__(kCastThreads)
    fp8_cast_kernel(const typename Input::Element* __restrict__ x, const typename Input::Element* __restrict__ x2,
                    CastArgs a) {
  __shared__ uint8_t tile[kTile][kTile + 1];  // +1: the transposed reads walk down a column
  __shared__ uint32_t scratch[32];
  __shared__ float column_sums[kColumnSums ? kRowStride : 1][kTile];  // [ty][tile column]
  const float scale = *a.scale;
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.scale_inv = fp8_scale_inv(scale);
  const int tx = threadIdx.x % kQuadsPerRow, ty = threadIdx.x / kQuadsPerRow;
  uint32_t local = 0;
  for (int64_t t = blockIdx.x; t < a.tiles; t += gridDim.x) {
    const int64_t r0 = (t / a.tiles_x) * kTile, c0 = (t % a.tiles_x) * kTile;
    const int64_t c = c0 + 4 * tx;
    // The previous tile's reads of the shared tile (transposed) and column sums are done.
    if (a.transposed || kColumnSums) __syncthreads();
    float sums[4] = {0.f, 0.f, 0.f, 0.f};  // this thread's rows of its 4 columns, added in row order
#pragma unroll
    for (int k = 0; k < kTile / kRowStride; ++k) {
      const int lr = ty + k * kRowStride;
      const int64_t r = r0 + lr;
      uint8_t q[4] = {0, 0, 0, 0};  // rows past `rows` are the transpose's zero padding
      if (r < a.rows) {
        const int64_t i = r * a.cols + c;
        float v[4] = {0.f, 0.f, 0.f, 0.f};
        bool in[4];
        if (a.quad_rows) {
          const bool quad_in = c < a.cols;  // cols % 4 == 0: a quad is all in or all out
          if (quad_in) Input::quad(x, x2, i, v);
#pragma unroll
          for (int j = 0; j < 4; ++j) in[j] = quad_in;
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            in[j] = c + j < a.cols;
            if (in[j]) v[j] = Input::one(x, x2, i + j);
          }
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (in[j]) {
            local = max(local, magnitude_bits(v[j]));
            q[j] = quantise<kE5M2>(v[j], scale);
            if (kColumnSums) sums[j] = __fadd_rn(sums[j], v[j]);
          }
        }
        if (a.data) {
          uint8_t* out = a.data + r * a.cols + c;
          if (a.quad_rows) {
            if (in[0]) *reinterpret_cast<uint32_t*>(out) = pack_bytes(q);
          } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              if (in[j]) out[j] = q[j];
            }
          }
        }
      }
      if (a.transposed) {
#pragma unroll
        for (int j = 0; j < 4; ++j) tile[lr][4 * tx + j] = q[j];
      }
    }
    if (kColumnSums) {
#pragma unroll
      for (int j = 0; j < 4; ++j) column_sums[ty][4 * tx + j] = sums[j];
    }
    if (!a.transposed && !kColumnSums) continue;
    __syncthreads();
    if (kColumnSums && threadIdx.x < kTile) {
      const int lc = threadIdx.x;
      float s = 0.f;
#pragma unroll
      for (int k = 0; k < kRowStride; ++k) s = __fadd_rn(s, column_sums[k][lc]);
      if (c0 + lc < a.cols) a.column_partials[(t / a.tiles_x) * a.cols + c0 + lc] = s;
    }
    if (!a.transposed) continue;
    // transposed[cc, r .. r+3] for the tile's columns cc: tile column lc read down four tile rows.
    const int64_t r = r0 + 4 * tx;
#pragma unroll
    for (int k = 0; k < kTile / kRowStride; ++k) {
      const int lc = ty + k * kRowStride;
      const int64_t cc = c0 + lc;
      if (cc >= a.cols || r >= a.padded_rows) continue;
      uint8_t b[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = tile[4 * tx + j][lc];
      uint8_t* out = a.transposed + cc * a.padded_rows + r;
      if (a.quad_transposed) {  // padded_rows % 4 == 0, so r + 3 < padded_rows
        *reinterpret_cast<uint32_t*>(out) = pack_bytes(b);
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (r + j < a.padded_rows) out[j] = b[j];
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
  static __device__ __forceinline__ float one(const X* x, const X*, int64_t i) { return static_cast<float>(x[i]); }
  static __device__ __forceinline__ void quad(const X* x, const X*, int64_t i, float v[4]) {
    const Quad<X> q = *reinterpret_cast<const Quad<X>*>(x + i);
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = static_cast<float>(q.v[j]);
  }
};

// ---- host side (defined in fp8.cu, but for the launch template) ------------------------------------

bool aligned_to(const void* p, size_t bytes);

// Allocates out's copies and scale_inv on `device` and fills the arguments of fp8_cast_kernel, but for
// quad_rows (run_fp8_cast_kernel sets it from the inputs). column_partials: fp8_cast_dbias's scratch
// (column_partials_for), or null for no column sums.
CastArgs prepare_cast(Device device, int64_t rows, int64_t cols, const Tensor& scale, const Tensor& amax,
                      DType fp8_dtype, bool rowwise, bool transposed, int64_t padded_rows, float* column_partials,
                      Fp8Cast& out);

// fp8_cast_kernel's grid: enough blocks to fill every SM (8 resident blocks of 256 threads each), each
// looping over tiles, which also bounds the atomics on amax to one per block; at least one block,
// which writes scale_inv.
unsigned cast_blocks(const CastArgs& a, int device_index);

// The [row tiles, cols] f32 scratch of the per-tile column sums (the tiles span padded_rows when the
// transpose is written), zeroed when no tile runs.
Tensor column_partials_for(Device device, int64_t rows, int64_t cols, bool transposed, int64_t padded_rows);

// dbias[c] = dbias_dtype(x_dtype(Σ over the tiles of partials[t, c])), summed in a fixed order: the
// second step of fp8_cast_dbias, after fp8_cast_kernel with column sums has filled `partials`.
Tensor dbias_from_column_partials(const Tensor& partials, int64_t cols, DType x_dtype, DType dbias_dtype);

// Launches fp8_cast_kernel<Input> over x (and x2, or null) with the arguments of prepare_cast: the
// format and the column sums (a.column_partials non-null) pick the instantiation, and the 4-element
// path is taken when cols % 4 == 0 and every pointer allows it.
template <class Input>
void run_fp8_cast_kernel(const typename Input::Element* x, const typename Input::Element* x2, CastArgs a,
                         DType fp8_dtype, int device_index, cudaStream_t stream, const char* op) {
  using E = typename Input::Element;
  a.quad_rows = a.cols % 4 == 0 && aligned_to(x, 4 * sizeof(E)) && (x2 == nullptr || aligned_to(x2, 4 * sizeof(E))) &&
                (a.data == nullptr || aligned_to(a.data, 4));
  const unsigned blocks = cast_blocks(a, device_index);
  auto launch = [&]<bool kE5M2>() {
    if (a.column_partials) {
      fp8_cast_kernel<Input, kE5M2, true><<<blocks, kCastThreads, 0, stream>>>(x, x2, a);
    } else {
      fp8_cast_kernel<Input, kE5M2, false><<<blocks, kCastThreads, 0, stream>>>(x, x2, a);
    }
  };
  if (fp8_dtype == DType::e5m2) {
    launch.template operator()<true>();
  } else {
    launch.template operator()<false>();
  }
  check_launch(op);
}

}  // namespace octet::kernels::cuda
