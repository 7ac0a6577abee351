// FP8 cast (+ transpose + amax, + the bias gradient's column sums), amax, and the delayed/current scale
// updates on the GPU.
//
// The element arithmetic is the CPU's (kernels/cpu/fp8.cpp) from the same host/device sources (the
// element steps are in fp8_elements.cuh, shared with the LayerNorm writing FP8): inputs widen to f32
// through core/float_formats.h, q = float_to_e4m3/e5m2(x·scale, saturate) with x·scale one correctly
// rounded f32 product, amax is the largest |x| bit pattern (NaN and inf propagate; atomicMax on those
// bits is valid because they are non-negative integers in the order of the values), and the scale
// rules come from kernels/fp8_scale_rule.h. So every result here equals the CPU's bit for bit,
// whatever the grid.
#include <algorithm>
#include <vector>

#include "core/float_formats.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/cuda/fp8_elements.cuh"
#include "kernels/fp8_scale_rule.h"

namespace octet::kernels::cuda {
namespace {

// ---- shared pieces -------------------------------------------------------------------------------

int sm_count(int device) {
  int n = 0;
  octet::cuda::check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device),
                     "cudaDeviceGetAttribute(multiprocessor count)");
  return n;
}

// The host storage types of core/float_formats.h work on the device too (their conversions are
// OCTET_HD), so the GPU widens bf16 and f16 with the very code the CPU runs.
template <class F>
decltype(auto) with_input_type(DType d, F&& f) {
  if (d == DType::bf16) return f.template operator()<bfloat16>();
  if (d == DType::f16) return f.template operator()<float16>();
  return f.template operator()<float>();
}

// ---- cast + transpose + amax -----------------------------------------------------------------------

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

// data = fp8(x·scale) row-major and/or transposed = its transpose with zero columns rows..padded_rows,
// amax ← max(amax, amax(x)), and scale_inv = 1/scale (block 0). Reads x once (rows·cols·sizeof(X)
// bytes) and writes rows·cols bytes per copy plus the transposed padding; one atomic per block.
// With kColumnSums, also column_partials[tile row, c] = the f32 sum of the tile's rows of column c, in
// a fixed order (each thread adds its 4 rows of the tile in order, then thread lc adds the 16 threads'
// sums of column lc in order): 4 bytes written per column per 64 rows, no float atomics.
template <class X, bool kE5M2, bool kColumnSums>
__global__ void __launch_bounds__(kCastThreads) fp8_cast_kernel(const X* __restrict__ x, CastArgs a) {
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
        const X* row = x + r * a.cols;
        float v[4] = {0.f, 0.f, 0.f, 0.f};
        bool in[4];
        if (a.quad_rows) {
          const bool quad_in = c < a.cols;  // cols % 4 == 0: a quad is all in or all out
          if (quad_in) {
            const Quad<X> quad = *reinterpret_cast<const Quad<X>*>(row + c);
#pragma unroll
            for (int j = 0; j < 4; ++j) v[j] = static_cast<float>(quad.v[j]);
          }
#pragma unroll
          for (int j = 0; j < 4; ++j) in[j] = quad_in;
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            in[j] = c + j < a.cols;
            if (in[j]) v[j] = static_cast<float>(row[c + j]);
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

// dbias[c] = D(X(Σ_t partials[t, c])): the tiles' column sums added in a fixed order (warp w takes the
// tiles t ≡ w mod kSumWarps in order, then warp 0 adds the warps' sums in order), rounded to x's dtype
// as kernels::sum returns it, then to the bias's dtype. A block covers 32 columns; reads the partials
// once (4 bytes per column per 64 rows of x) and writes cols·sizeof(D) bytes.
constexpr int kSumColumns = 32;
constexpr int kSumWarps = 8;

template <class X, class D>
__global__ void __launch_bounds__(kSumColumns* kSumWarps)
    dbias_from_partials_kernel(const float* __restrict__ partials, int64_t row_tiles, int64_t cols, D* dbias) {
  __shared__ float warp_sums[kSumWarps][kSumColumns];
  const int lane = threadIdx.x % kSumColumns, warp = threadIdx.x / kSumColumns;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kSumColumns + lane;
  float s = 0.f;
  if (c < cols) {
    for (int64_t t = warp; t < row_tiles; t += kSumWarps) s = __fadd_rn(s, partials[t * cols + c]);
  }
  warp_sums[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && c < cols) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kSumWarps; ++w) total = __fadd_rn(total, warp_sums[w][lane]);
    dbias[c] = static_cast<D>(static_cast<float>(static_cast<X>(total)));
  }
}

