// LayerNorm over the last dim, on the GPU. The formulas are the CPU kernel's
// (kernels/cpu/layernorm.cpp): mean from x - x[0] (so a row far from zero keeps its precision), a
// second pass for Σ (x - mean)², rstd = 1 / sqrt(var + eps); backward
//   dx = rstd · (g - mean(g) - xhat · mean(g · xhat)),  g = dy · weight,
//   dweight = Σ_rows dy · xhat,  dbias = Σ_rows dy.
// Statistics and every sum are f32 whatever x's dtype; weight and bias may have a dtype of their own.
// The forward's row arithmetic is in layernorm_rows.cuh, which the LayerNorm writing FP8
// (layernorm_fp8.cu) runs too, so that its statistics and outputs have this kernel's bits.
//
// These kernels move little data per FLOP, so their speed is the bytes they move: each is built to
// read its inputs from DRAM once and write its outputs once, with 16-byte accesses, and enough of
// them in flight to keep HBM busy. Beside each launch: the bytes it must move for ViT-H at batch 64
// (12,608 rows of C = 1280, bf16) and the time that takes at 4.3 TB/s, a device-to-device copy's
// rate on an H200.
//
// Forward: a warp per row, the row in registers (layernorm_rows.cuh describes the layout), while
// C <= 2048 (bf16/f16) or 1024 (f32). The warp loads its row with every load in flight at once, sums
// it, sums the squares from the same registers, and writes the output: x is read once, y written
// once. Blocks of 4 independent warps, one row each; at 64 registers a thread an SM holds 32 such
// warps, each with its whole row in flight (2.5 KB for ViT-H in bf16): far more than HBM's latency
// needs. Longer rows take a block per row (the old kernel: the row is read three times, the second
// and third from L1/L2).
//
// Backward: also a warp per row with the row in registers (C <= 1536 bf16/f16, 768 f32). A warp
// loads dy and x (and the residual gradient), sums g and g · xhat, and writes dx, reading each once.
// dweight and dbias are summed in the same pass: each warp takes a fixed set of rows and adds
// dy · xhat and dy into its own f32 slots in shared memory (its lanes own the same columns in every
// row, so there are no atomics and no races); at the end the block adds its warps' slots in warp
// order and writes one partial row per block, and a small second kernel sums the blocks' partials in
// a fixed order. The rows each warp takes depend on `rows` only, so the results repeat bit for bit
// on any GPU. Longer rows take the old kernel: a block walks a run of rows, its threads across the
// columns, and reads each row twice (the second time from L1/L2).
//
// At ViT-H's 12,608 rows that is 264 blocks, two an SM, 6 rows a warp, each warp loading a row,
// computing it and writing it, then the next: 0.62 of a copy on an H200 (2026-11-28; 25% occupancy,
// its warps mostly waiting on their loads). A second design, one block an SM whose warps loaded row
// k + 1 while computing row k (255 registers, 12.5% occupancy), ran at 0.34 on the same GPU, and
// was removed: fewer warps with more rows each in flight lost to more warps.
// Two more were tried and timed slower on an H200 (2026-11-29, ViT-H's backward), so they are gone
// too: a refill, each unit's registers taking row k + 1's dy and x as soon as row k's dx for the unit
// was written (five units a lane, 28 bytes of spill; 57.8 µs against this kernel's 49.1, the spills
// and the reads among the writes the likely cause); and a column design, a block per run of rows
// whose threads each kept one 16-byte pack of columns and its dweight and dbias sums in registers
// (65.2 µs against 60.4 with the residual gradient, 59.2 against 49.1 without).
//
// The residual add fused in (add_layernorm_*, as llm.c fuses it): forward reads x and y instead of x,
// computes h = x + y rounded to T exactly as the add kernel rounds it (__fadd_rn, then round to nearest
// even), writes it, and normalizes that rounded h. Backward adds the residual gradient to each dx in
// f32 with __fadd_rn (never merged into an FMA with the LayerNorm arithmetic) before the one rounding.
// In f32 on aligned rows the results therefore equal add() then layernorm_forward(), and
// layernorm_backward() then add(), bit for bit on the GPU too.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/layernorm_rows.cuh"
#include "kernels/cuda/nn_ops_cuda.h"

