// The column design of the GPU LayerNorm backward (kernels/cuda/layernorm_columns.h).
//
// The row design (layernorm.cu) gives each warp a row and keeps each warp's dweight and dbias sums
// in 10 KiB of shared slots, read-modified-written for every element, at 126 registers: 16 warps an
// SM, latency-bound at 0.62-0.64 of a copy on an H200. Here a block of C/N threads walks a run of
// rows (24 for ViT-H: 526 blocks), each thread owning one 16-byte pack of columns down the run, so
// that its dweight and dbias sums stay in 16 registers; a row's two sums are added across the block,
// one barrier a row, while the next row's loads are in flight. The per-row arithmetic is the row
// design's (backward_row), every operation an _rn intrinsic; the sums are added in another order.
#include "kernels/cuda/layernorm_columns.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/layernorm_rows.cuh"
#include "kernels/layernorm_design.h"

namespace octet::kernels::cuda {
namespace {

// The grid: about this many blocks whatever the row count (four of 160 threads an SM, all resident
// at once, on an H100's or H200's 132 SMs for ViT-H's width), so that the rows a block takes, and so
// the sums' bits, depend on `rows` alone.
constexpr int64_t kColumnTargetBlocks = 528;
constexpr int kMaxColumnThreads = 256;  // the widest row this design takes: 256 packs (2048 bf16)
constexpr int kMaxColumnWarps = kMaxColumnThreads / 32;
// At most 96 registers a thread: ViT-H's 160-thread blocks then fit 4 an SM (65,536 / (20 warps ·
// 32), in the allocation's steps of 8), and its 526 blocks all start at once. Unbounded, bf16 with
// the residual took 107 (3 blocks an SM: 1.33 waves).
constexpr int kMaxColumnRegisters = 96;

// Whether the column design takes rows of C elements of T: whole 16-byte packs (the caller also
// needs 16-byte aligned rows), at most kMaxColumnThreads of them.
template <class T>
bool columns_take(int64_t C) {
  return C % Pack<T>::N == 0 && C / Pack<T>::N <= kMaxColumnThreads;
}

// One row's packs of a thread's columns, and the row's statistics.
template <class T>
struct ColumnRow {
  Pack<T> d{}, x{}, r{};
  float mean = 0.f, rstd = 0.f;
};

// Issues the loads of row `row` (< `end`, else nothing) for the thread's pack at c0 (if it owns one).
template <class T, bool kResidual>
__device__ __forceinline__ void load_column_row(const T* __restrict__ dy, const T* __restrict__ dresidual,
                                                const T* __restrict__ x, const float* __restrict__ mean,
                                                const float* __restrict__ rstd, int64_t row, int64_t end, int C,
                                                int c0, bool owns, ColumnRow<T>& out) {
  if (row >= end) return;
  if (owns) {
    const int64_t offset = row * C + c0;
    out.d = load_pack(dy + offset);
    out.x = load_pack(x + offset);
    if constexpr (kResidual) out.r = load_pack(dresidual + offset);
  }
  out.mean = mean[row];
  out.rstd = rstd[row];
}

// dx for rows [blockIdx.x · rows_per_block, ...) and, with weight, the block's partial row of
// dweight and dbias (the layout write_block_partial writes). Thread t owns the pack of columns
// t·N .. t·N+N-1 in every row (threads past C/N own nothing but take part in the sums). Row by row:
// the thread issues the next row's loads, sums g and g·xhat over its pack of this row, the block adds
// the threads' sums (warp butterflies, then the warps' totals in warp order from shared memory,
// double-buffered so that one barrier a row suffices), and the thread writes its dx and adds dy·xhat
// and dy into registers. Per row, the arithmetic is backward_row's, every operation an _rn
// intrinsic, so that the kernels with and without kResidual compute the same LayerNorm gradient bits.
// Needs C % N == 0 and the rows 16-byte aligned.
template <class T, class W, bool kResidual>
__global__ void __maxnreg__(kMaxColumnRegisters)
    layernorm_backward_columns_kernel(const T* __restrict__ dy, const T* __restrict__ dresidual,
                                      const T* __restrict__ x, const W* __restrict__ weight,
                                      const float* __restrict__ mean, const float* __restrict__ rstd,
                                      T* __restrict__ dx, float* __restrict__ partial, int64_t rows, int C,
                                      int64_t rows_per_block, bool params_packed) {
  constexpr int N = Pack<T>::N;
  __shared__ float warp_sums[2][2][kMaxColumnWarps];  // [buffer][the row's Σg, Σg·xhat][warp]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int c0 = threadIdx.x * N;
  const bool owns = c0 < C;
  const bool affine = weight != nullptr;
  float w[N], acc_w[N], acc_b[N];
#pragma unroll
  for (int k = 0; k < N; ++k) w[k] = 1.f, acc_w[k] = 0.f, acc_b[k] = 0.f;
  if (affine && owns) load_unit_params<T>(weight, c0, C, params_packed, w);
  const float inv_C = __fdiv_rn(1.0f, static_cast<float>(C));
  const int64_t r_begin = int64_t{blockIdx.x} * rows_per_block;
  const int64_t r_end = r_begin + rows_per_block < rows ? r_begin + rows_per_block : rows;
  ColumnRow<T> row;
  load_column_row<T, kResidual>(dy, dresidual, x, mean, rstd, r_begin, r_end, C, c0, owns, row);
  int buffer = 0;
  for (int64_t r = r_begin; r < r_end; ++r) {  // the same trip count in every thread of the block
    ColumnRow<T> next;  // in flight while this row is summed, added across the block and written
    load_column_row<T, kResidual>(dy, dresidual, x, mean, rstd, r + 1, r_end, C, c0, owns, next);
    float sum_g = 0.f, sum_g_xhat = 0.f;
    if (owns) {
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float dyv = to_float(row.d.v[k]);
        const float g = affine ? __fmul_rn(dyv, w[k]) : dyv;
        const float xhat = __fmul_rn(__fsub_rn(to_float(row.x.v[k]), row.mean), row.rstd);
        sum_g = __fadd_rn(sum_g, g);
        sum_g_xhat = __fmaf_rn(g, xhat, sum_g_xhat);
      }
    }
    sum_g = warp_sum(sum_g);
    sum_g_xhat = warp_sum(sum_g_xhat);
    if (lane == 0) warp_sums[buffer][0][warp] = sum_g, warp_sums[buffer][1][warp] = sum_g_xhat;
    __syncthreads();
    float total_g = 0.f, total_g_xhat = 0.f;
    for (int v = 0; v < warps; ++v) {
      total_g = __fadd_rn(total_g, warp_sums[buffer][0][v]);
      total_g_xhat = __fadd_rn(total_g_xhat, warp_sums[buffer][1][v]);
    }
    // The next row writes the other buffer; this one is written again two rows on, after a barrier
    // that every thread reaches only once done reading it.
    buffer ^= 1;
    if (owns) {
      const float mean_g = __fmul_rn(total_g, inv_C), mean_g_xhat = __fmul_rn(total_g_xhat, inv_C);
      Pack<T> o;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float dyv = to_float(row.d.v[k]);
        const float g = affine ? __fmul_rn(dyv, w[k]) : dyv;
        const float xhat = __fmul_rn(__fsub_rn(to_float(row.x.v[k]), row.mean), row.rstd);
        float v = __fmul_rn(row.rstd, __fsub_rn(__fsub_rn(g, mean_g), __fmul_rn(xhat, mean_g_xhat)));
        if constexpr (kResidual) v = __fadd_rn(v, to_float(row.r.v[k]));
        o.v[k] = from_float<T>(v);
        if (affine) {
          acc_w[k] = __fmaf_rn(dyv, xhat, acc_w[k]);
          acc_b[k] = __fadd_rn(acc_b[k], dyv);
        }
      }
      store_pack(dx + r * C + c0, o);
    }
    row = next;
  }
  if (affine && owns) {
    float* out = partial + int64_t{blockIdx.x} * 2 * C;
#pragma unroll
    for (int k = 0; k < N; ++k) out[c0 + k] = acc_w[k], out[C + c0 + k] = acc_b[k];
  }
}

}  // namespace