// ---- amax alone -----------------------------------------------------------------------------------

// amax ← max(amax, amax(x)): grid-stride over x in 16-byte packs (when x is 16-byte aligned) and a
// scalar tail, block reduction, one atomic per block. Reads n·sizeof(X) bytes.
template <class X>
__global__ void __launch_bounds__(kThreads) fp8_amax_kernel(const X* __restrict__ x, int64_t n, bool packed,
                                                            unsigned int* amax_bits) {
  __shared__ uint32_t scratch[32];
  constexpr int N = Pack<X>::N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = packed ? n / N : 0;
  uint32_t local = 0;
  for (int64_t p = first; p < packs; p += stride) {
    const Pack<X> pack = load_pack(x + p * N);
#pragma unroll
    for (int j = 0; j < N; ++j) local = max(local, magnitude_bits(static_cast<float>(pack.v[j])));
  }
  for (int64_t i = packs * N + first; i < n; i += stride) local = max(local, magnitude_bits(static_cast<float>(x[i])));
  publish_amax(local, scratch, amax_bits);
}

// ---- delayed scaling ------------------------------------------------------------------------------

// One group of kernels/fp8.h's Fp8ScalingTensors as the kernel sees it.
struct ScalingEntry {
  float* history;  // [rows, cols]
  float* scale;    // [cols]
  float* scale_inv;
  int64_t rows, cols;
  float fp8_max;
};
// Entries per launch: the table is a kernel argument (copied with the launch, so the host can refill
// it at once), kept under the classic 4 KiB parameter limit.
constexpr int kMaxEntries = 64;
struct ScalingTable {
  ScalingEntry entries[kMaxEntries];
};
static_assert(sizeof(ScalingTable) + 64 <= 4096, "the table must fit the 4 KiB kernel parameter space");

constexpr int kUpdateThreads = 256;
constexpr int kMaxColumnBlocks = 1024;

// The block's NaN-propagating max of v, in every thread. scratch: __shared__ float[32].
__device__ __forceinline__ float block_amax_max(float v, float* scratch) {
  return block_reduce(v, scratch, 0.f, [](float x, float y) { return fp8_amax_max(x, y); });
}

// Per column j of group blockIdx.y (a block per column, columns strided by gridDim.x): the amax of
// the column (max of all rows, or row 0), the new scale and scale_inv, and the in-place roll
// row i ← row i+1, row L-1 ← row 0, row 0 ← 0. The threads walk the rows in chunks of blockDim.x;
// within a chunk every thread reads its row's successor before the barrier and writes after it, and a
// later chunk reads only rows no earlier chunk has written, so the shift is race-free. Row 0 is read
// by every thread before the first barrier. Bytes: reads and writes the L·n history once (strided by
// n: a group's columns share sectors through L2), plus 12 bytes per column.
__global__ void __launch_bounds__(kUpdateThreads) fp8_update_scales_kernel(ScalingTable table, float two_pow_margin,
                                                                           bool most_recent) {
  __shared__ float scratch[32];
  const ScalingEntry& e = table.entries[blockIdx.y];
  const int64_t L = e.rows, n = e.cols;
  for (int64_t j = blockIdx.x; j < n; j += gridDim.x) {
    float* column = e.history + j;
    const float row0 = column[0];
    float amax = 0.f;
    for (int64_t base = 0; base < L; base += blockDim.x) {
      const int64_t i = base + threadIdx.x;
      float next = 0.f;
      if (i < L) {
        next = i + 1 < L ? column[(i + 1) * n] : row0;
        amax = fp8_amax_max(amax, next);  // over all i, `next` visits every row once
      }
      __syncthreads();
      if (i < L) column[i * n] = i == 0 ? 0.f : next;
    }
    amax = block_amax_max(amax, scratch);
    if (threadIdx.x == 0) {
      const float s = fp8_scale_for_amax(most_recent ? row0 : amax, e.scale[j], e.fp8_max, two_pow_margin);
      e.scale[j] = s;
      e.scale_inv[j] = fp8_scale_inv(s);
    }
  }
}