namespace octet::kernels::cuda {
namespace {

constexpr int kForwardWarps = 4;  // rows per block of the warp-per-row forward
// The warp-per-row backward: rows up to 32 · kBackwardRowUnits units in registers (dy, x and the
// residual gradient take 72 registers a thread; ptxas gives the kernel at most the 128 that two
// blocks of 8 warps an SM allow), and 2 · C floats of shared slots per warp (10 KiB for ViT-H).
constexpr int kBackwardRowUnits = 6;
constexpr int kBackwardWarps = 8;
// Its grid: about this many blocks, whatever the row count, so that every block takes several rows
// per warp and the partials stay small (264 = two blocks on each of an H100's or H200's 132 SMs, all
// resident at once). A constant, not the device's SM count: the row split, and so the sums' bits,
// depend on `rows` only.
constexpr int64_t kBackwardTargetBlocks = 264;
// At most this many blocks for the block-per-row backward (long rows).
constexpr int64_t kMaxBackwardBlocks = 512;
// Per-block partial sums of the block-per-row backward live in shared memory up to this size (under
// the 48 KiB a block gets without opting in, with room for the static scratch), in global memory beyond.
constexpr size_t kMaxSharedPartialBytes = 40 * 1024;
constexpr size_t kDefaultSharedBytes = 48 * 1024;  // dynamic shared memory beyond this needs an opt-in

// Sums two floats across the block; every thread gets both totals. scratch: __shared__ float[64].
__device__ __forceinline__ float2 block_sum2(float a, float b, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  a = warp_sum(a);
  b = warp_sum(b);
  __syncthreads();  // scratch may still be read by the previous row
  if (lane == 0) {
    scratch[warp] = a;
    scratch[32 + warp] = b;
  }
  __syncthreads();
  a = lane < warps ? scratch[lane] : 0.f;
  b = lane < warps ? scratch[32 + lane] : 0.f;
  return make_float2(warp_sum(a), warp_sum(b));
}

// ---- forward --------------------------------------------------------------------------------------

// y = (x - mean) · rstd · weight + bias for row blockIdx.x · kForwardWarps + warp; mean and rstd saved
// (f32). With kResidual the row normalized is h = x + x2 (rounded to T), which the kernel also writes
// out; without it x2 and h are null. rows_packed: x, x2, h and y 16-byte aligned and C a multiple of
// the pack; params_packed: layernorm_params_packed for weight and bias.
template <class T, class W, bool kResidual>
__global__ void __launch_bounds__(kForwardWarps * 32)
    layernorm_forward_rows_kernel(const T* __restrict__ x, const T* __restrict__ x2, T* __restrict__ h,
                                  const W* __restrict__ weight, const W* __restrict__ bias, T* __restrict__ y,
                                  float* __restrict__ mean, float* __restrict__ rstd, int64_t rows, int C, float eps,
                                  bool rows_packed, bool params_packed) {
  constexpr int N = Pack<T>::N;
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t{blockIdx.x} * kForwardWarps + threadIdx.x / 32;
  if (row >= rows) return;  // the whole warp leaves together; nothing here synchronises the block
  const int64_t offset = row * C;
  Unit u[kLayerNormRowUnits];
  if constexpr (kResidual) {
    load_row_units_residual(x + offset, x2 + offset, h + offset, C, lane, rows_packed, u);
  } else {
    load_row_units(x + offset, C, lane, rows_packed, u);
  }
  const RowStats s = warp_row_stats<T>(u, C, lane, eps);
#pragma unroll
  for (int i = 0; i < kLayerNormRowUnits; ++i) {
    const int c0 = unit_column<T>(i, lane);
    if (c0 >= C) continue;
    float v[N];
    layernorm_unit<T>(u[i], s, weight, bias, c0, C, params_packed, v);
    Unit o{};
#pragma unroll
    for (int k = 0; k < N; ++k) put_unit_bits<T>(o, k, bits_of(from_float<T>(v[k])));
    store_unit(y + offset, c0, C, rows_packed, o);
  }
  if (lane == 0) {
    mean[row] = s.mean;
    rstd[row] = s.rstd;
  }
}

// The same for rows too long for registers: a block per row (blockIdx.x), the row read three times
// (sum, squares, output; the second and third from L1/L2). vectorized: 16-byte packs, under the
// condition of rows_packed above.
template <class T, class W, bool kResidual>
__global__ void __launch_bounds__(1024)
    layernorm_forward_block_kernel(const T* __restrict__ x, const T* __restrict__ x2, T* __restrict__ h,
                                   const W* __restrict__ weight, const W* __restrict__ bias, T* __restrict__ y,
                                   float* __restrict__ mean, float* __restrict__ rstd, int64_t C, float eps,
                                   bool vectorized) {
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int lane = threadIdx.x, lanes = blockDim.x;
  auto row_sum = [&](float v) { return block_sum(v, scratch); };
  const T* xr = x + row * C;
  T* hr = kResidual ? h + row * C : nullptr;
  const T* x2r = kResidual ? x2 + row * C : nullptr;
  const RowStats s = layernorm_row_stats<kResidual>(xr, x2r, hr, C, eps, lane, lanes, vectorized, row_sum);
  // The third pass reads the row normalized: x, or h as this thread wrote it.
  const T* src = kResidual ? hr : xr;
  T* yr = y + row * C;
  if (vectorized) {
    constexpr int N = Pack<T>::N;
    for (int64_t c = int64_t{lane} * N; c < C; c += int64_t{lanes} * N) {
      const Pack<T> p = load_pack(src + c);
      Pack<T> o;
#pragma unroll
      for (int k = 0; k < N; ++k) o.v[k] = from_float<T>(layernorm_element(to_float(p.v[k]), s, weight, bias, c + k));
      store_pack(yr + c, o);
    }
  } else {
    for (int64_t c = lane; c < C; c += lanes) {
      yr[c] = from_float<T>(layernorm_element(to_float(src[c]), s, weight, bias, c));
    }
  }
  if (lane == 0) {
    mean[row] = s.mean;
    rstd[row] = s.rstd;
  }
}

// ---- backward -------------------------------------------------------------------------------------

// The warp-per-row backward, one row: dy, x and (with kResidual) the residual gradient as the warp
// holds them (load_row_units' layout), and the row's statistics.
struct BackwardRow {
  Unit d[kBackwardRowUnits], xs[kBackwardRowUnits], dr[kBackwardRowUnits];
  float m, rs;
};

// Issues the loads of row r, unit by unit dy and x (and with kResidual the residual gradient), and its
// statistics. Nothing here uses them, so they complete while the warp goes on.
template <class T, bool kResidual>
__device__ __forceinline__ void load_backward_row(const T* __restrict__ dy, const T* __restrict__ dresidual,
                                                  const T* __restrict__ x, const float* __restrict__ mean,
                                                  const float* __restrict__ rstd, int64_t r, int C, int lane,
                                                  bool rows_packed, BackwardRow& b) {
  const int64_t offset = r * C;
#pragma unroll
  for (int i = 0; i < kBackwardRowUnits; ++i) {
    load_row_unit(dy + offset, C, lane, rows_packed, i, b.d[i]);
    load_row_unit(x + offset, C, lane, rows_packed, i, b.xs[i]);
    if constexpr (kResidual) load_row_unit(dresidual + offset, C, lane, rows_packed, i, b.dr[i]);
  }
  b.m = mean[r];
  b.rs = rstd[r];
}

// dx of one loaded row into dxr, and with weight dy · xhat and dy added into the warp's slots (sw, sb:
// see layernorm_backward_rows_kernel). With kResidual each dx is LayerNorm's input gradient plus
// dresidual, added in f32 and rounded once. Every multiply and add is an _rn intrinsic, so that the
// kernels with and without kResidual compute the same LayerNorm gradient bits
// (CudaAddLayerNorm.EqualsTheUnfusedGpuKernelsBitForBit).
template <class T, class W, bool kResidual>
__device__ __forceinline__ void backward_row(const BackwardRow& b, const W* __restrict__ weight, T* __restrict__ dxr,
                                             int C, int lane, float inv_C, bool rows_packed, bool params_packed,
                                             float4* sw, float4* sb) {
  constexpr int N = Pack<T>::N, Q = N / 4;
  const bool affine = weight != nullptr;
  const float m = b.m, rs = b.rs;

  // Σ g and Σ g · xhat over the row.
  float sum_g = 0.f, sum_g_xhat = 0.f;
#pragma unroll
  for (int i = 0; i < kBackwardRowUnits; ++i) {
    const int c0 = unit_column<T>(i, lane);
    if (c0 >= C) continue;
    float w[N];
    if (affine) load_unit_params<T>(weight, c0, C, params_packed, w);
    for_unit_elements<T>(c0, C, [&](int e) {
      const float dyv = unit_value<T>(b.d[i], e);
      const float g = affine ? __fmul_rn(dyv, w[e]) : dyv;
      const float xhat = __fmul_rn(__fsub_rn(unit_value<T>(b.xs[i], e), m), rs);
      sum_g = __fadd_rn(sum_g, g);
      sum_g_xhat = __fmaf_rn(g, xhat, sum_g_xhat);
    });
  }
  const float mean_g = __fmul_rn(warp_sum(sum_g), inv_C);
  const float mean_g_xhat = __fmul_rn(warp_sum(sum_g_xhat), inv_C);

  // dx, and dy · xhat and dy into the warp's slots.
#pragma unroll
  for (int i = 0; i < kBackwardRowUnits; ++i) {
    const int c0 = unit_column<T>(i, lane);
    if (c0 >= C) continue;
    float w[N], aw[N], ab[N];
    if (affine) {
      load_unit_params<T>(weight, c0, C, params_packed, w);
#pragma unroll
      for (int j = 0; j < Q; ++j) {
        const float4 p = sw[(i * Q + j) * 32 + lane], q = sb[(i * Q + j) * 32 + lane];
        aw[4 * j] = p.x, aw[4 * j + 1] = p.y, aw[4 * j + 2] = p.z, aw[4 * j + 3] = p.w;
        ab[4 * j] = q.x, ab[4 * j + 1] = q.y, ab[4 * j + 2] = q.z, ab[4 * j + 3] = q.w;
      }
    }
    Unit o{};
    for_unit_elements<T>(c0, C, [&](int e) {
      const float dyv = unit_value<T>(b.d[i], e);
      const float g = affine ? __fmul_rn(dyv, w[e]) : dyv;
      const float xhat = __fmul_rn(__fsub_rn(unit_value<T>(b.xs[i], e), m), rs);
      float v = __fmul_rn(rs, __fsub_rn(__fsub_rn(g, mean_g), __fmul_rn(xhat, mean_g_xhat)));
      if constexpr (kResidual) v = __fadd_rn(v, unit_value<T>(b.dr[i], e));
      put_unit_bits<T>(o, e, bits_of(from_float<T>(v)));
      if (affine) {
        aw[e] = __fmaf_rn(dyv, xhat, aw[e]);
        ab[e] = __fadd_rn(ab[e], dyv);
      }
    });
    store_unit(dxr, c0, C, rows_packed, o);
    if (affine) {
#pragma unroll
      for (int j = 0; j < Q; ++j) {
        sw[(i * Q + j) * 32 + lane] = make_float4(aw[4 * j], aw[4 * j + 1], aw[4 * j + 2], aw[4 * j + 3]);
        sb[(i * Q + j) * 32 + lane] = make_float4(ab[4 * j], ab[4 * j + 1], ab[4 * j + 2], ab[4 * j + 3]);
      }
    }
  }
}

// The warps' slots of a block of the register backward, zeroed by the whole block. Per warp:
// [2][units_per_lane][N / 4][32] float4, the dweight sums then the dbias sums of its lanes' columns;
// lane l's float4 j of unit i sits at (i · N/4 + j) · 32 + l, so that a warp's access to one j reads
// 512 contiguous bytes (no bank conflicts). half: the float4s of one warp's dweight (or dbias) sums.
__device__ __forceinline__ void zero_slots(float4* slots, int half) {
  for (int j = threadIdx.x; j < kBackwardWarps * 2 * half; j += blockDim.x) slots[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  __syncthreads();
}

// The block's partial row (partial + blockIdx.x · 2C: C sums of dy · xhat, then C of dy): for each
// column, the warps' slots added in warp order.
template <class T>
__device__ __forceinline__ void write_block_partial(const float4* slots, int half, float* __restrict__ partial,
                                                    int C) {
  constexpr int N = Pack<T>::N, Q = N / 4;
  __syncthreads();
  const float* s = reinterpret_cast<const float*>(slots);
  float* out = partial + int64_t{blockIdx.x} * 2 * C;
  for (int j = threadIdx.x; j < 2 * C; j += blockDim.x) {
    const int which = j < C ? 0 : 1, c = j - which * C;  // which: 0 dweight, 1 dbias
    const int unit = c / N, e = c % N;
    const int at = (which * half + (unit / 32 * Q + e / 4) * 32 + unit % 32) * 4 + e % 4;
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < kBackwardWarps; ++w) total = __fadd_rn(total, s[w * 2 * half * 4 + at]);
    out[j] = total;
  }
}

// dx for the rows of block blockIdx.x: warp w takes rows row0 + w, row0 + w + kBackwardWarps,
// ... (rows_per_warp of them, row0 = blockIdx.x · kBackwardWarps · rows_per_warp), loading each, then
// computing and writing it. With weight, the block's partial dweight and dbias (write_block_partial).
// units_per_lane: the units a lane holds of a row, ceil(C / N / 32), which sizes the shared slots.
template <class T, class W, bool kResidual>
__global__ void __launch_bounds__(kBackwardWarps * 32, 2)
    layernorm_backward_rows_kernel(const T* __restrict__ dy, const T* __restrict__ dresidual,
                                   const T* __restrict__ x, const W* __restrict__ weight,
                                   const float* __restrict__ mean, const float* __restrict__ rstd,
                                   T* __restrict__ dx, float* __restrict__ partial, int64_t rows, int C,
                                   int rows_per_warp, int units_per_lane, bool rows_packed, bool params_packed) {
  extern __shared__ float4 slots[];
  constexpr int Q = Pack<T>::N / 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int half = units_per_lane * Q * 32;
  float4* sw = slots + warp * 2 * half;
  float4* sb = sw + half;
  if (weight != nullptr) zero_slots(slots, half);
  const float inv_C = __fdiv_rn(1.0f, static_cast<float>(C));
  const int64_t row0 = int64_t{blockIdx.x} * kBackwardWarps * rows_per_warp;
  for (int k = 0; k < rows_per_warp; ++k) {
    const int64_t r = row0 + int64_t{k} * kBackwardWarps + warp;
    if (r >= rows) break;  // uniform across the warp
    BackwardRow b;
    load_backward_row<T, kResidual>(dy, dresidual, x, mean, rstd, r, C, lane, rows_packed, b);
    backward_row<T, W, kResidual>(b, weight, dx + r * C, C, lane, inv_C, rows_packed, params_packed, sw, sb);
  }
  if (weight != nullptr) write_block_partial<T>(slots, half, partial, C);
}

// The backward for rows too long for registers: dx for rows [blockIdx.x · rows_per_block, ...), and
// with weight the block's partial dweight, dbias as above. With dresidual (else null) each dx is
// LayerNorm's input gradient plus dresidual, added in f32 and rounded once.
// Reads dy and x twice each (the second time from L1/L2), and dresidual once.
template <class T, class W>
__global__ void __launch_bounds__(512)
    layernorm_backward_block_kernel(const T* __restrict__ dy, const T* __restrict__ dresidual,
                                    const T* __restrict__ x, const W* __restrict__ weight,
                                    const float* __restrict__ mean, const float* __restrict__ rstd,
                                    T* __restrict__ dx, float* __restrict__ partial, int64_t rows, int64_t C,
                                    int64_t rows_per_block, bool vectorized, bool partial_in_shared) {
  extern __shared__ float shared_partial[];
  __shared__ float scratch[64];
  const int tid = threadIdx.x, lanes = blockDim.x;
  float* pw = nullptr;
  if (weight) pw = partial_in_shared ? shared_partial : partial + int64_t{blockIdx.x} * 2 * C;
  float* pb = pw ? pw + C : nullptr;
  if (pw) {
    for (int64_t c = tid; c < 2 * C; c += lanes) pw[c] = 0.f;
    __syncthreads();
  }
  const float inv_C = 1.0f / static_cast<float>(C);
  const int64_t row_end = min(rows, (int64_t{blockIdx.x} + 1) * rows_per_block);

  for (int64_t r = int64_t{blockIdx.x} * rows_per_block; r < row_end; ++r) {
    const T* dyr = dy + r * C;
    const T* xr = x + r * C;
    const T* drr = dresidual ? dresidual + r * C : nullptr;
    T* dxr = dx + r * C;
    const float m = mean[r], rs = rstd[r];
    float sum_g = 0.f, sum_g_xhat = 0.f;
    if (vectorized) {
      constexpr int N = Pack<T>::N;
      for (int64_t c = int64_t{tid} * N; c < C; c += int64_t{lanes} * N) {
        const Pack<T> pd = load_pack(dyr + c), px = load_pack(xr + c);
#pragma unroll
        for (int k = 0; k < N; ++k) {
          const float g = to_float(pd.v[k]) * weight_at(weight, c + k, 1.f);
          sum_g += g;
          sum_g_xhat += g * ((to_float(px.v[k]) - m) * rs);
        }
      }
    } else {
      for (int64_t c = tid; c < C; c += lanes) {
        const float g = to_float(dyr[c]) * weight_at(weight, c, 1.f);
        sum_g += g;
        sum_g_xhat += g * ((to_float(xr[c]) - m) * rs);
      }
    }
    const float2 sums = block_sum2(sum_g, sum_g_xhat, scratch);
    const float mean_g = sums.x * inv_C, mean_g_xhat = sums.y * inv_C;

    auto grad = [&](int64_t c, float dyv, float xv) {
      const float xhat = (xv - m) * rs;
      if (pw) {
        pw[c] += dyv * xhat;
        pb[c] += dyv;
      }
      return rs * (dyv * weight_at(weight, c, 1.f) - mean_g - xhat * mean_g_xhat);
    };
    if (vectorized) {
      constexpr int N = Pack<T>::N;
      for (int64_t c = int64_t{tid} * N; c < C; c += int64_t{lanes} * N) {
        const Pack<T> pd = load_pack(dyr + c), px = load_pack(xr + c);
        const Pack<T> pr = drr ? load_pack(drr + c) : Pack<T>{};
        Pack<T> o;
#pragma unroll
        for (int k = 0; k < N; ++k) {
          float g = grad(c + k, to_float(pd.v[k]), to_float(px.v[k]));
          if (drr) g = __fadd_rn(g, to_float(pr.v[k]));
          o.v[k] = from_float<T>(g);
        }
        store_pack(dxr + c, o);
      }
    } else {
      for (int64_t c = tid; c < C; c += lanes) {
        float g = grad(c, to_float(dyr[c]), to_float(xr[c]));
        if (drr) g = __fadd_rn(g, to_float(drr[c]));
        dxr[c] = from_float<T>(g);
      }
    }
  }
  if (pw && partial_in_shared) {
    __syncthreads();
    float* out = partial + int64_t{blockIdx.x} * 2 * C;
    for (int64_t c = tid; c < 2 * C; c += lanes) out[c] = shared_partial[c];
  }
}

// dweight[c] = Σ_b partial[b][0][c], dbias[c] = Σ_b partial[b][1][c] in a fixed order: warp g of
// the block sums blocks [g · chunk, (g + 1) · chunk) in order, then the 16 warps' sums are added in
// warp order. Thread lane of the block takes column blockIdx.x · 32 + lane of the 2C partial columns.
// 16 warps, each with its loads unrolled, keep enough of the (small) partials in flight.
constexpr int kColumnSumWarps = 16;
template <class W>
__global__ void __launch_bounds__(kColumnSumWarps * 32)
    layernorm_column_sums_kernel(const float* __restrict__ partial, int64_t blocks, int64_t C, W* __restrict__ dweight,
                                 W* __restrict__ dbias) {
  __shared__ float sums[kColumnSumWarps][32];
  const int lane = threadIdx.x % 32, g = threadIdx.x / 32;
  const int64_t j = int64_t{blockIdx.x} * 32 + lane;
  const int64_t chunk = (blocks + kColumnSumWarps - 1) / kColumnSumWarps;
  const int64_t b0 = g * chunk, b1 = min(blocks, b0 + chunk);
  float s = 0.f;
  if (j < 2 * C) {
#pragma unroll 4
    for (int64_t b = b0; b < b1; ++b) s = __fadd_rn(s, partial[b * 2 * C + j]);
  }
  sums[g][lane] = s;
  __syncthreads();
  if (g != 0 || j >= 2 * C) return;
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kColumnSumWarps; ++w) total = __fadd_rn(total, sums[w][lane]);
  if (j < C) {
    dweight[j] = from_float<W>(total);
  } else {
    dbias[j - C] = from_float<W>(total);
  }
}

Shape row_shape(const Tensor& x) { return Shape(x.shape().begin(), x.shape().end() - 1); }

// Lets `kernel` take `bytes` of dynamic shared memory (an opt-in beyond 48 KiB).
template <class Kernel>
void allow_shared_bytes(Kernel kernel, size_t bytes) {
  if (bytes <= kDefaultSharedBytes) return;
  octet::cuda::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
                     "cudaFuncSetAttribute(max dynamic shared memory)");
}

