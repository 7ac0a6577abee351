// LayerNorm writing FP8 on the GPU (kernels/fp8.h layernorm_fp8_forward, add_layernorm_fp8_forward):
// one kernel reads x (and the residual branch) once and writes the FP8 copies, mean and rstd (and h),
// never the LayerNorm's output in x's dtype.
//
// Bits. Each element is the one layernorm_forward computes (layernorm_rows.cuh: the device functions
// layernorm.cu runs), rounded to x's dtype T as layernorm_forward stores it, then widened and cast as
// fp8_cast reads and casts a stored element (fp8_elements.cuh). The row statistics are f32 sums whose
// order depends on which thread adds which element, so this kernel computes them in the layout
// layernorm_forward picks for the same row length and alignment: a warp per row for C <= 1024, a
// block of layernorm_forward_block_threads threads per row beyond, packed loads under the same
// condition. mean, rstd, h, the bytes and the amax are therefore those of the unfused sequence.
//
// Work. A block owns a tile of 32 rows (grid-strided over the tiles). First the tile's statistics:
// each warp takes every 8th row (or the whole block takes each row in turn), writes mean and rstd,
// keeps them in shared memory, and writes h on the way. Then the block walks the row in chunks of 64
// columns: a thread normalises 4 consecutive elements of a row, writes their 4 bytes to the row-major
// copy and stages them in a 32 × 64 shared tile; after a barrier the tile goes out transposed, each
// thread writing 4 rows of one column, so every column of the transposed copy gets a 32-byte segment.
// Rows past the last one are zero bytes: the transposed copy's padding. Each thread keeps the largest
// |y| bit pattern it cast; the block reduces them and makes one atomicMax on the amax slot.
//
// Bytes: reads x (and the residual) once from DRAM, and weight and bias (C each, cached); the
// statistics' second pass and the output pass read the row again from L1/L2. Writes rows·C per FP8
// copy plus the padding, 8 per row for the statistics, and h.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/cuda/fp8_elements.cuh"
#include "kernels/cuda/layernorm_rows.cuh"
#include "kernels/fp8_scale_rule.h"