bool launch_backward_columns(const Tensor& dy, const Tensor& dresidual, const Tensor& x, const Tensor& weight,
                             const Tensor& mean, const Tensor& rstd, const Tensor& dx, Tensor& partial,
                             int64_t& blocks) {
  constexpr const char* op = "layernorm_backward (column design)";
  const int64_t C = x.size(-1), rows = x.numel() / C;
  bool taken = false;
  dispatch_floating(x.dtype(), op, [&]<class T>() {
    with_weight_type<T>(weight, op, [&]<class W>() {
      if (!columns_take<T>(C)) return;
      constexpr int N = Pack<T>::N;
      const int64_t rows_per_block = (rows + kColumnTargetBlocks - 1) / kColumnTargetBlocks;
      blocks = (rows + rows_per_block - 1) / rows_per_block;
      const int threads = static_cast<int>((C / N + 31) / 32 * 32);
      if (weight.defined()) partial = empty({blocks, 2, C}, DType::f32, x.device());
      const bool params_packed = layernorm_params_packed<T, W>(maybe<W>(weight), C);
      auto launch = [&](auto kernel) {
        kernel<<<static_cast<unsigned>(blocks), threads, 0, stream_for(x)>>>(
            ptr<T>(dy), maybe<T>(dresidual), ptr<T>(x), maybe<W>(weight), ptr<float>(mean), ptr<float>(rstd),
            ptr<T>(dx), weight.defined() ? ptr<float>(partial) : nullptr, rows, static_cast<int>(C), rows_per_block,
            params_packed);
      };
      // Bytes (ViT-H, bf16): reads dy and x (64.6 MB; with the residual gradient 32.3 MB more), writes
      // dx (32.3 MB), reads 8 per row of statistics and writes 2C floats of partials per block (526
      // blocks of 24 rows: 5.4 MB, read back by the column sums): 102.4 MB, 23.8 µs at 4.3 TB/s; with
      // the residual 134.7 MB, 31.3 µs (the row design writes half the partials: 263 blocks).
      if (dresidual.defined()) {
        launch(layernorm_backward_columns_kernel<T, W, true>);
      } else {
        launch(layernorm_backward_columns_kernel<T, W, false>);
      }
      check_launch(op);
      count_layernorm_backward_column_launch();
      taken = true;
    });
  });
  return taken;
}

}  // namespace octet::kernels::cuda