// The forward launch, with or without the residual add: x2 and h are both defined or both not.
void launch_forward(const char* op, const Tensor& x, const Tensor& x2, const Tensor& h, const Tensor& weight,
                    const Tensor& bias, const Tensor& y, const Tensor& mean, const Tensor& rstd, double eps) {
  const int64_t C = x.size(-1), rows = x.numel() / C;
  if (rows == 0) return;
  const bool residual = x2.defined();
  cudaStream_t stream = stream_for(x);
  dispatch_floating(x.dtype(), op, [&]<class T>() {
    with_weight_type<T>(weight, op, [&]<class W>() {
      const bool vectorized = C % Pack<T>::N == 0 && aligned16(x.data_ptr()) && aligned16(y.data_ptr()) &&
                              (!residual || (aligned16(x2.data_ptr()) && aligned16(h.data_ptr())));
      auto launch_mode = [&]<bool kResidual>() {
        if (layernorm_row_in_registers<T>(C, kLayerNormRowUnits)) {
          // Bytes (ViT-H, bf16): reads x (32.3 MB), writes y (32.3 MB) and 8 per row of statistics:
          // 64.6 MB, 15.0 µs at 4.3 TB/s. With the residual it also reads x2 and writes h: 129.2 MB,
          // 30.1 µs. weight and bias (C each) come from L1/L2.
          const bool params_packed = layernorm_params_packed<T, W>(maybe<W>(weight), C) &&
                                     layernorm_params_packed<T, W>(maybe<W>(bias), C);
          layernorm_forward_rows_kernel<T, W, kResidual>
              <<<static_cast<unsigned>((rows + kForwardWarps - 1) / kForwardWarps), kForwardWarps * 32, 0, stream>>>(
                  ptr<T>(x), maybe<T>(x2), kResidual ? ptr<T>(h) : nullptr, maybe<W>(weight), maybe<W>(bias),
                  ptr<T>(y), ptr<float>(mean), ptr<float>(rstd), rows, static_cast<int>(C), static_cast<float>(eps),
                  vectorized, params_packed);
        } else {
          // Bytes: as above from DRAM (the row's second and third reads hit L1/L2).
          layernorm_forward_block_kernel<T, W, kResidual>
              <<<static_cast<unsigned>(rows), layernorm_forward_block_threads(C, vectorized, Pack<T>::N), 0, stream>>>(
                  ptr<T>(x), maybe<T>(x2), kResidual ? ptr<T>(h) : nullptr, maybe<W>(weight), maybe<W>(bias),
                  ptr<T>(y), ptr<float>(mean), ptr<float>(rstd), C, static_cast<float>(eps), vectorized);
        }
      };
      if (residual) {
        launch_mode.template operator()<true>();
      } else {
        launch_mode.template operator()<false>();
      }
      check_launch(op);
    });
  });
}