namespace octet::kernels::cuda {
namespace {

constexpr int kTileRows = 32;
constexpr int kTileCols = 64;
constexpr int kQuadsPerTileRow = kTileCols / 4;        // threads across a chunk of one row
constexpr int kRowQuadsPerTileColumn = kTileRows / 4;  // threads down a column of the transposed tile
constexpr int kWarpModeThreads = 256;                  // 8 warps, 4 rows each per tile
constexpr int kMaxResidentThreadsPerSm = 2048;

struct LayerNormFp8Args {
  int64_t rows, C;
  int64_t padded_rows;  // rows of the transposed copy (>= rows), or rows without it
  int64_t tiles;        // tiles of 32 rows covering padded_rows
  float eps;
  bool vectorized;       // the statistics' packed loads, decided as layernorm_forward decides them
  bool quad_rows;        // 4-element loads of the rows and 4-byte stores to data (C % 4 == 0, aligned)
  bool quad_transposed;  // 4-byte stores to transposed (padded_rows % 4 == 0, aligned)
  const float* scale;
  uint8_t* data;        // [rows, C] or null
  uint8_t* transposed;  // [C, padded_rows] or null
  unsigned int* amax_bits;  // the amax slot as bits, or null
  float* scale_inv;
  float* mean;
  float* rstd;
};

// See the top of the file. x2 and h are the residual branch and x + x2 (kResidual), else null. h is
// read back after a barrier by threads other than the writer, so it is neither const nor restrict.
// Launch bounds: a block-per-row block is sized by the row (often 160 or 320 threads), so it may take
// up to 64 registers; a warp-per-row block of 256 threads, 4 blocks per SM (64 registers as well).
template <class T, class W, bool kBlockPerRow, bool kResidual, bool kE5M2>
__global__ void __launch_bounds__(kBlockPerRow ? 1024 : kWarpModeThreads, kBlockPerRow ? 1 : 4)
    layernorm_fp8_kernel(const T* __restrict__ x, const T* __restrict__ x2, T* h, const W* __restrict__ weight,
                         const W* __restrict__ bias, LayerNormFp8Args a) {
  __shared__ uint8_t tile[kTileRows][kTileCols + 1];  // +1: the transposed reads walk down a column
  __shared__ RowStats stats[kTileRows];
  __shared__ float sum_scratch[32];
  __shared__ uint32_t amax_scratch[32];
  const float scale = *a.scale;
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.scale_inv = fp8_scale_inv(scale);
  const int64_t C = a.C;
  uint32_t local = 0;
  for (int64_t t = blockIdx.x; t < a.tiles; t += gridDim.x) {
    const int64_t r0 = t * kTileRows;
    __syncthreads();  // the previous tile's reads of `stats` and `tile` are done
    // The statistics, in layernorm_forward's layout.
    auto row_stats = [&](int lr, int lane, int lanes, auto&& row_sum) {
      const int64_t r = r0 + lr;
      const T* x2r = kResidual ? x2 + r * C : nullptr;
      T* hr = kResidual ? h + r * C : nullptr;
      const RowStats s = layernorm_row_stats<kResidual>(x + r * C, x2r, hr, C, a.eps, lane, lanes, a.vectorized,
                                                        row_sum);
      if (lane == 0) {
        stats[lr] = s;
        a.mean[r] = s.mean;
        a.rstd[r] = s.rstd;
      }
    };
    if constexpr (kBlockPerRow) {
      for (int lr = 0; lr < kTileRows && r0 + lr < a.rows; ++lr) {  // uniform across the block
        row_stats(lr, threadIdx.x, blockDim.x, [&](float v) { return block_sum(v, sum_scratch); });
      }
    } else {
      const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
      for (int lr = warp; lr < kTileRows && r0 + lr < a.rows; lr += warps) {
        row_stats(lr, threadIdx.x % 32, 32, [](float v) { return warp_sum(v); });
      }
    }
    __syncthreads();  // stats, and h for threads other than its writer

    for (int64_t c0 = 0; c0 < C; c0 += kTileCols) {
      if (a.transposed && c0 > 0) __syncthreads();  // the previous chunk's transposed reads are done
      for (int q = threadIdx.x; q < kTileRows * kQuadsPerTileRow; q += blockDim.x) {
        const int lr = q / kQuadsPerTileRow;
        const int64_t r = r0 + lr, c = c0 + 4 * (q % kQuadsPerTileRow);
        uint8_t b[4] = {0, 0, 0, 0};  // rows past `rows` are the transposed copy's zero padding
        if (r < a.rows) {
          const T* src = (kResidual ? h : x) + r * C;
          float v[4] = {0.f, 0.f, 0.f, 0.f};
          bool in[4];
          if (a.quad_rows) {
            const bool quad_in = c < C;  // C % 4 == 0: a quad is all in or all out
            if (quad_in) {
              const Quad<T> quad = *reinterpret_cast<const Quad<T>*>(src + c);
#pragma unroll
              for (int j = 0; j < 4; ++j) v[j] = to_float(quad.v[j]);
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) in[j] = quad_in;
          } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              in[j] = c + j < C;
              if (in[j]) v[j] = to_float(src[c + j]);
            }
          }
          const RowStats s = stats[lr];
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (!in[j]) continue;
            // Rounded to T as layernorm_forward stores it, then read back as fp8_cast reads it.
            const float y = widen_stored(from_float<T>(layernorm_element(v[j], s, weight, bias, c + j)));
            local = max(local, magnitude_bits(y));
            b[j] = quantise<kE5M2>(y, scale);
          }
          if (a.data) {
            uint8_t* out = a.data + r * C + c;
            if (a.quad_rows) {
              if (in[0]) *reinterpret_cast<uint32_t*>(out) = pack_bytes(b);
            } else {
#pragma unroll
              for (int j = 0; j < 4; ++j) {
                if (in[j]) out[j] = b[j];
              }
            }
          }
        }
        if (a.transposed) {
          const int lc = 4 * (q % kQuadsPerTileRow);
#pragma unroll
          for (int j = 0; j < 4; ++j) tile[lr][lc + j] = b[j];
        }
      }
      if (!a.transposed) continue;
      __syncthreads();
      // transposed[cc, r .. r+3] for the chunk's columns cc: tile column lc read down four tile rows.
      for (int q = threadIdx.x; q < kTileCols * kRowQuadsPerTileColumn; q += blockDim.x) {
        const int lc = q / kRowQuadsPerTileColumn, lr = 4 * (q % kRowQuadsPerTileColumn);
        const int64_t cc = c0 + lc, r = r0 + lr;
        if (cc >= C || r >= a.padded_rows) continue;
        uint8_t b[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = tile[lr + j][lc];
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
  }
  publish_amax(local, amax_scratch, a.amax_bits);
}

int sm_count(int device) {
  int n = 0;
  octet::cuda::check(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device),
                     "cudaDeviceGetAttribute(multiprocessor count)");
  return n;
}

bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

Shape row_shape(const Tensor& x) { return Shape(x.shape().begin(), x.shape().end() - 1); }

}  // namespace

