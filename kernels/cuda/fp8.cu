// FP8 cast (+ transpose + amax, + the bias gradient's column sums), amax, and the delayed/current scale
// updates on the GPU. The cast's tile kernel is in fp8_cast_tiles.cuh, shared with the GELU writing FP8
// (gelu_fp8.cu), which runs it over computed elements.
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
#include "kernels/cuda/fp8_cast_tiles.cuh"
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

// The host storage types of core/float_formats.h (see StoredInput in fp8_cast_tiles.cuh).
template <class F>
decltype(auto) with_input_type(DType d, F&& f) {
  if (d == DType::bf16) return f.template operator()<bfloat16>();
  if (d == DType::f16) return f.template operator()<float16>();
  return f.template operator()<float>();
}

// ---- the bias gradient from fp8_cast_kernel's per-tile column sums ---------------------------------

// dbias[c] = D(X(Σ_t partials[t, c])): the tiles' column sums added in a fixed order (warp w takes the
// tiles t ≡ w mod kSumWarps in order, then warp 0 adds the warps' sums in order), rounded to x's dtype
// as kernels::sum returns it, then to the bias's dtype. A block covers 32 columns; reads the partials
// once (4 bytes per column per 64 rows of x) and writes cols·sizeof(D) bytes. 16 warps, so that the
// 197 row tiles of ViT-H's 12,608 rows are a chain of 13 loads per thread, not 25.
constexpr int kSumColumns = 32;
constexpr int kSumWarps = 16;

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
// scalar tail, block reduction, one atomic per block. Each thread issues kAmaxUnroll packs' loads before
// it compares any, so that a grid of 8 blocks per SM keeps 32 KiB per SM in flight: a weight of a few
// MB is then one round trip to memory, not several. Reads n·sizeof(X) bytes.
constexpr int kAmaxUnroll = 4;

template <class X>
__global__ void __launch_bounds__(kThreads) fp8_amax_kernel(const X* __restrict__ x, int64_t n, bool packed,
                                                            unsigned int* amax_bits) {
  __shared__ uint32_t scratch[32];
  constexpr int N = Pack<X>::N;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t packs = packed ? n / N : 0;
  uint32_t local = 0;
  for (int64_t p0 = first; p0 < packs; p0 += kAmaxUnroll * stride) {
    Pack<X> pack[kAmaxUnroll];
#pragma unroll
    for (int u = 0; u < kAmaxUnroll; ++u) {
      if (p0 + u * stride < packs) pack[u] = load_pack(x + (p0 + u * stride) * N);
    }
#pragma unroll
    for (int u = 0; u < kAmaxUnroll; ++u) {
      if (p0 + u * stride >= packs) continue;
#pragma unroll
      for (int j = 0; j < N; ++j) local = max(local, magnitude_bits(static_cast<float>(pack[u].v[j])));
    }
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

}  // namespace

bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

CastArgs prepare_cast(Device device, int64_t rows, int64_t cols, const Tensor& scale, const Tensor& amax,
                      DType fp8_dtype, bool rowwise, bool transposed, int64_t padded_rows, float* column_partials,
                      Fp8Cast& out) {
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
  a.vector_transposed = transposed && padded_rows % 16 == 0 && aligned_to(a.transposed, 16);
  return a;
}

unsigned cast_blocks(const CastArgs& a, int device_index, int resident_per_sm) {
  const int per_sm = std::clamp(resident_per_sm, 1, kCastBlocksPerSm);
  const int64_t max_blocks = int64_t{per_sm} * sm_count(device_index);
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(a.tiles, max_blocks)));
}

Tensor column_partials_for(Device device, int64_t rows, int64_t cols, bool transposed, int64_t padded_rows) {
  const int64_t row_tiles = ((transposed ? padded_rows : rows) + kTile - 1) / kTile;
  Tensor partials = empty({std::max<int64_t>(row_tiles, 1), cols}, DType::f32, device);
  if (row_tiles == 0) partials.zero_();  // no tile runs: the sums are 0
  return partials;
}

