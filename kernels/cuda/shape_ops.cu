// CUDA data movement over raw elements: permute (a contiguous-run gather, or a shared-memory tiled
// transpose), row-band copies (concat/split/slice), the slice gradient, gathers and their
// deterministic accumulating transpose.
//
// Raw copies move "units" as wide as the data allows (up to 16 bytes): a permute whose innermost
// run stays contiguous, such as the ViT's [B, S, 3, H, D] -> [3, B, H, S, D] and [B, H, S, D] ->
// [B, S, H, D], copies whole 16-byte pieces of each run when its byte length and the pointers allow.
#include <algorithm>
#include <climits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/shape_ops_cuda.h"
#include "kernels/index_math.h"

namespace octet::kernels::cuda {
namespace {

constexpr int kMaxDims = 8;
constexpr int kTile = 32;      // transpose tile side
constexpr int kTileRows = 8;   // threads along a tile's second side

// The grid-stride loops count in uint32_t (cheaper divisions) up to this many units, and in
// uint64_t above. Both i < n and i + the grid stride must fit 32 bits: blocks_for caps the grid at
// 65535·8 blocks of 256 threads (2^27 threads), so with n above 2^32 - 2^27 a thread's last step
// wrapped past 2^32 to a small index below n and the loop went round again (at n = 2^32 - 2^20,
// some 32,000 passes over the same elements instead of 32). Below 2^31 the sum stays under
// 2^31 + 2^27.
constexpr int64_t kMax32BitUnits = INT32_MAX;

// The widest unit (16, 8, 4, 2 or 1 bytes, at least `elem`) dividing every length and address given.
size_t widest_unit(size_t elem, std::initializer_list<int64_t> lengths, std::initializer_list<const void*> ptrs) {
  size_t unit = 16;
  auto fits = [&](size_t u) {
    for (int64_t len : lengths)
      if (len % static_cast<int64_t>(u) != 0) return false;
    for (const void* p : ptrs)
      if (reinterpret_cast<uintptr_t>(p) % u != 0) return false;
    return true;
  };
  while (unit > elem && !fits(unit)) unit /= 2;
  return unit;
}

// Calls f.template operator()<U>() with U an unsigned type (or uint4) of `bytes` bytes.
template <class F>
void with_unit(size_t bytes, const char* op, F&& f) {
  switch (bytes) {
    case 1: return f.template operator()<uint8_t>();
    case 2: return f.template operator()<uint16_t>();
    case 4: return f.template operator()<uint32_t>();
    case 8: return f.template operator()<uint64_t>();
    case 16: return f.template operator()<uint4>();
    default: OCTET_FAIL(op, ": no CUDA copy for ", bytes, "-byte elements");
  }
}

// ---- permute -------------------------------------------------------------------------------------
using Walk = PermuteWalk;  // kernels/index_math.h

// Input offsets of a contiguous output walked in row-major order.
template <class Index>
struct Gather {
  int ndim = 0;
  Index extent[kMaxDims];
  Index in_stride[kMaxDims];