// ---- current scaling -------------------------------------------------------------------------------

// scale[j], scale_inv[j] from amax[j]: reads 8 bytes and writes 8 bytes per entry.
__global__ void fp8_scale_from_amax_kernel(const float* __restrict__ amax, float* __restrict__ scale,
                                           float* __restrict__ scale_inv, int64_t n, float fp8_max,
                                           float two_pow_margin) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n; j += stride) {
    const float s = fp8_scale_for_amax(amax[j], scale[j], fp8_max, two_pow_margin);
    scale[j] = s;
    scale_inv[j] = fp8_scale_inv(s);
  }
}

bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

namespace {

// fp8_cast_kernel's launch, with the column sums to `column_partials` when it is non-null. Fills out.
void launch_cast(const Tensor& x, int64_t rows, int64_t cols, const Tensor& scale, const Tensor& amax,
                 DType fp8_dtype, bool rowwise, bool transposed, int64_t padded_rows, float* column_partials,
                 Fp8Cast& out, const char* op) {
  const Device device = x.device();
  if (rowwise) out.data = empty({rows, cols}, fp8_dtype, device);
  if (transposed) out.transposed = empty({cols, padded_rows}, fp8_dtype, device);
  out.scale_inv = empty({1}, DType::f32, device);
  CastArgs a{};
  a.rows = rows;
  a.cols = cols;
  a.padded_rows = transposed ? padded_rows : rows;
  a.tiles_x = (cols + kTile - 1) / kTile;
  a.tiles = a.tiles_x * ((a.padded_rows + kTile - 1) / kTile);
  a.scale = ptr<const float>(scale);
  a.data = rowwise ? ptr<uint8_t>(out.data) : nullptr;
  a.transposed = transposed ? ptr<uint8_t>(out.transposed) : nullptr;
  a.amax_bits = amax.defined() ? ptr<unsigned int>(amax) : nullptr;
  a.scale_inv = ptr<float>(out.scale_inv);
  a.column_partials = column_partials;
  a.quad_transposed = transposed && padded_rows % 4 == 0 && aligned_to(a.transposed, 4);
  cudaStream_t stream = stream_for(x);
  // Enough blocks to fill every SM (8 resident blocks of 256 threads each); each loops over tiles,
  // which also bounds the atomics on amax to one per block. At least one block writes scale_inv.
  const int64_t max_blocks = int64_t{8} * sm_count(device.index);
  const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min(a.tiles, max_blocks)));
  with_input_type(x.dtype(), [&]<class X>() {
    const X* xp = ptr<const X>(x);
    a.quad_rows = cols % 4 == 0 && aligned_to(xp, 4 * sizeof(X)) && (!rowwise || aligned_to(a.data, 4));
    auto launch = [&]<bool kE5M2>() {
      if (column_partials) {
        fp8_cast_kernel<X, kE5M2, true><<<blocks, kCastThreads, 0, stream>>>(xp, a);
      } else {
        fp8_cast_kernel<X, kE5M2, false><<<blocks, kCastThreads, 0, stream>>>(xp, a);
      }
    };
    if (fp8_dtype == DType::e5m2) {
      launch.template operator()<true>();
    } else {
      launch.template operator()<false>();
    }
    check_launch(op);
  });
}

}  // namespace

Fp8Cast fp8_cast(const Tensor& x, int64_t rows, int64_t cols, const Tensor& scale, const Tensor& amax,
                 DType fp8_dtype, bool rowwise, bool transposed, int64_t padded_rows) {
  Fp8Cast out;
  launch_cast(x, rows, cols, scale, amax, fp8_dtype, rowwise, transposed, padded_rows, nullptr, out, "fp8_cast");
  return out;
}

