// CUDA reductions and softmax over the [outer, n, inner] view of reduce_cuda.h.
//
// Two layouts, as on the CPU. inner == 1 (reduce the last dim of [rows, n]): a warp per row, lanes
// striding the row so every load is coalesced; long rows with few of them are split into chunks
// whose f32 partials a second pass combines. inner > 1 (sum over leading dims, the bias-gradient
// case): where the rows are whole 16-byte packs and there are enough of them, a thread sums a pack
// of columns down its share of a band of rows (reduce_cols_packed); otherwise a block reads a
// 32-column tile row by row, 8 rows at a time, and the k range is split across blocks when there
// are too few tiles to fill the GPU. Split counts depend on the shape only, so results are the same
// on every run and every GPU.
#include <algorithm>
#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce_cuda.h"

namespace octet::kernels::cuda {
namespace {

// Enough warps (row case) or blocks (column case) to fill an H100 several times over.
constexpr int64_t kTargetWarps = 8192;
constexpr int64_t kTargetBlocks = 1024;
// A warp sums at least this many elements of a row before the row is split further.
constexpr int64_t kMinChunk = 2048;
// Column case: a block is 32 columns × kColRows threads.
constexpr int kColRows = 8;
// Rows up to this long are done by one warp; longer ones by one block of kRowBlock threads.
constexpr int64_t kWarpRowMax = 1024;
constexpr int kRowBlock = 512;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---- reduction ops (f32) ---------------------------------------------------------------------------
struct SumOp {
  __device__ float identity() const { return 0.f; }
  __device__ float prepare(float x) const { return x; }
  __device__ float combine(float a, float b) const { return a + b; }
};
struct AbsMaxOp {  // NaN propagates (fmaxf alone would drop it)
  __device__ float identity() const { return 0.f; }
  __device__ float prepare(float x) const { return fabsf(x); }
  __device__ float combine(float a, float b) const { return isnan(a) ? a : (isnan(b) ? b : fmaxf(a, b)); }
};

template <class Op>
__device__ __forceinline__ float warp_reduce(float v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op.combine(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// out[s] = reduce(a[row, chunk c of the row]) / divisor for each segment s = row·chunks + c, one warp
// per segment. Reads rows·n elements once, writes one value per segment.
template <class T, class OutT, class Op>
__global__ void reduce_rows(const T* a, OutT* out, int64_t segments, int64_t n, int64_t chunk, int64_t chunks,
                            float divisor, Op op) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  for (int64_t s = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; s < segments; s += warps) {
    const int64_t begin = (s % chunks) * chunk, end = min(n, begin + chunk);
    const T* row = a + (s / chunks) * n;
    float acc = op.identity();
    for (int64_t k = begin + lane; k < end; k += 32) acc = op.combine(acc, op.prepare(to_float(row[k])));
    acc = warp_reduce(acc, op);
    if (lane == 0) out[s] = from_float<OutT>(acc / divisor);
  }
}

// out[(split·outer + o)·inner + i] = reduce over k in the split's range of a[o, k, i], / divisor.
// Block (32, kColRows); grid (outer·col_tiles, splits). Reads outer·n·inner elements once.
template <class T, class OutT, class Op>
__global__ void reduce_cols(const T* a, OutT* out, int64_t outer, int64_t n, int64_t inner, int64_t col_tiles,
                            int64_t k_chunk, float divisor, Op op) {
  __shared__ float partial[kColRows][33];
  const int64_t o = blockIdx.x / col_tiles;
  const int64_t i = (blockIdx.x % col_tiles) * 32 + threadIdx.x;
  const int64_t k0 = blockIdx.y * k_chunk, k1 = min(n, k0 + k_chunk);
  float acc = op.identity();
  if (i < inner) {
    const T* p = a + o * n * inner + i;
    for (int64_t k = k0 + threadIdx.y; k < k1; k += kColRows) acc = op.combine(acc, op.prepare(to_float(p[k * inner])));
  }
  partial[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && i < inner) {
    float r = partial[0][threadIdx.x];
#pragma unroll
    for (int j = 1; j < kColRows; ++j) r = op.combine(r, partial[j][threadIdx.x]);
    out[(blockIdx.y * outer + o) * inner + i] = from_float<OutT>(r / divisor);
  }
}

// ---- columns as 16-byte packs ----------------------------------------------------------------------
// The column case when every row is whole 16-byte packs (inner % N == 0, a 16-byte aligned) and tall
// (n >= kPackMinBandRows): the bias gradient's shape, dbias = Σ over [tokens, width] of dy. The generic
// kernel above reads 2 bytes per thread per row there (a warp: 64 bytes of a row); this one reads 16.
//   - A block is kPackLanes threads across consecutive packs (a warp reads 32 × 16 = 512 contiguous
//     bytes of a row) by kPackWarps warps down the rows of its band: warp w takes the band's rows
//     w, w + 8, ..., kPackUnroll rows' loads in flight per thread before it adds any. The 8 warps read
//     8 consecutive rows at a time, so the block walks its band front to back.
//   - Each thread keeps its N columns' f32 sums in registers, its rows added in order; at the end the
//     block adds its warps' sums in warp order through shared memory and writes one f32 per column
//     (the result, or the band's partial).
//   - Bands: as many as fill about kPackTargetBlocks blocks, each at least kPackMinBandRows rows: a
//     function of the shape alone (same bits on every run and GPU). With more than one band a second
//     pass (reduce over the partials) adds the bands in a fixed order.
// ViT-H's bias gradients at batch 64 (12,608 rows, bf16): 1280 wide, 5 column groups × 98 bands of
// 129 rows (490 blocks, 16 rows a thread); 3840 wide, 15 × 36 of 351 (540 blocks).
constexpr int kPackLanes = 32, kPackWarps = 8, kPackUnroll = 8;
constexpr int64_t kPackTargetBlocks = 528;  // 4 blocks of 256 threads on each of an H100's 132 SMs
constexpr int64_t kPackMinBandRows = 128;

// out[(band·outer + o)·inner + c] = reduce over the band's rows k of a[o, k, c], / divisor.
// Block kPackLanes·kPackWarps threads; grid (outer·col_groups, bands). Reads outer·n·inner elements
// once, writes one value per column per band.
template <class T, class OutT, class Op>
__global__ void __launch_bounds__(kPackLanes* kPackWarps, 4)
    reduce_cols_packed(const T* __restrict__ a, OutT* __restrict__ out, int64_t outer, int64_t n, int64_t inner,
                       int64_t col_groups, int64_t band_rows, float divisor, Op op) {
  constexpr int N = Pack<T>::N;
  __shared__ float sums[kPackWarps][kPackLanes * N];
  const int lane = threadIdx.x % kPackLanes, warp = threadIdx.x / kPackLanes;
  const int64_t o = blockIdx.x / col_groups;
  const int64_t c0 = (blockIdx.x % col_groups) * (kPackLanes * N);  // the block's first column
  const int64_t c = c0 + int64_t{lane} * N;                          // the thread's first column
  const int64_t r0 = int64_t{blockIdx.y} * band_rows, r1 = min(n, r0 + band_rows);
  float acc[N];
#pragma unroll
  for (int k = 0; k < N; ++k) acc[k] = op.identity();
  if (c < inner) {
    const T* p = a + o * n * inner + c;
    int64_t r = r0 + warp;
    for (; r + (kPackUnroll - 1) * kPackWarps < r1; r += kPackUnroll * kPackWarps) {
      Pack<T> v[kPackUnroll];
#pragma unroll
      for (int u = 0; u < kPackUnroll; ++u) v[u] = load_pack(p + (r + u * kPackWarps) * inner);
#pragma unroll
      for (int u = 0; u < kPackUnroll; ++u) {
#pragma unroll
        for (int k = 0; k < N; ++k) acc[k] = op.combine(acc[k], op.prepare(to_float(v[u].v[k])));
      }
    }
    for (; r < r1; r += kPackWarps) {
      const Pack<T> v = load_pack(p + r * inner);
#pragma unroll
      for (int k = 0; k < N; ++k) acc[k] = op.combine(acc[k], op.prepare(to_float(v.v[k])));
    }
  }
#pragma unroll
  for (int k = 0; k < N; ++k) sums[warp][lane * N + k] = acc[k];
  __syncthreads();
  for (int j = threadIdx.x; j < kPackLanes * N; j += blockDim.x) {
    if (c0 + j >= inner) break;
    float r = sums[0][j];
#pragma unroll
    for (int w = 1; w < kPackWarps; ++w) r = op.combine(r, sums[w][j]);
    out[(blockIdx.y * outer + o) * inner + c0 + j] = from_float<OutT>(r / divisor);
  }
}

// Whether reduce() takes reduce_cols_packed for this slice geometry and pointer.
template <class T>
bool packed_columns(const T* a, int64_t n, int64_t inner) {
  return inner > 1 && inner % Pack<T>::N == 0 && n >= kPackMinBandRows && aligned16(a);
}

// Launches the reduction of a (storage T) into out (storage OutT, outer·inner values), with a
// second pass over f32 partials when the work is split.
template <class T, class OutT, class Op>
void reduce(const T* a, OutT* out, int64_t outer, int64_t n, int64_t inner, float divisor, Op op,
            const Tensor& like, cudaStream_t stream) {
  if (outer * inner == 0) return;
  if (inner == 1) {
    int64_t chunk = n;
    if (outer < kTargetWarps && n > kMinChunk) {
      chunk = std::max(kMinChunk, ceil_div(n, ceil_div(kTargetWarps, outer)));
    }
    const int64_t chunks = std::max<int64_t>(1, ceil_div(n, std::max<int64_t>(chunk, 1)));
    chunk = std::max<int64_t>(chunk, 1);
    const int64_t segments = outer * chunks;
    if (chunks == 1) {
      reduce_rows<T, OutT, Op><<<blocks_for(segments * 32), kThreads, 0, stream>>>(a, out, segments, n, chunk, 1,
                                                                                   divisor, op);
      return;
    }
    Tensor partial = empty({segments}, DType::f32, like.device());
    reduce_rows<T, float, Op><<<blocks_for(segments * 32), kThreads, 0, stream>>>(a, ptr<float>(partial), segments,
                                                                                  n, chunk, chunks, 1.f, op);
    reduce<float, OutT>(ptr<float>(partial), out, outer, chunks, 1, divisor, op, like, stream);
    return;
  }
  if (packed_columns(a, n, inner)) {
    // Bytes: reads the slice once, writes 4 per column per band (then the second pass reads them).
    // ViT-H's 12,608 × 1280 bf16 bias gradient: 32.3 MB + 2 × 0.5 MB, 7.7 µs at 4.3 TB/s (cuBLASLt's
    // BGRADB kernel took 14.2 µs on an H200); 12,608 × 3840: 96.8 MB + 2 × 0.6 MB, 22.8 µs (39.9).
    const int64_t col_groups = ceil_div(inner, int64_t{kPackLanes} * Pack<T>::N), groups = outer * col_groups;
    OCTET_CHECK(groups < INT_MAX, "reduce: ", like.describe(), " has too many columns for one launch");
    int64_t bands = std::min(ceil_div(kPackTargetBlocks, groups), n / kPackMinBandRows);
    bands = std::clamp<int64_t>(bands, 1, 65535);
    const int64_t band_rows = ceil_div(n, bands);
    bands = ceil_div(n, band_rows);
    const dim3 grid(static_cast<unsigned>(groups), static_cast<unsigned>(bands));
    constexpr int threads = kPackLanes * kPackWarps;
    if (bands == 1) {
      reduce_cols_packed<T, OutT, Op>
          <<<grid, threads, 0, stream>>>(a, out, outer, n, inner, col_groups, band_rows, divisor, op);
      return;
    }
    Tensor partial = empty({bands * outer * inner}, DType::f32, like.device());
    reduce_cols_packed<T, float, Op>
        <<<grid, threads, 0, stream>>>(a, ptr<float>(partial), outer, n, inner, col_groups, band_rows, 1.f, op);
    reduce<float, OutT>(ptr<float>(partial), out, 1, bands, outer * inner, divisor, op, like, stream);
    return;
  }
  const int64_t col_tiles = ceil_div(inner, 32);
  const int64_t tiles = outer * col_tiles;
  int64_t splits = std::min(ceil_div(kTargetBlocks, tiles), ceil_div(n, 256));
  splits = std::clamp<int64_t>(splits, 1, 65535);
  const int64_t k_chunk = std::max<int64_t>(1, ceil_div(n, splits));
  splits = std::max<int64_t>(1, ceil_div(n, k_chunk));
  OCTET_CHECK(tiles < INT_MAX, "reduce: ", like.describe(), " has too many columns for one launch");
  const dim3 block(32, kColRows), grid(static_cast<unsigned>(tiles), static_cast<unsigned>(splits));
  if (splits == 1) {
    reduce_cols<T, OutT, Op><<<grid, block, 0, stream>>>(a, out, outer, n, inner, col_tiles, k_chunk, divisor, op);
    return;
  }
  Tensor partial = empty({splits * outer * inner}, DType::f32, like.device());
  reduce_cols<T, float, Op><<<grid, block, 0, stream>>>(a, ptr<float>(partial), outer, n, inner, col_tiles, k_chunk,
                                                        1.f, op);
  reduce<float, OutT>(ptr<float>(partial), out, 1, splits, outer * inner, divisor, op, like, stream);
}

// ---- max with indices ----------------------------------------------------------------------------
// Whether (v, i) should replace (best, at): larger, or equal and earlier, or the earliest NaN. The
// order is total, so any reduction tree finds the first maximum as the CPU's scan does.
__device__ __forceinline__ bool better(float v, int64_t i, float best, int64_t at) {
  if (isnan(v)) return !isnan(best) || i < at;
  if (isnan(best)) return false;
  return v > best || (v == best && i < at);
}

__device__ __forceinline__ void warp_best(float& v, int64_t& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) v = ov, i = oi;
  }
}

// values/indices[r] = the first maximum of row r, one group of G threads (a warp, or the whole
// block) per row. Reads rows·n elements once.
template <class T, int G>
__global__ void max_rows(const T* a, T* values, int64_t* indices, int64_t rows, int64_t n) {
  __shared__ float scratch_v[32];
  __shared__ int64_t scratch_i[32];
  const int t = threadIdx.x % G;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * (blockDim.x / G);
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / G; r < rows; r += groups) {
    const T* row = a + r * n;
    float v = -INFINITY;
    int64_t at = LLONG_MAX;
    for (int64_t k = t; k < n; k += G) {
      const float x = to_float(row[k]);
      if (better(x, k, v, at)) v = x, at = k;
    }
    warp_best(v, at);
    if constexpr (G > 32) {
      const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
      __syncthreads();  // the previous row's readers are done with scratch
      if (lane == 0) scratch_v[warp] = v, scratch_i[warp] = at;
      __syncthreads();
      v = lane < G / 32 ? scratch_v[lane] : -INFINITY;
      at = lane < G / 32 ? scratch_i[lane] : LLONG_MAX;
      warp_best(v, at);
    }
    if (t == 0) {
      values[r] = from_float<T>(v);  // exact: v is one of the inputs
      indices[r] = at;
    }
  }
}