  __device__ __forceinline__ Index offset(Index i) const {
    Index off = 0;
#pragma unroll
    for (int d = kMaxDims - 1; d >= 0; --d) {
      if (d >= ndim) continue;
      const Index q = i / extent[d];
      off += (i - q * extent[d]) * in_stride[d];
      i = q;
    }
    return off;
  }
};

// out[i] = in[g.offset(i)] for n units U. Reads and writes n units; with the innermost run
// contiguous on both sides, consecutive threads read consecutive units.
template <class U, class Index>
__global__ void gather_units(const U* in, U* out, Index n, Gather<Index> g) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = in[g.offset(i)];
}

// Geometry of a permute that transposes: dim a is contiguous in the input, dim b in the output;
// the other dims form a batch.
struct Transpose {
  int64_t a_ext, b_ext, a_out_stride, b_in_stride, tiles_a, tiles_b, tiles;
  int batch_ndim;
  int64_t batch_extent[kMaxDims], batch_in[kMaxDims], batch_out[kMaxDims];
};

// One kTile×kTile tile per block iteration through shared memory: reads along a (coalesced in the
// input), writes along b (coalesced in the output). Reads and writes every element once.
template <class E>
__global__ void transpose_tiles(const E* in, E* out, Transpose t) {
  __shared__ E tile[kTile][kTile + 1];
  for (int64_t blk = blockIdx.x; blk < t.tiles; blk += gridDim.x) {
    int64_t rest = blk / (t.tiles_a * t.tiles_b);
    const int64_t in_tile = blk % (t.tiles_a * t.tiles_b);
    const int64_t a0 = (in_tile / t.tiles_b) * kTile, b0 = (in_tile % t.tiles_b) * kTile;
    int64_t in_base = 0, out_base = 0;
    for (int d = t.batch_ndim - 1; d >= 0; --d) {
      const int64_t idx = rest % t.batch_extent[d];
      rest /= t.batch_extent[d];
      in_base += idx * t.batch_in[d];
      out_base += idx * t.batch_out[d];
    }
#pragma unroll
    for (int j = 0; j < kTile; j += kTileRows) {
      const int64_t a = a0 + threadIdx.x, b = b0 + threadIdx.y + j;
      if (a < t.a_ext && b < t.b_ext) tile[threadIdx.y + j][threadIdx.x] = in[in_base + a + b * t.b_in_stride];
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kTile; j += kTileRows) {
      const int64_t a = a0 + threadIdx.y + j, b = b0 + threadIdx.x;
      if (a < t.a_ext && b < t.b_ext) out[out_base + a * t.a_out_stride + b] = tile[threadIdx.x][threadIdx.y + j];
    }
    __syncthreads();
  }
}

template <class U>
void launch_gather(const void* in, void* out, const Walk& w, int64_t n, cudaStream_t stream) {
  auto launch = [&]<class Index>() {
    Gather<Index> g;
    g.ndim = static_cast<int>(w.extent.size());
    for (int d = 0; d < g.ndim; ++d) {
      g.extent[d] = static_cast<Index>(w.extent[d]);
      g.in_stride[d] = static_cast<Index>(w.in_stride[d]);
    }
    gather_units<U, Index><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const U*>(in), static_cast<U*>(out),
                                                                  static_cast<Index>(n), g);
  };
  if (n <= kMax32BitUnits) launch.template operator()<uint32_t>();
  else launch.template operator()<uint64_t>();
}

// ---- row copies ----------------------------------------------------------------------------------------

// dst row r = src row r, in units U: rows·units_per_row units read and written.
template <class U, class Index>
__global__ void copy_rows_units(const U* src, Index src_stride, U* dst, Index dst_stride, Index units_per_row, Index n) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const Index r = i / units_per_row, u = i - r * units_per_row;
    dst[r * dst_stride + u] = src[r * src_stride + u];
  }
}

// dst row r = zeros, src's row r at [band_begin, band_end), zeros; in units U. Writes every dst
// unit once and reads the band once.
template <class U, class Index>
__global__ void place_band_units(const U* src, U* dst, Index units_per_row, Index band_begin, Index band_units, Index n) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const Index r = i / units_per_row, u = i - r * units_per_row;
    U value{};
    if (u >= band_begin && u - band_begin < band_units) value = src[r * band_units + (u - band_begin)];
    dst[i] = value;
  }
}

// out[(o·n + j)·inner + c] = x[(o·extent + indices[j])·inner + c], in units U (inner counted in
// units). Reads and writes outer·n·inner units.
template <class U>
__global__ void gather_rows_units(const U* x, U* out, const int64_t* indices, int64_t n, int64_t extent, int64_t inner,
                                  int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t row = i / inner, c = i - row * inner;
    const int64_t o = row / n, j = row - o * n;
    out[i] = x[(o * extent + indices[j]) * inner + c];
  }
}

// out[o, e, c] = sum over p in [offsets[e], offsets[e + 1]) of grad[o, positions[p], c], in f32 and
// in index order; rows no index points at become zeros. Reads grad once, writes out once.
template <class T>
__global__ void scatter_add_rows_csr(const T* grad, T* out, const int64_t* offsets, const int64_t* positions, int64_t n,
                                     int64_t extent, int64_t inner, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t row = i / inner, c = i - row * inner;
    const int64_t o = row / extent, e = row - o * extent;
    float acc = 0.f;
    for (int64_t p = offsets[e]; p < offsets[e + 1]; ++p) acc += to_float(grad[(o * n + positions[p]) * inner + c]);
    out[i] = from_float<T>(acc);
  }
}

}  // namespace