Tensor dbias_from_column_partials(const Tensor& partials, int64_t cols, DType x_dtype, DType dbias_dtype) {
  Tensor dbias = empty({cols}, dbias_dtype, partials.device());
  if (cols == 0) return dbias;
  const unsigned blocks = static_cast<unsigned>((cols + kSumColumns - 1) / kSumColumns);
  cudaStream_t stream = stream_for(partials);
  with_input_type(x_dtype, [&]<class X>() {
    with_input_type(dbias_dtype, [&]<class D>() {
      // Bytes: reads the partials, writes dbias: 12,608 × 1280 (197 row tiles) 1.0 MB, 0.2 µs at 4.3 TB/s;
      // 12,608 × 5120 4.0 MB, 0.9 µs. Launch-bound at these sizes.
      dbias_from_partials_kernel<X, D><<<blocks, kSumColumns * kSumWarps, 0, stream>>>(
          ptr<const float>(partials), partials.size(0), cols, ptr<D>(dbias));
    });
    check_launch("fp8_cast_dbias (dbias)");
  });
  return dbias;
}

Fp8Cast fp8_cast(const Tensor& x, int64_t rows, int64_t cols, const Tensor& scale, const Tensor& amax,
                 DType fp8_dtype, bool rowwise, bool transposed, int64_t padded_rows) {
  Fp8Cast out;
  const CastArgs a =
      prepare_cast(x.device(), rows, cols, scale, amax, fp8_dtype, rowwise, transposed, padded_rows, nullptr, out);
  // Bytes: reads x once, writes rows·cols bytes per copy (+ the transposed padding). ViT-H at batch 64,
  // 12,608 × 1280 bf16 with both copies: 32.3 MB + 2 × 16.1 MB = 64.6 MB, 15.0 µs at 4.3 TB/s
  // (12,608 × 3840: 193.7 MB, 45 µs). The weights, both copies, no amax: 3840 × 1280 19.7 MB, 4.6 µs;
  // 5120 × 1280 and 1280 × 5120 26.2 MB, 6.1 µs; 1280 × 1280 6.6 MB, 1.5 µs.
  with_input_type(x.dtype(), [&]<class X>() {
    run_fp8_cast_kernel<StoredInput<X>>(ptr<const X>(x), nullptr, a, fp8_dtype, x.device().index, stream_for(x),
                                        "fp8_cast");
  });
  return out;
}

Fp8CastWithBiasGrad fp8_cast_dbias(const Tensor& x, int64_t rows, int64_t cols, const Tensor& scale,
                                   const Tensor& amax, DType fp8_dtype, bool rowwise, bool transposed,
                                   int64_t padded_rows, DType dbias_dtype) {
  const Tensor partials = column_partials_for(x.device(), rows, cols, transposed, padded_rows);
  Fp8CastWithBiasGrad out;
  const CastArgs a = prepare_cast(x.device(), rows, cols, scale, amax, fp8_dtype, rowwise, transposed, padded_rows,
                                  ptr<float>(partials), out);
  // Bytes: fp8_cast's, plus the partials (4 bytes per column per 64 rows) written here and read back by
  // dbias_from_column_partials. 12,608 × 1280 bf16, both copies: 64.6 MB + 2 × 1.0 MB, 15.5 µs at
  // 4.3 TB/s; 12,608 × 3840: 193.7 MB + 2 × 3.0 MB, 46 µs.
  with_input_type(x.dtype(), [&]<class X>() {
    run_fp8_cast_kernel<StoredInput<X>>(ptr<const X>(x), nullptr, a, fp8_dtype, x.device().index, stream_for(x),
                                        "fp8_cast_dbias");
  });
  out.dbias = dbias_from_column_partials(partials, cols, x.dtype(), dbias_dtype);
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
    // Bytes: reads x. ViT-H's weights in bf16: 5120 × 1280 13.1 MB, 3.0 µs at 4.3 TB/s; 3840 × 1280 9.8 MB,
    // 2.3 µs; 1280 × 1280 3.3 MB, 0.8 µs (a launch's few µs of fixed cost dominate these).
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