// The same over the middle dim when inner > 1: one thread per (o, i), scanning k in order so the
// first maximum wins. Reads outer·n·inner elements, coalesced across i.
template <class T>
__global__ void max_cols(const T* a, T* values, int64_t* indices, int64_t outer, int64_t n, int64_t inner) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < outer * inner; c += stride) {
    const T* p = a + (c / inner) * n * inner + c % inner;
    float v = to_float(p[0]);
    int64_t at = 0;
    for (int64_t k = 1; k < n; ++k) {
      const float x = to_float(p[k * inner]);
      if (better(x, k, v, at)) v = x, at = k;
    }
    values[c] = from_float<T>(v);
    indices[c] = at;
  }
}

// ---- softmax -------------------------------------------------------------------------------------------
// Rows of n <= 32·kPerLane: one warp per row holding the row in registers, so the row is read once
// and written once (2·rows·n elements moved).
template <class T, int kPerLane>
__global__ void softmax_warp(const T* x, T* y, int64_t rows, int n, bool log) {
  const int lane = threadIdx.x % 32;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (row >= rows) return;  // whole warps leave together
  const T* px = x + row * n;
  T* py = y + row * n;
  float v[kPerLane];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int k = lane + 32 * j;
    v[j] = k < n ? to_float(px[k]) : -INFINITY;
    m = fmaxf(m, v[j]);
  }
  m = warp_max(m);
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    if (lane + 32 * j < n) {
      const float e = expf(v[j] - m);
      s += e;
      if (!log) v[j] = e;
    }
  }
  s = warp_sum(s);
  const float log_s = log ? logf(s) : 0.f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int k = lane + 32 * j;
    if (k < n) py[k] = from_float<T>(log ? v[j] - m - log_s : v[j] / s);
  }
}