// The backward launches, with or without dresidual: dx, then (with weight) the column sums.
void launch_backward(const char* op, const Tensor& dy, const Tensor& dresidual, const Tensor& x, const Tensor& weight,
                     const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dweight,
                     const Tensor& dbias) {
  const int64_t C = x.size(-1), rows = x.numel() / C;
  if (rows == 0) {
    if (weight.defined()) {
      dweight.zero_();
      dbias.zero_();
    }
    return;
  }
  cudaStream_t stream = stream_for(x);
  const bool residual = dresidual.defined();

  dispatch_floating(x.dtype(), op, [&]<class T>() {
    with_weight_type<T>(weight, op, [&]<class W>() {
      constexpr int N = Pack<T>::N;
      const bool vectorized = C % N == 0 && aligned16(dy.data_ptr()) && aligned16(x.data_ptr()) &&
                              aligned16(dx.data_ptr()) && (!residual || aligned16(dresidual.data_ptr()));
      int64_t blocks;
      Tensor partial;
      if (layernorm_row_in_registers<T>(C, kBackwardRowUnits)) {
        const int64_t rows_per_warp =
            (rows + kBackwardWarps * kBackwardTargetBlocks - 1) / (kBackwardWarps * kBackwardTargetBlocks);
        blocks = (rows + kBackwardWarps * rows_per_warp - 1) / (kBackwardWarps * rows_per_warp);
        const int units_per_lane = static_cast<int>(((C + N - 1) / N + 31) / 32);
        const size_t shared =
            weight.defined() ? size_t{kBackwardWarps} * 2 * units_per_lane * N * 32 * sizeof(float) : 0;
        if (weight.defined()) partial = empty({blocks, 2, C}, DType::f32, x.device());
        const bool params_packed = layernorm_params_packed<T, W>(maybe<W>(weight), C);
        auto launch_rows = [&](auto kernel) {
          allow_shared_bytes(kernel, shared);
          kernel<<<static_cast<unsigned>(blocks), kBackwardWarps * 32, shared, stream>>>(
              ptr<T>(dy), maybe<T>(dresidual), ptr<T>(x), maybe<W>(weight), ptr<float>(mean), ptr<float>(rstd),
              ptr<T>(dx), weight.defined() ? ptr<float>(partial) : nullptr, rows, static_cast<int>(C),
              static_cast<int>(rows_per_warp), units_per_lane, vectorized, params_packed);
        };
        // Bytes (ViT-H, bf16): reads dy and x (64.6 MB), writes dx (32.3 MB), reads 8 per row of
        // statistics and writes 2C floats of partials per block (263 blocks: 2.7 MB): 99.6 MB, 23.2 µs at 4.3 TB/s. With the residual gradient, 32.3 MB more read:
        // 131.9 MB, 30.7 µs.
        if (residual) {
          launch_rows(layernorm_backward_rows_kernel<T, W, true>);
        } else {
          launch_rows(layernorm_backward_rows_kernel<T, W, false>);
        }
      } else {
        const int64_t rows_per_block = (rows + kMaxBackwardBlocks - 1) / kMaxBackwardBlocks;
        blocks = (rows + rows_per_block - 1) / rows_per_block;
        if (weight.defined()) partial = empty({blocks, 2, C}, DType::f32, x.device());
        const size_t partial_bytes = static_cast<size_t>(2 * C) * sizeof(float);
        const bool partial_in_shared = weight.defined() && partial_bytes <= kMaxSharedPartialBytes;
        const int threads = threads_for_row(C, vectorized, N, 32, 512);
        // Bytes: as above from DRAM (each row's second read hits L1/L2), plus 8C per block of partials.
        layernorm_backward_block_kernel<T, W>
            <<<static_cast<unsigned>(blocks), threads, partial_in_shared ? partial_bytes : 0, stream>>>(
                ptr<T>(dy), maybe<T>(dresidual), ptr<T>(x), maybe<W>(weight), ptr<float>(mean), ptr<float>(rstd),
                ptr<T>(dx), weight.defined() ? ptr<float>(partial) : nullptr, rows, C, rows_per_block, vectorized,
                partial_in_shared);
      }
      check_launch(op);
      if (weight.defined()) {
        // Bytes: reads the partials (8C per block: 2.7 MB for ViT-H), writes dweight and dbias: 0.6 µs
        // at 4.3 TB/s; in practice latency-bound at a few µs (each thread adds ~17 partials, 4 loads
        // in flight at a time).
        const auto column_blocks = static_cast<unsigned>((2 * C + 31) / 32);
        layernorm_column_sums_kernel<W><<<column_blocks, kColumnSumWarps * 32, 0, stream>>>(
            ptr<float>(partial), blocks, C, ptr<W>(dweight), ptr<W>(dbias));
        check_launch(op);
      }
    });
  });
}

}  // namespace