void permute(Device device, const void* in, void* out, const Shape& in_shape, const std::vector<int64_t>& dims,
             size_t elem) {
  const int64_t numel = in_shape.numel();
  if (numel == 0) return;
  cudaStream_t stream = octet::cuda::launch_stream(device.index);
  Walk w = simplify_permute(in_shape, dims);
  if (w.extent.size() <= 1) {  // an identity on memory
    octet::cuda::check(cudaMemcpyAsync(out, in, static_cast<size_t>(numel) * elem, cudaMemcpyDeviceToDevice, stream),
                       "permute (cudaMemcpyAsync)");
    return;
  }
  OCTET_CHECK(w.extent.size() <= kMaxDims, "permute: the CUDA kernel moves at most ", kMaxDims,
              " dims once size-1 dims are dropped and neighbours merged; input shape ", in_shape,
              " needs ", w.extent.size(), ". Reshape to fewer dims first");
  const int64_t n = static_cast<int64_t>(w.extent.size()), last = n - 1;
  const int64_t c = std::find(w.in_stride.begin(), w.in_stride.end(), 1) - w.in_stride.begin();
  OCTET_CHECK(c < n, "permute: internal error, no unit-stride dim");

  if (c == last) {
    // The innermost run is contiguous on both sides: move it in the widest units it allows. Every
    // other stride is a multiple of the run, so it converts to units exactly.
    const int64_t run_bytes = w.extent[last] * static_cast<int64_t>(elem);
    const size_t unit = widest_unit(elem, {run_bytes}, {in, out});
    const int64_t scale = static_cast<int64_t>(unit / elem);
    w.extent[last] /= scale;
    for (int64_t k = 0; k < last; ++k) w.in_stride[k] /= scale;
    const int64_t units = numel / scale;
    with_unit(unit, "permute", [&]<class U>() { launch_gather<U>(in, out, w, units, stream); });
    octet::cuda::check(cudaGetLastError(), "permute (kernel launch)");
    return;
  }

  std::vector<int64_t> out_stride(n);
  int64_t s = 1;
  for (int64_t k = n - 1; k >= 0; --k) {
    out_stride[k] = s;
    s *= w.extent[k];
  }
  Transpose t{};
  t.a_ext = w.extent[c];
  t.b_ext = w.extent[last];
  t.a_out_stride = out_stride[c];
  t.b_in_stride = w.in_stride[last];
  t.tiles_a = (t.a_ext + kTile - 1) / kTile;
  t.tiles_b = (t.b_ext + kTile - 1) / kTile;
  t.batch_ndim = 0;
  int64_t batch = 1;
  for (int64_t k = 0; k < last; ++k) {
    if (k == c) continue;
    t.batch_extent[t.batch_ndim] = w.extent[k];
    t.batch_in[t.batch_ndim] = w.in_stride[k];
    t.batch_out[t.batch_ndim] = out_stride[k];
    ++t.batch_ndim;
    batch *= w.extent[k];
  }
  t.tiles = batch * t.tiles_a * t.tiles_b;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(t.tiles, 65535 * 8));
  with_unit(elem, "permute", [&]<class U>() {
    transpose_tiles<U><<<blocks, dim3(kTile, kTileRows), 0, stream>>>(static_cast<const U*>(in), static_cast<U*>(out), t);
  });
  octet::cuda::check(cudaGetLastError(), "permute (kernel launch)");
}

void copy_rows(Device device, const void* src, int64_t src_stride, void* dst, int64_t dst_stride, int64_t rows,
               int64_t row_bytes) {
  if (rows == 0 || row_bytes == 0) return;
  cudaStream_t stream = octet::cuda::launch_stream(device.index);
  if ((src_stride == row_bytes && dst_stride == row_bytes) || rows == 1) {  // one block on both sides
    octet::cuda::check(cudaMemcpyAsync(dst, src, static_cast<size_t>(rows * row_bytes), cudaMemcpyDeviceToDevice, stream),
                       "copy_rows (cudaMemcpyAsync)");
    return;
  }
  const size_t unit = widest_unit(1, {row_bytes, src_stride, dst_stride}, {src, dst});
  const auto u = static_cast<int64_t>(unit);
  const int64_t n = rows * (row_bytes / u);
  with_unit(unit, "copy_rows", [&]<class U>() {
    auto launch = [&]<class Index>() {
      copy_rows_units<U, Index><<<blocks_for(n), kThreads, 0, stream>>>(
          static_cast<const U*>(src), static_cast<Index>(src_stride / u), static_cast<U*>(dst),
          static_cast<Index>(dst_stride / u), static_cast<Index>(row_bytes / u), static_cast<Index>(n));
    };
    // Offsets reach rows·stride, which can exceed n when the strides are wide (and n <= reach).
    const int64_t reach = rows * std::max(src_stride, dst_stride) / u;
    if (reach <= kMax32BitUnits) launch.template operator()<uint32_t>();
    else launch.template operator()<uint64_t>();
  });
  octet::cuda::check(cudaGetLastError(), "copy_rows (kernel launch)");
}