// Longer rows: one block per row, three passes over the row (max, sum, write); the re-reads mostly
// hit L2. Moves 4·rows·n elements at worst.
template <class T>
__global__ void softmax_block(const T* x, T* y, int64_t rows, int64_t n, bool log) {
  __shared__ float scratch[32];
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* px = x + row * n;
    T* py = y + row * n;
    float m = -INFINITY;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) m = fmaxf(m, to_float(px[k]));
    m = block_max(m, scratch);
    float s = 0.f;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) s += expf(to_float(px[k]) - m);
    s = block_sum(s, scratch);
    const float log_s = logf(s);
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
      const float d = to_float(px[k]) - m;
      py[k] = from_float<T>(log ? d - log_s : expf(d) / s);
    }
  }
}

// Softmax along a middle dim (inner > 1): one thread per (o, i), three strided passes, coalesced
// across i. Moves 4·outer·n·inner elements at worst.
template <class T>
__global__ void softmax_cols(const T* x, T* y, int64_t outer, int64_t n, int64_t inner, bool log) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < outer * inner; c += stride) {
    const int64_t base = (c / inner) * n * inner + c % inner;
    const T* px = x + base;
    T* py = y + base;
    float m = -INFINITY;
    for (int64_t k = 0; k < n; ++k) m = fmaxf(m, to_float(px[k * inner]));
    float s = 0.f;
    for (int64_t k = 0; k < n; ++k) s += expf(to_float(px[k * inner]) - m);
    const float log_s = logf(s);
    for (int64_t k = 0; k < n; ++k) {
      const float d = to_float(px[k * inner]) - m;
      py[k * inner] = from_float<T>(log ? d - log_s : expf(d) / s);
    }
  }
}

