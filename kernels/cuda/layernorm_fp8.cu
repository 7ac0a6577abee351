// LayerNorm writing FP8 on the GPU (kernels/fp8.h layernorm_fp8_forward, add_layernorm_fp8_forward):
// one kernel reads x (and the residual branch) once and writes the FP8 copies, mean and rstd (and h),
// never the LayerNorm's output in x's dtype.
//
// Bits. Each element is the one layernorm_forward computes (layernorm_rows.cuh: the device functions
// layernorm.cu runs), rounded to x's dtype T as layernorm_forward stores it, then widened and cast as
// fp8_cast reads and casts a stored element (fp8_elements.cuh). The row statistics are f32 sums whose
// order depends on which thread adds which element, so this kernel computes them in the layout
// layernorm_forward picks for the same row length: a warp per row with the row in registers while it
// fits (the same functions, the same units per lane), else a block of layernorm_forward_block_threads
// threads per row with packed loads under the same condition. mean, rstd, h, the bytes and the amax
// are therefore those of the unfused sequence.
//
// Work, a warp per row (ViT-H's C = 1280 in bf16). A block of 8 warps (or 16, where that fills the
// SMs in fewer rounds: see the launch) owns a tile of 32 rows (grid-strided over the tiles). Each warp
// takes every 8th (16th) row of the tile: loads it into registers
// (writing h on the way), computes its statistics, and for each of its 16-byte units normalises,
// rounds, casts, writes the unit's bytes to the row-major copy (one 8- or 4-byte store per unit:
// the warp writes 256 or 128 contiguous bytes) and into a shared [32][C] byte tile. After a barrier
// the tile goes out transposed: a pair of lanes takes one column, each lane 16 rows of it as one
// 16-byte store, so each column of the transposed copy gets a whole 32-byte sector per tile. Rows
// past the last one are zero bytes: the transposed copy's padding. Each thread keeps the largest |y|
// bit pattern it cast; the block reduces them with warp shuffles and makes one atomicMax on the amax
// slot. A warp loads its next row when it is done with this one (bf16: 72 registers without the
// residual, 102 with). Loading the next row into each unit's registers as soon as the unit's output
// was computed (a refill, at 80 and 104 registers) was tried and timed slower on an H200, as in every
// kernel that took it (LayerNorm's backward 57.8 µs against 49.1, the dGELU cast 178.4 against 127.5).
//
// Work, a block per row (longer rows): the block first computes the tile's statistics row by row,
// keeping them in shared memory, then walks the rows in chunks of 64 columns, normalising 4
// consecutive elements per thread and writing the transposed copy through a 32 × 64 tile. The rows
// are read again from L1/L2 for the output pass.
//
// Bytes: reads x (and the residual) once from DRAM, and weight and bias (C each, cached). Writes
// rows·C per FP8 copy plus the padding, 8 per row for the statistics, and h.
//
// Time. The cast by fp8_elements.cuh's quantise (integer code shared with the CPU, branching on NaN,
// inf and subnormals) took about 35 of the ~48 instructions an element costs here: at ViT-H's 16.1 M
// elements ~23 µs of issue on an H200, more than the 15 µs its 64.6 MB take at 4.3 TB/s. The
// warp-per-row kernel therefore converts with quantise4, the hardware conversion two values an
// instruction, which gives quantise's byte for every float (a GPU test checks all 2^32): the bytes,
// not the instructions, set its pace. The block-per-row kernel (long rows) keeps quantise.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/cuda/fp8_elements.cuh"
#include "kernels/cuda/layernorm_rows.cuh"
#include "kernels/fp8_scale_rule.h"