LayerNormOutput layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  Tensor mean = empty(row_shape(x), DType::f32, x.device()), rstd = empty(row_shape(x), DType::f32, x.device());
  launch_forward("layernorm_forward", x, Tensor(), Tensor(), weight, bias, y, mean, rstd, eps);
  return {y, mean, rstd};
}

LayerNormGrads layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                  const Tensor& rstd) {
  const int64_t C = x.size(-1);
  Tensor dx = empty(x.shape(), x.dtype(), x.device()), dweight, dbias;
  if (weight.defined()) {
    dweight = empty({C}, weight.dtype(), x.device());
    dbias = empty({C}, weight.dtype(), x.device());
  }
  launch_backward("layernorm_backward", dy, Tensor(), x, weight, mean, rstd, dx, dweight, dbias);
  return {dx, dweight, dbias};
}

AddLayerNormOutput add_layernorm_forward(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                                         double eps) {
  Tensor h = empty(x.shape(), x.dtype(), x.device()), out = empty(x.shape(), x.dtype(), x.device());
  Tensor mean = empty(row_shape(x), DType::f32, x.device()), rstd = empty(row_shape(x), DType::f32, x.device());
  launch_forward("add_layernorm_forward", x, y, h, weight, bias, out, mean, rstd, eps);
  return {h, out, mean, rstd};
}

AddLayerNormGrads add_layernorm_backward(const Tensor& dy_ln, const Tensor& dh_residual, const Tensor& h,
                                         const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  const int64_t C = h.size(-1);
  Tensor dh = empty(h.shape(), h.dtype(), h.device()), dweight, dbias;
  if (weight.defined()) {
    dweight = empty({C}, weight.dtype(), h.device());
    dbias = empty({C}, weight.dtype(), h.device());
  }
  launch_backward("add_layernorm_backward", dy_ln, dh_residual, h, weight, mean, rstd, dh, dweight, dbias);
  return {dh, dweight, dbias};
}

}  // namespace octet::kernels::cuda