// softmax:      dx = y·(dy − Σ dy·y)
// log_softmax:  dx = dy − exp(y)·Σ dy
__device__ __forceinline__ float softmax_grad_term(float y, float dy, bool log) { return log ? dy : __fmul_rn(dy, y); }
__device__ __forceinline__ float softmax_grad(float y, float dy, float s, bool log) {
  return log ? __fsub_rn(dy, __fmul_rn(expf(y), s)) : __fmul_rn(y, __fsub_rn(dy, s));
}

// Rows (inner == 1), one group of G threads per row, two passes over y and dy. Moves 5·rows·n
// elements at worst (the second reads mostly hit L2).
template <class T, int G>
__global__ void softmax_backward_rows(const T* y, const T* dy, T* dx, int64_t rows, int64_t n, bool log) {
  __shared__ float scratch[32];
  const int t = threadIdx.x % G;
  const int64_t groups = static_cast<int64_t>(gridDim.x) * (blockDim.x / G);
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / G; r < rows; r += groups) {
    const T *py = y + r * n, *pdy = dy + r * n;
    T* pdx = dx + r * n;
    float s = 0.f;
    for (int64_t k = t; k < n; k += G) s += softmax_grad_term(to_float(py[k]), to_float(pdy[k]), log);
    if constexpr (G == 32) s = warp_sum(s);
    else s = block_sum(s, scratch);
    for (int64_t k = t; k < n; k += G) pdx[k] = from_float<T>(softmax_grad(to_float(py[k]), to_float(pdy[k]), s, log));
  }
}