void place_band(Device device, const void* src, int64_t rows, int64_t row_bytes, int64_t band_begin, int64_t band_bytes,
                void* dst) {
  if (rows * row_bytes == 0) return;
  cudaStream_t stream = octet::cuda::launch_stream(device.index);
  const size_t unit = widest_unit(1, {row_bytes, band_begin, band_bytes}, {src, dst});
  const auto u = static_cast<int64_t>(unit);
  const int64_t n = rows * row_bytes / u;
  with_unit(unit, "slice_backward", [&]<class U>() {
    auto launch = [&]<class Index>() {
      place_band_units<U, Index><<<blocks_for(n), kThreads, 0, stream>>>(
          static_cast<const U*>(src), static_cast<U*>(dst), static_cast<Index>(row_bytes / u),
          static_cast<Index>(band_begin / u), static_cast<Index>(band_bytes / u), static_cast<Index>(n));
    };
    if (n <= kMax32BitUnits) launch.template operator()<uint32_t>();
    else launch.template operator()<uint64_t>();
  });
  octet::cuda::check(cudaGetLastError(), "slice_backward (kernel launch)");
}

void gather_rows(Device device, const void* x, void* out, int64_t outer, int64_t extent, int64_t inner,
                 const std::vector<int64_t>& indices, size_t elem) {
  const int64_t n = static_cast<int64_t>(indices.size());
  if (outer * n * inner == 0) return;
  const Tensor idx = from_vector(indices, {n}, DType::i64, device);
  cudaStream_t stream = octet::cuda::launch_stream(device.index);
  const int64_t row_bytes = inner * static_cast<int64_t>(elem);
  const size_t unit = widest_unit(elem, {row_bytes}, {x, out});
  const int64_t inner_units = row_bytes / static_cast<int64_t>(unit), total = outer * n * inner_units;
  with_unit(unit, "index_select", [&]<class U>() {
    gather_rows_units<U><<<blocks_for(total), kThreads, 0, stream>>>(static_cast<const U*>(x), static_cast<U*>(out),
                                                                    ptr<int64_t>(idx), n, extent, inner_units, total);
  });
  octet::cuda::check(cudaGetLastError(), "index_select (kernel launch)");
}

Tensor scatter_add_rows(const Tensor& grad_in, const Shape& full_shape, int64_t outer, int64_t extent, int64_t inner,
                        const std::vector<int64_t>& indices) {
  constexpr const char* op = "index_select_backward";
  if (is_fp8(grad_in.dtype())) {
    return scatter_add_rows(grad_in.detach().to(DType::f32), full_shape, outer, extent, inner, indices)
        .to(grad_in.dtype());
  }
  const Tensor& grad = grad_in;
  const int64_t n = static_cast<int64_t>(indices.size());
  // For each target row e, the positions j with indices[j] == e in increasing order (CSR).
  std::vector<int64_t> table(static_cast<size_t>(extent + 1 + n), 0);
  for (int64_t e : indices) ++table[static_cast<size_t>(e + 1)];
  for (int64_t e = 0; e < extent; ++e) table[e + 1] += table[e];
  std::vector<int64_t> fill(table.begin(), table.begin() + extent);
  for (int64_t j = 0; j < n; ++j) table[static_cast<size_t>(extent + 1 + fill[indices[j]]++)] = j;
  const Tensor csr = from_vector(table, {static_cast<int64_t>(table.size())}, DType::i64, grad.device());

  Tensor out = empty(full_shape, grad.dtype(), grad.device());
  const int64_t total = outer * extent * inner;
  if (total == 0) return out;
  dispatch_floating(grad.dtype(), op, [&]<class T>() {
    const int64_t* offsets = ptr<int64_t>(csr);
    scatter_add_rows_csr<T><<<blocks_for(total), kThreads, 0, stream_for(grad)>>>(
        ptr<T>(grad), ptr<T>(out), offsets, offsets + extent + 1, n, extent, inner, total);
  });
  check_launch(op);
  return out;
}

}  // namespace octet::kernels::cuda