Fp8CastWithBiasGrad fp8_cast_dbias(const Tensor& x, int64_t rows, int64_t cols, const Tensor& scale,
                                   const Tensor& amax, DType fp8_dtype, bool rowwise, bool transposed,
                                   int64_t padded_rows, DType dbias_dtype) {
  const Device device = x.device();
  // The cast kernel's tiles span padded_rows when it writes the transpose (the padding rows add 0).
  const int64_t row_tiles = ((transposed ? padded_rows : rows) + kTile - 1) / kTile;
  Tensor partials = empty({std::max<int64_t>(row_tiles, 1), cols}, DType::f32, device);
  if (row_tiles == 0) partials.zero_();  // no tile runs: the sums are 0
  Fp8CastWithBiasGrad out;
  launch_cast(x, rows, cols, scale, amax, fp8_dtype, rowwise, transposed, padded_rows, ptr<float>(partials), out,
              "fp8_cast_dbias");
  out.dbias = empty({cols}, dbias_dtype, device);
  if (cols == 0) return out;
  const unsigned blocks = static_cast<unsigned>((cols + kSumColumns - 1) / kSumColumns);
  cudaStream_t stream = stream_for(x);
  with_input_type(x.dtype(), [&]<class X>() {
    with_input_type(dbias_dtype, [&]<class D>() {
      dbias_from_partials_kernel<X, D><<<blocks, kSumColumns * kSumWarps, 0, stream>>>(
          ptr<const float>(partials), std::max<int64_t>(row_tiles, 1), cols, ptr<D>(out.dbias));
    });
    check_launch("fp8_cast_dbias (dbias)");
  });
  return out;
}

void fp8_amax_(const Tensor& x, const Tensor& amax) {
  const int64_t n = x.numel();
  if (n == 0) return;
  cudaStream_t stream = stream_for(x);
  with_input_type(x.dtype(), [&]<class X>() {
    const X* xp = ptr<const X>(x);
    const bool packed = aligned16(xp);
    const int64_t work = packed ? (n + Pack<X>::N - 1) / Pack<X>::N : n;
    const int64_t max_blocks = int64_t{8} * sm_count(x.device().index);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(blocks_for(work), max_blocks));
    fp8_amax_kernel<X><<<blocks, kThreads, 0, stream>>>(xp, n, packed, ptr<unsigned int>(amax));
    check_launch("fp8_amax_");
  });
}

void fp8_update_scales_(const std::vector<Fp8ScalingTensors>& groups, float two_pow_margin, AmaxCompute algo) {
  cudaStream_t stream = stream_for(groups[0].amax_history);
  const bool most_recent = algo == AmaxCompute::MostRecent;
  ScalingTable table{};
  int entries = 0;
  int64_t widest = 0;
  auto flush = [&] {
    if (entries == 0) return;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(widest, kMaxColumnBlocks)), static_cast<unsigned>(entries));
    fp8_update_scales_kernel<<<grid, kUpdateThreads, 0, stream>>>(table, two_pow_margin, most_recent);
    check_launch("fp8_update_scales_");
    entries = 0;
    widest = 0;
  };
  for (const Fp8ScalingTensors& g : groups) {
    const int64_t n = g.amax_history.size(1);
    if (n == 0) continue;
    table.entries[entries++] = {ptr<float>(g.amax_history), ptr<float>(g.scale), ptr<float>(g.scale_inv),
                                g.amax_history.size(0), n, fp8_max(g.fp8_dtype)};
    widest = std::max(widest, n);
    if (entries == kMaxEntries) flush();
  }
  flush();
}

void fp8_scale_from_amax_(const Tensor& amax, const Tensor& scale, const Tensor& scale_inv, DType fp8_dtype,
                          float two_pow_margin) {
  const int64_t n = amax.numel();
  if (n == 0) return;
  cudaStream_t stream = stream_for(amax);
  fp8_scale_from_amax_kernel<<<blocks_for(n), kThreads, 0, stream>>>(ptr<const float>(amax), ptr<float>(scale),
                                                                      ptr<float>(scale_inv), n, fp8_max(fp8_dtype),
                                                                      two_pow_margin);
  check_launch("fp8_scale_from_amax_");
}

}  // namespace octet::kernels::cuda