// Middle dim (inner > 1): one thread per (o, i). Moves 5·outer·n·inner elements at worst.
template <class T>
__global__ void softmax_backward_cols(const T* y, const T* dy, T* dx, int64_t outer, int64_t n, int64_t inner,
                                      bool log) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < outer * inner; c += stride) {
    const int64_t base = (c / inner) * n * inner + c % inner;
    float s = 0.f;
    for (int64_t k = 0; k < n; ++k) s += softmax_grad_term(to_float(y[base + k * inner]), to_float(dy[base + k * inner]), log);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = base + k * inner;
      dx[i] = from_float<T>(softmax_grad(to_float(y[i]), to_float(dy[i]), s, log));
    }
  }
}

template <class T>
void launch_softmax_warp(const T* x, T* y, int64_t rows, int n, bool log, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(ceil_div(rows, kThreads / 32));
  const int per_lane = static_cast<int>(ceil_div(n, 32));
  if (per_lane <= 1) softmax_warp<T, 1><<<blocks, kThreads, 0, stream>>>(x, y, rows, n, log);
  else if (per_lane <= 2) softmax_warp<T, 2><<<blocks, kThreads, 0, stream>>>(x, y, rows, n, log);
  else if (per_lane <= 4) softmax_warp<T, 4><<<blocks, kThreads, 0, stream>>>(x, y, rows, n, log);
  else if (per_lane <= 8) softmax_warp<T, 8><<<blocks, kThreads, 0, stream>>>(x, y, rows, n, log);
  else if (per_lane <= 16) softmax_warp<T, 16><<<blocks, kThreads, 0, stream>>>(x, y, rows, n, log);
  else softmax_warp<T, 32><<<blocks, kThreads, 0, stream>>>(x, y, rows, n, log);
}