namespace octet::kernels::cuda {
namespace {

constexpr int kTileRows = 32;
// Warp-per-row blocks: 8 warps (4 rows of the tile each) or 16 (2 each), whichever fills the SMs in
// fewer row-times (see the launch).
constexpr int kRowWarps = 8, kMaxRowWarps = 16;
constexpr int kTileCols = 64;       // block-per-row: columns per chunk of the transposed tile
constexpr int kQuadsPerTileRow = kTileCols / 4;        // threads across a chunk of one row
constexpr int kRowQuadsPerTileColumn = kTileRows / 4;  // threads down a column of the transposed tile
constexpr size_t kDefaultSharedBytes = 48 * 1024;  // dynamic shared memory beyond this needs an opt-in

struct LayerNormFp8Args {
  int64_t rows, C;
  int64_t padded_rows;  // rows of the transposed copy (>= rows), or rows without it
  int64_t tiles;        // tiles of 32 rows covering padded_rows
  float eps;
  // Warp per row:
  int tile_stride;         // bytes per row of the shared tile (see tile_stride())
  bool rows_packed;        // 16-byte loads of x (x2) and stores of h (C % N == 0, aligned)
  bool params_packed;      // layernorm_params_packed for weight and bias
  bool data_packed;        // one N-byte store per unit to data (C % N == 0, aligned)
  bool transposed_packed;  // 16-byte stores to transposed (padded_rows % 16 == 0, aligned)
  // Block per row:
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

// The shared tile's row stride in bytes: C rounded up to 8 (a row's last unit, past C, lands in the
// slack), plus 4. A warp's transposed reads take rows j and 16 + j of 16 consecutive columns at once;
// with a stride of 4 mod 8 bytes those rows lie 4·stride = 16 mod 32 words apart, in other banks.
inline int tile_stride(int64_t C) { return static_cast<int>((C + 7) / 8 * 8 + 4); }

// See the top of the file: a warp per row, a block per tile of 32 rows.
template <class T, class W, bool kResidual, bool kE5M2>
__global__ void __launch_bounds__(kMaxRowWarps * 32, 1)
    layernorm_fp8_rows_kernel(const T* __restrict__ x, const T* __restrict__ x2, T* __restrict__ h,
                              const W* __restrict__ weight, const W* __restrict__ bias, LayerNormFp8Args a) {
  extern __shared__ uint32_t tile_words[];  // [kTileRows][tile_stride] bytes, with the transposed copy
  __shared__ uint32_t amax_scratch[32];
  constexpr int N = Pack<T>::N;
  uint8_t* tile = reinterpret_cast<uint8_t*>(tile_words);
  const float scale = *a.scale;
  if (blockIdx.x == 0 && threadIdx.x == 0) *a.scale_inv = fp8_scale_inv(scale);
  const int C = static_cast<int>(a.C), S = a.tile_stride;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  uint32_t local = 0;
  for (int64_t t = blockIdx.x; t < a.tiles; t += gridDim.x) {
    const int64_t r0 = t * kTileRows;
    for (int lr = warp; lr < kTileRows; lr += warps) {
      const int64_t r = r0 + lr;
      uint8_t* tile_row = tile + lr * S;
      if (r >= a.rows) {  // past the last row: zeros, the transposed copy's padding (uniform per warp)
        if (a.transposed) {
          for (int c = 4 * lane; c < S; c += 4 * 32) *reinterpret_cast<uint32_t*>(tile_row + c) = 0u;
        }
        continue;
      }
      const int64_t offset = r * C;
      Unit u[kLayerNormRowUnits];
      if constexpr (kResidual) {
        load_row_units_residual(x + offset, x2 + offset, h + offset, C, lane, a.rows_packed, u);
      } else {
        load_row_units(x + offset, C, lane, a.rows_packed, u);
      }
      const RowStats s = warp_row_stats<T>(u, C, lane, a.eps);
      if (lane == 0) {
        a.mean[r] = s.mean;
        a.rstd[r] = s.rstd;
      }
#pragma unroll
      for (int i = 0; i < kLayerNormRowUnits; ++i) {
        const int c0 = unit_column<T>(i, lane);
        if (c0 >= C) continue;
        float v[N];
        layernorm_unit<T>(u[i], s, weight, bias, c0, C, a.params_packed, v);
        float y[N];
#pragma unroll
        for (int k = 0; k < N; ++k) y[k] = 0.f;  // past C: the tile row's slack, zero bytes
        for_unit_elements<T>(c0, C, [&](int k) {
          // Rounded to T as layernorm_forward stores it, then read back as fp8_cast reads it.
          y[k] = widen_stored(from_float<T>(v[k]));
          local = max(local, magnitude_bits(y[k]));
        });
        // quantise's bytes, four at a time by the hardware conversion (fp8_elements.cuh: the same
        // byte for every float), as fp8_cast converts.
        uint32_t words[N / 4];
#pragma unroll
        for (int j = 0; j < N / 4; ++j) words[j] = quantise4<kE5M2>(y + 4 * j, scale);
        uint8_t b[N];
#pragma unroll
        for (int k = 0; k < N; ++k) b[k] = static_cast<uint8_t>(words[k / 4] >> (8 * (k % 4)));
        if (a.data) {
          uint8_t* out = a.data + offset + c0;
          if (a.data_packed) {
            if constexpr (N == 8) {
              *reinterpret_cast<uint2*>(out) = make_uint2(words[0], words[1]);
            } else {
              *reinterpret_cast<uint32_t*>(out) = words[0];
            }
          } else {
            for_unit_elements<T>(c0, C, [&](int k) { out[k] = b[k]; });
          }
        }
        if (a.transposed) {  // S and c0 are multiples of 4
#pragma unroll
          for (int j = 0; j < N / 4; ++j) *reinterpret_cast<uint32_t*>(tile_row + c0 + 4 * j) = words[j];
        }
      }
    }
    if (!a.transposed) continue;
    __syncthreads();  // the tile is complete
    // transposed[c, r0 + 16·half ...]: lanes 2j and 2j + 1 take the two halves of one column.
    const int64_t P = a.padded_rows;
    for (int q = threadIdx.x; q < 2 * C; q += blockDim.x) {
      const int c = q >> 1, half = q & 1;
      const int64_t rb = r0 + 16 * half;
      if (rb >= P) continue;
      const uint8_t* src = tile + 16 * half * S + c;
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w[j] = uint32_t{src[(4 * j) * S]} | uint32_t{src[(4 * j + 1) * S]} << 8 |
               uint32_t{src[(4 * j + 2) * S]} << 16 | uint32_t{src[(4 * j + 3) * S]} << 24;
      }
      uint8_t* out = a.transposed + c * P + rb;
      if (a.transposed_packed) {  // P % 16 == 0, so rb + 15 < P
        *reinterpret_cast<uint4*>(out) = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          if (rb + j < P) out[j] = static_cast<uint8_t>(w[j / 4] >> (8 * (j % 4)));
        }
      }
    }
    __syncthreads();  // the tile's reads are done before the next tile's rows overwrite it
  }
  publish_amax(local, amax_scratch, a.amax_bits);
}

// See the top of the file: a block per row, for rows too long for registers. x2 and h are the
// residual branch and x + x2 (kResidual), else null. h is read back after a barrier by threads other
// than the writer, so it is neither const nor restrict. A block is sized by the row (often 160 or 320
// threads), so it may take up to 64 registers.
template <class T, class W, bool kResidual, bool kE5M2>
__global__ void __launch_bounds__(1024, 1)
    layernorm_fp8_block_kernel(const T* __restrict__ x, const T* __restrict__ x2, T* h, const W* __restrict__ weight,
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
    for (int lr = 0; lr < kTileRows && r0 + lr < a.rows; ++lr) {  // uniform across the block
      const int64_t r = r0 + lr;
      const T* x2r = kResidual ? x2 + r * C : nullptr;
      T* hr = kResidual ? h + r * C : nullptr;
      const RowStats s = layernorm_row_stats<kResidual>(x + r * C, x2r, hr, C, a.eps, threadIdx.x, blockDim.x,
                                                        a.vectorized,
                                                        [&](float v) { return block_sum(v, sum_scratch); });
      if (threadIdx.x == 0) {
        stats[lr] = s;
        a.mean[r] = s.mean;
        a.rstd[r] = s.rstd;
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
  a.transposed_packed = transposed && padded_rows % 16 == 0 && aligned_to(a.transposed, 16);
  cudaStream_t stream = stream_for(x);

  dispatch_floating(x.dtype(), op, [&]<class T>() {
    with_weight_type<T>(weight, op, [&]<class W>() {
      constexpr int N = Pack<T>::N;
      // layernorm_forward's condition, less its output's alignment: a fresh device block (y there, h
      // here) is 256-byte aligned, so it never turns packed loads off.
      a.vectorized = C % N == 0 && aligned16(x.data_ptr()) &&
                     (!residual || (aligned16(y.data_ptr()) && aligned16(out.h.data_ptr())));
      a.rows_packed = a.vectorized;
      a.params_packed =
          layernorm_params_packed<T, W>(maybe<W>(weight), C) && layernorm_params_packed<T, W>(maybe<W>(bias), C);
      a.data_packed = rowwise && C % N == 0 && aligned_to(a.data, N);
      const void* src = residual ? out.h.data_ptr() : x.data_ptr();
      a.quad_rows = C % 4 == 0 && aligned_to(src, 4 * sizeof(T)) && (!rowwise || aligned_to(a.data, 4));
      const bool in_registers = layernorm_row_in_registers<T>(C, kLayerNormRowUnits);
      a.tile_stride = in_registers ? tile_stride(C) : 0;
      const size_t shared = in_registers && transposed ? size_t{kTileRows} * a.tile_stride : 0;
      const int threads = in_registers ? kRowWarps * 32 : layernorm_forward_block_threads(C, a.vectorized, N);
      // Every SM full, each block looping over tiles, which also bounds the atomics on amax to one per
      // block; at least one block, which writes scale_inv.
      auto launch = [&](auto kernel) {
        if (shared > kDefaultSharedBytes) {
          octet::cuda::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(shared)),
                             "cudaFuncSetAttribute(max dynamic shared memory)");
        }
        auto slots_for = [&](int block_threads) {  // blocks resident at once on the device
          const int per_sm = resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), block_threads, shared);
          return int64_t{std::max(per_sm, 1)} * sm_count(device.index);
        };
        int block_threads = threads;
        int64_t max_blocks = slots_for(threads);
        if (in_registers) {
          // The tiles go out in rounds of the blocks the SMs hold at once, and a block's warps take its
          // 32 rows in turn: a warp computes rounds · 32 / warps rows in all. 8 warps a block, unless 16
          // compute fewer rows each. ViT-H's residual kernel (102 registers): two 8-warp blocks an SM,
          // 394 tiles in 2 rounds of 264 (the second half empty), 8 rows a warp; one 16-warp block an
          // SM, 3 rounds of 132, 6 rows a warp. Without the residual (72 registers) three 8-warp blocks
          // an SM take the 394 tiles in one round, 4 rows a warp. The bytes are the same either way.
          const int64_t wide = slots_for(kMaxRowWarps * 32);
          auto rows_per_warp = [&](int64_t slots, int warps) {
            return (a.tiles + slots - 1) / slots * (kTileRows / warps);
          };
          if (rows_per_warp(wide, kMaxRowWarps) < rows_per_warp(max_blocks, kRowWarps)) {
            block_threads = kMaxRowWarps * 32;
            max_blocks = wide;
          }
        }
        const auto blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min(a.tiles, max_blocks)));
        kernel<<<blocks, block_threads, shared, stream>>>(ptr<T>(x), residual ? ptr<T>(y) : nullptr,
                                                          residual ? ptr<T>(out.h) : nullptr, maybe<W>(weight),
                                                          maybe<W>(bias), a);
      };
      // Bytes (ViT-H, bf16, both copies, a warp per row): reads x (32.3 MB), writes the two FP8
      // copies (16.1 MB each) and 8 per row of statistics: 64.6 MB, 15.0 µs at 4.3 TB/s (the
      // row-major copy alone: 48.5 MB, 11.3 µs). With the residual it also reads the residual branch
      // and writes h: 129.2 MB, 30.1 µs. Without the residual the cast's instructions, ~23 µs on an
      // H200, set the pace rather than the bytes: see the top of the file.
      auto launch_format = [&]<bool kE5M2>() {
        if (in_registers && residual) {
          launch(layernorm_fp8_rows_kernel<T, W, true, kE5M2>);
        } else if (in_registers) {
          launch(layernorm_fp8_rows_kernel<T, W, false, kE5M2>);
        } else if (residual) {
          launch(layernorm_fp8_block_kernel<T, W, true, kE5M2>);
        } else {
          launch(layernorm_fp8_block_kernel<T, W, false, kE5M2>);
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