LayerNormFp8 layernorm_fp8_forward(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                                   double eps, const Tensor& scale, const Tensor& amax, DType fp8_dtype, bool rowwise,
                                   bool transposed, int64_t padded_rows) {
  const char* op = y.defined() ? "add_layernorm_fp8_forward" : "layernorm_fp8_forward";
  const Device device = x.device();
  const int64_t C = x.size(-1), rows = x.numel() / C;
  const bool residual = y.defined();
  LayerNormFp8 out;
  out.mean = empty(row_shape(x), DType::f32, device);
  out.rstd = empty(row_shape(x), DType::f32, device);
  if (residual) out.h = empty(x.shape(), x.dtype(), device);
  if (rowwise) out.cast.data = empty({rows, C}, fp8_dtype, device);
  if (transposed) out.cast.transposed = empty({C, padded_rows}, fp8_dtype, device);
  out.cast.scale_inv = empty({1}, DType::f32, device);

  LayerNormFp8Args a{};
  a.rows = rows;
  a.C = C;
  a.padded_rows = transposed ? padded_rows : rows;
  a.tiles = (a.padded_rows + kTileRows - 1) / kTileRows;
  a.eps = static_cast<float>(eps);  // as layernorm_forward rounds it
  a.scale = ptr<const float>(scale);
  a.data = rowwise ? ptr<uint8_t>(out.cast.data) : nullptr;
  a.transposed = transposed ? ptr<uint8_t>(out.cast.transposed) : nullptr;
  a.amax_bits = amax.defined() ? ptr<unsigned int>(amax) : nullptr;
  a.scale_inv = ptr<float>(out.cast.scale_inv);
  a.mean = ptr<float>(out.mean);
  a.rstd = ptr<float>(out.rstd);
  a.quad_transposed = transposed && padded_rows % 4 == 0 && aligned_to(a.transposed, 4);
  cudaStream_t stream = stream_for(x);

  dispatch_floating(x.dtype(), op, [&]<class T>() {
    with_weight_type(weight, op, [&]<class W>() {
      // layernorm_forward's condition, less its output's alignment: a fresh device block (y there, h
      // here) is 256-byte aligned, so it never turns packed loads off.
      a.vectorized = C % Pack<T>::N == 0 && aligned16(x.data_ptr()) &&
                     (!residual || (aligned16(y.data_ptr()) && aligned16(out.h.data_ptr())));
      const void* src = residual ? out.h.data_ptr() : x.data_ptr();
      a.quad_rows = C % 4 == 0 && aligned_to(src, 4 * sizeof(T)) && (!rowwise || aligned_to(a.data, 4));
      const bool block_per_row = C > kLayerNormWarpPerRowMaxC;
      const int threads =
          block_per_row ? layernorm_forward_block_threads(C, a.vectorized, Pack<T>::N) : kWarpModeThreads;
      // Every SM full, each block looping over tiles, which also bounds the atomics on amax to one per
      // block; at least one block, which writes scale_inv.
      const int64_t max_blocks = int64_t{kMaxResidentThreadsPerSm / threads} * sm_count(device.index);
      const auto blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min(a.tiles, max_blocks)));
      auto launch = [&](auto kernel) {
        kernel<<<blocks, threads, 0, stream>>>(ptr<T>(x), residual ? ptr<T>(y) : nullptr,
                                               residual ? ptr<T>(out.h) : nullptr, maybe<W>(weight), maybe<W>(bias), a);
      };
      auto launch_format = [&]<bool kE5M2>() {
        if (block_per_row && residual) {
          launch(layernorm_fp8_kernel<T, W, true, true, kE5M2>);
        } else if (block_per_row) {
          launch(layernorm_fp8_kernel<T, W, true, false, kE5M2>);
        } else if (residual) {
          launch(layernorm_fp8_kernel<T, W, false, true, kE5M2>);
        } else {
          launch(layernorm_fp8_kernel<T, W, false, false, kE5M2>);
        }
      };
      if (fp8_dtype == DType::e5m2) {
        launch_format.template operator()<true>();
      } else {
        launch_format.template operator()<false>();
      }
      check_launch(op);
    });
  });
  return out;
}

}  // namespace octet::kernels::cuda