// The storage dtype a kernel reads: e4m3/e5m2 inputs are widened to f32 first, as the CPU does.
Tensor kernel_input(const Tensor& a) { return is_fp8(a.dtype()) ? a.detach().to(DType::f32) : a; }

}  // namespace

Tensor sum(const Tensor& a_in, int64_t outer, int64_t n, int64_t inner, float divisor, DType out_dtype,
           const char* op) {
  // The kernels write f32, bf16 and f16: an FP8 or f64 result is the f32 sums converted.
  if (is_fp8(out_dtype) || out_dtype == DType::f64) {
    return sum(a_in, outer, n, inner, divisor, DType::f32, op).to(out_dtype);
  }
  const Tensor a = kernel_input(a_in);
  Tensor out = empty({outer * inner}, out_dtype, a.device());
  if (outer * inner == 0) return out;
  if (n == 0) return out.fill_(0.0 / divisor);  // as on the CPU: 0 for a sum, NaN for a mean
  dispatch_floating(a.dtype(), op, [&]<class T>() {
    dispatch_floating(out_dtype, op, [&]<class OutT>() {
      reduce<T, OutT>(ptr<T>(a), ptr<OutT>(out), outer, n, inner, divisor, SumOp{}, a, stream_for(a));
    });
  });
  check_launch(op);
  return out;
}

Tensor amax(const Tensor& a_in, int64_t outer, int64_t n, int64_t inner) {
  const Tensor a = kernel_input(a_in);
  Tensor out = empty({outer * inner}, DType::f32, a.device());
  if (outer * inner == 0) return out;
  if (n == 0) return out.zero_();
  dispatch_floating(a.dtype(), "amax", [&]<class T>() {
    reduce<T, float>(ptr<T>(a), ptr<float>(out), outer, n, inner, 1.f, AbsMaxOp{}, a, stream_for(a));
  });
  check_launch("amax");
  return out;
}

void max(const Tensor& a_in, int64_t outer, int64_t n, int64_t inner, Tensor& values, Tensor& indices) {
  const Tensor a = kernel_input(a_in);
  Tensor v = empty({outer * inner}, a.dtype(), a.device());
  indices = empty({outer * inner}, DType::i64, a.device());
  if (outer * inner > 0) {
    dispatch_floating(a.dtype(), "max", [&]<class T>() {
      cudaStream_t stream = stream_for(a);
      if (inner > 1) {
        max_cols<T><<<blocks_for(outer * inner), kThreads, 0, stream>>>(ptr<T>(a), ptr<T>(v), ptr<int64_t>(indices),
                                                                       outer, n, inner);
      } else if (n <= kWarpRowMax) {
        max_rows<T, 32><<<blocks_for(outer * 32), kThreads, 0, stream>>>(ptr<T>(a), ptr<T>(v), ptr<int64_t>(indices),
                                                                        outer, n);
      } else {
        max_rows<T, kRowBlock><<<blocks_for(outer * kRowBlock, kRowBlock), kRowBlock, 0, stream>>>(
            ptr<T>(a), ptr<T>(v), ptr<int64_t>(indices), outer, n);
      }
    });
    check_launch("max");
  }
  values = v.to(a_in.dtype());  // exact: the maximum is one of the inputs
}

Tensor softmax(const Tensor& a_in, int64_t outer, int64_t n, int64_t inner, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  if (is_fp8(a_in.dtype())) return softmax(a_in.detach().to(DType::f32), outer, n, inner, log).to(a_in.dtype());
  const Tensor& a = a_in;
  Tensor out = empty(a.shape(), a.dtype(), a.device());
  if (a.numel() == 0) return out;
  dispatch_floating(a.dtype(), op, [&]<class T>() {
    cudaStream_t stream = stream_for(a);
    if (inner > 1) {
      softmax_cols<T><<<blocks_for(outer * inner), kThreads, 0, stream>>>(ptr<T>(a), ptr<T>(out), outer, n, inner, log);
    } else if (n <= kWarpRowMax) {
      launch_softmax_warp<T>(ptr<T>(a), ptr<T>(out), outer, static_cast<int>(n), log, stream);
    } else {
      softmax_block<T><<<blocks_for(outer * kRowBlock, kRowBlock), kRowBlock, 0, stream>>>(ptr<T>(a), ptr<T>(out),
                                                                                          outer, n, log);
    }
  });
  check_launch(op);
  return out;
}

Tensor softmax_backward(const Tensor& y_in, const Tensor& dy_in, int64_t outer, int64_t n, int64_t inner, bool log) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  if (is_fp8(y_in.dtype())) {
    return softmax_backward(y_in.detach().to(DType::f32), dy_in.detach().to(DType::f32), outer, n, inner, log)
        .to(y_in.dtype());
  }
  const Tensor &y = y_in, &dy = dy_in;
  Tensor dx = empty(y.shape(), y.dtype(), y.device());
  if (y.numel() == 0) return dx;
  dispatch_floating(y.dtype(), op, [&]<class T>() {
    cudaStream_t stream = stream_for(y);
    if (inner > 1) {
      softmax_backward_cols<T><<<blocks_for(outer * inner), kThreads, 0, stream>>>(ptr<T>(y), ptr<T>(dy), ptr<T>(dx),
                                                                                  outer, n, inner, log);
    } else if (n <= kWarpRowMax) {
      softmax_backward_rows<T, 32><<<blocks_for(outer * 32), kThreads, 0, stream>>>(ptr<T>(y), ptr<T>(dy), ptr<T>(dx),
                                                                                   outer, n, log);
    } else {
      softmax_backward_rows<T, kRowBlock><<<blocks_for(outer * kRowBlock, kRowBlock), kRowBlock, 0, stream>>>(
          ptr<T>(y), ptr<T>(dy), ptr<T>(dx), outer, n, log);
    }
  });
  check_launch(op);
  return dx;
}

}  // namespace octet::kernels::cuda
