// GELU forward and backward on the GPU, erf and tanh forms: the element arithmetic is in
// gelu_elements.cuh (shared with the GELU writing FP8, gelu_fp8.cu), mapped over the tensors here.
// Elementwise: 16-byte packs while every pointer is 16-byte aligned, scalars for the tail.
// Bytes per element: forward reads x, writes y (2·sizeof(T)); backward reads dy, x, writes dx (3·sizeof(T)).
// The backward that also makes the forward's output again (gelu_backward_and_forward) can sum dx's
// columns as it stores them, for the bias gradient of the Linear whose output x is: then it walks the
// rows in bands of 64 (a 2-D grid) instead of the flat grid-stride walk.
#include <algorithm>
#include <optional>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_cast_tiles.cuh"
#include "kernels/cuda/gelu_elements.cuh"
#include "kernels/cuda/nn_ops_cuda.h"

namespace octet::kernels::cuda {
namespace {

// The grid-stride walk of both kernels below: with `vectorized`, pack(e) for the first element e of
// each 16-byte pack of T, then element(i) for the elements past the last whole pack; otherwise
// element(i) for every element.
template <class T, class PackFn, class ElementFn>
__device__ __forceinline__ void grid_stride(int64_t n, bool vectorized, PackFn pack, ElementFn element) {
  constexpr int N = Pack<T>::N;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t tid = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  int64_t scalar_from = 0;
  if (vectorized) {
    const int64_t packs = n / N;
    for (int64_t p = tid; p < packs; p += stride) pack(p * N);
    scalar_from = packs * N;
  }
  for (int64_t i = scalar_from + tid; i < n; i += stride) element(i);
}

// out[i] = op(a[i], b[i]) (b ignored when kBinary is false).
template <class T, bool kBinary, class Op>
__global__ void map_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int64_t n,
                           bool vectorized, Op op) {
  grid_stride<T>(
      n, vectorized,
      [&](int64_t e) {
        const Pack<T> pa = load_pack(a + e);
        Pack<T> pb{};
        if constexpr (kBinary) pb = load_pack(b + e);
        Pack<T> o;
#pragma unroll
        for (int k = 0; k < Pack<T>::N; ++k) {
          o.v[k] = from_float<T>(op(to_float(pa.v[k]), kBinary ? to_float(pb.v[k]) : 0.f));
        }
        store_pack(out + e, o);
      },
      [&](int64_t i) { out[i] = from_float<T>(op(to_float(a[i]), kBinary ? to_float(b[i]) : 0.f)); });
}

template <bool kBinary, class Op, class T>
void launch_map(const Tensor& a, const Tensor& b, const Tensor& out, Op op, const char* what) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const bool vectorized = aligned16(a.data_ptr()) && aligned16(out.data_ptr()) && (!kBinary || aligned16(b.data_ptr()));
  const int64_t work = vectorized ? (n + Pack<T>::N - 1) / Pack<T>::N : n;
  // Bytes: reads a (and b), writes out. ViT-H's MLP, 12,608 × 5120 bf16: forward 258.2 MB, 60.0 µs at
  // 4.3 TB/s; backward 387.3 MB, 90.1 µs. The bf16 loop over a 16-byte pack is 152 (forward) and 175
  // (backward) PTX instructions, 19 and 22 per element with the erf form's 16-bit arithmetic
  // (gelu_elements.cuh), each instruction per element ~1.9 µs at that size: under the bytes' time.
  map_kernel<T, kBinary, Op><<<blocks_for(work), kThreads, 0, stream_for(out)>>>(
      ptr<T>(a), kBinary ? ptr<T>(b) : nullptr, ptr<T>(out), n, vectorized, op);
  check_launch(what);
}

// dx[i] = Back(dy[i], x[i]) and y[i] = Fwd(x[i]) in one pass: the functors gelu_backward and
// gelu_forward map, on the same loaded values, so both outputs are those calls' bits. dx may be dy (in
// place): each element is read before it is written, by the same thread, so dy and dx are not
// __restrict__.
template <class T, class Back, class Fwd>
__global__ void gelu_backward_and_forward_kernel(const T* dy, const T* __restrict__ x, T* dx, T* __restrict__ y,
                                                 int64_t n, bool vectorized, Back back, Fwd fwd) {
  grid_stride<T>(
      n, vectorized,
      [&](int64_t e) {
        const Pack<T> pd = load_pack(dy + e), px = load_pack(x + e);
        Pack<T> od, oy;
#pragma unroll
        for (int k = 0; k < Pack<T>::N; ++k) {
          const float xv = to_float(px.v[k]);
          od.v[k] = from_float<T>(back(to_float(pd.v[k]), xv));
          oy.v[k] = from_float<T>(fwd(xv, 0.f));
        }
        store_pack(dx + e, od);
        store_pack(y + e, oy);
      },
      [&](int64_t i) {
        const float xv = to_float(x[i]), d = to_float(dy[i]);
        dx[i] = from_float<T>(back(d, xv));
        y[i] = from_float<T>(fwd(xv, 0.f));
      });
}

template <class T, bool kTanh>
void launch_backward_and_forward(const Tensor& dy, const Tensor& x, const Tensor& dx, const Tensor& y, const char* op) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const bool vectorized =
      aligned16(dy.data_ptr()) && aligned16(x.data_ptr()) && aligned16(dx.data_ptr()) && aligned16(y.data_ptr());
  const int64_t work = vectorized ? (n + Pack<T>::N - 1) / Pack<T>::N : n;
  // Bytes: reads dy and x, writes dx and y. ViT-H's MLP, 12,608 × 5120 bf16: 516.4 MB, 120 µs at
  // 4.3 TB/s, where gelu_backward then gelu_forward move 645.5 MB (150 µs): one read of x fewer.
  gelu_backward_and_forward_kernel<T><<<blocks_for(work), kThreads, 0, stream_for(x)>>>(
      ptr<T>(dy), ptr<T>(x), ptr<T>(dx), ptr<T>(y), n, vectorized, GeluBackwardOf<T, kTanh>{}, GeluForwardOf<T, kTanh>{});
  check_launch(op);
}

// ---- with the bias gradient: a 2-D walk that sums the columns as it stores dx ------------------------

// V consecutive elements of a row: one 16-byte pack (V = Pack<T>::N) or one element (V = 1).
template <class T, int V>
struct Run {
  static_assert(V == 1 || V == Pack<T>::N, "a pack or one element");
  T v[V];
};
template <class T, int V>
__device__ __forceinline__ Run<T, V> load_run(const T* p) {
  if constexpr (V == 1) {
    return {{*p}};
  } else {
    const Pack<T> pack = load_pack(p);
    Run<T, V> r;
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = pack.v[k];
    return r;
  }
}
template <class T, int V>
__device__ __forceinline__ void store_run(T* p, const Run<T, V>& r) {
  if constexpr (V == 1) {
    *p = r.v[0];
  } else {
    Pack<T> pack;
#pragma unroll
    for (int k = 0; k < V; ++k) pack.v[k] = r.v[k];
    store_pack(p, pack);
  }
}

// The grid is 2-D and every block does the same work, so it must fit the SMs at once: ViT-H's MLP
// (12,608 × 5120 bf16) is 5 column groups × 197 bands = 985 blocks, and at 8 blocks an SM (at most 64
// registers; bf16 with the erf form needs 64 unconstrained, the tanh form spills 26 bytes) 132 SMs
// hold 1056. At 5 an SM (the 95 registers of 4 rows in flight, the first build) they would take 1.5
// waves, the second half empty. 2 rows in flight: 8 blocks × 128 threads × 2 rows × 32 bytes = 64 KB of loads per SM.
constexpr int kBandRows = kTile;  // rows per band: column_partials_for's row band
constexpr int kBandThreads = 128;
constexpr int kBandUnroll = 2;  // rows whose loads a thread has in flight at once
constexpr int kBandBlocksPerSm = 8;

// gelu_backward_and_forward_kernel's outputs (the same functors on the same loaded values: the same
// bits), plus partials[band, c] = the f32 sum, in row order, of dx[r, c] as stored (rounded to T, what
// kernels::sum would read) over the band's kBandRows rows. A block is kBandThreads threads side by side
// over kBandThreads·V columns (a warp's loads: 32 consecutive 16-byte runs of one row, 512 bytes) and
// walks down a band, kBandUnroll rows' loads in flight per thread; blockIdx.y strides over the bands.
// V > 1: cols % V == 0 and every pointer 16-byte aligned. dx may be dy, as in the kernel above.
template <class T, int V, class Back, class Fwd>
__global__ void __launch_bounds__(kBandThreads, kBandBlocksPerSm)
    gelu_backward_and_forward_dbias_kernel(const T* dy, const T* __restrict__ x, T* dx, T* __restrict__ y,
                                           int64_t rows, int64_t cols, float* __restrict__ partials, Back back,
                                           Fwd fwd) {
  const int64_t c = (int64_t{blockIdx.x} * kBandThreads + threadIdx.x) * V;
  if (c >= cols) return;
  const int64_t bands = (rows + kBandRows - 1) / kBandRows;
  for (int64_t band = blockIdx.y; band < bands; band += gridDim.y) {
    const int64_t r0 = band * kBandRows, r_end = r0 + kBandRows < rows ? r0 + kBandRows : rows;
    float sum[V];
#pragma unroll
    for (int k = 0; k < V; ++k) sum[k] = 0.f;
    for (int64_t r = r0; r < r_end; r += kBandUnroll) {
      Run<T, V> rd[kBandUnroll], rx[kBandUnroll];
#pragma unroll
      for (int u = 0; u < kBandUnroll; ++u) {
        if (r + u < r_end) {
          rd[u] = load_run<T, V>(dy + (r + u) * cols + c);
          rx[u] = load_run<T, V>(x + (r + u) * cols + c);
        }
      }
#pragma unroll
      for (int u = 0; u < kBandUnroll; ++u) {
        if (r + u < r_end) {
          Run<T, V> od, oy;
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const float xv = to_float(rx[u].v[k]);
            od.v[k] = from_float<T>(back(to_float(rd[u].v[k]), xv));
            oy.v[k] = from_float<T>(fwd(xv, 0.f));
            sum[k] = __fadd_rn(sum[k], to_float(od.v[k]));
          }
          store_run<T, V>(dx + (r + u) * cols + c, od);
          store_run<T, V>(y + (r + u) * cols + c, oy);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < V; ++k) partials[band * cols + c + k] = sum[k];
  }
}

template <class T, bool kTanh>
void launch_backward_and_forward_dbias(const Tensor& dy, const Tensor& x, const Tensor& dx, const Tensor& y,
                                       const Tensor& partials, int64_t rows, int64_t cols, const char* op) {
  if (rows == 0 || cols == 0) return;
  constexpr int N = Pack<T>::N;
  const bool vectorized = cols % N == 0 && aligned16(dy.data_ptr()) && aligned16(x.data_ptr()) &&
                          aligned16(dx.data_ptr()) && aligned16(y.data_ptr());
  const int64_t bands = (rows + kBandRows - 1) / kBandRows;
  const int v = vectorized ? N : 1;
  const dim3 grid(static_cast<unsigned>((cols + int64_t{kBandThreads} * v - 1) / (int64_t{kBandThreads} * v)),
                  static_cast<unsigned>(std::min<int64_t>(bands, 65535)));
  // Bytes: launch_backward_and_forward's, plus the partials (4 bytes per column per 64 rows) written here
  // and read back by dbias_from_column_partials. fc1's output gradient in ViT-H's MLP, 12,608 × 5120
  // bf16: 516.4 MB + 2 × 4.0 MB = 524.5 MB, 122 µs at 4.3 TB/s, where the wgrad GEMM's BGRADB epilogue
  // read dpre again (129.1 MB, in cuBLASLt's own kernel: 29 µs a launch on average, measured). The grid:
  // 5 column groups × 197 bands = 985 blocks of 128 threads, 7-8 an SM, all resident at once (above).
  const GeluBackwardOf<T, kTanh> back{};
  const GeluForwardOf<T, kTanh> fwd{};
  if (vectorized) {
    gelu_backward_and_forward_dbias_kernel<T, N><<<grid, kBandThreads, 0, stream_for(x)>>>(
        ptr<T>(dy), ptr<T>(x), ptr<T>(dx), ptr<T>(y), rows, cols, ptr<float>(partials), back, fwd);
  } else {
    gelu_backward_and_forward_dbias_kernel<T, 1><<<grid, kBandThreads, 0, stream_for(x)>>>(
        ptr<T>(dy), ptr<T>(x), ptr<T>(dx), ptr<T>(y), rows, cols, ptr<float>(partials), back, fwd);
  }
  check_launch(op);
}

}  // namespace

Tensor gelu_forward(const Tensor& x, GeluApproximation approximation) {
  constexpr const char* op = "gelu_forward";
  Tensor y = empty(x.shape(), x.dtype(), x.device());
  dispatch_floating(x.dtype(), op, [&]<class T>() {
    if (approximation == GeluApproximation::Tanh) launch_map<false, GeluForwardOf<T, true>, T>(x, x, y, {}, op);
    else launch_map<false, GeluForwardOf<T, false>, T>(x, x, y, {}, op);
  });
  return y;
}

Tensor gelu_backward(const Tensor& dy, const Tensor& x, GeluApproximation approximation) {
  constexpr const char* op = "gelu_backward";
  Tensor dx = empty(x.shape(), x.dtype(), x.device());
  dispatch_floating(x.dtype(), op, [&]<class T>() {
    if (approximation == GeluApproximation::Tanh) launch_map<true, GeluBackwardOf<T, true>, T>(dy, x, dx, {}, op);
    else launch_map<true, GeluBackwardOf<T, false>, T>(dy, x, dx, {}, op);
  });
  return dx;
}

GeluGradAndOutput gelu_backward_and_forward(const Tensor& dy, const Tensor& x, GeluApproximation approximation,
                                            bool dx_into_dy, std::optional<DType> dbias_dtype) {
  constexpr const char* op = "gelu_backward_and_forward";
  GeluGradAndOutput r{dx_into_dy ? dy : empty(x.shape(), x.dtype(), x.device()), empty(x.shape(), x.dtype(), x.device())};
  const bool tanh_form = approximation == GeluApproximation::Tanh;
  if (!dbias_dtype) {
    dispatch_floating(x.dtype(), op, [&]<class T>() {
      if (tanh_form) launch_backward_and_forward<T, true>(dy, x, r.dx, r.y, op);
      else launch_backward_and_forward<T, false>(dy, x, r.dx, r.y, op);
    });
    return r;
  }
  const int64_t cols = x.dim() == 0 ? 1 : x.size(-1), rows = cols == 0 ? 0 : x.numel() / cols;
  const Tensor partials = column_partials_for(x.device(), rows, cols, /*transposed=*/false, rows);
  dispatch_floating(x.dtype(), op, [&]<class T>() {
    if (tanh_form) launch_backward_and_forward_dbias<T, true>(dy, x, r.dx, r.y, partials, rows, cols, op);
    else launch_backward_and_forward_dbias<T, false>(dy, x, r.dx, r.y, partials, rows, cols, op);
  });
  // dx has x's dtype: its column sums are rounded to it, as kernels::sum returns them, then to dbias's;
  // an f32 dbias keeps the f32 sums (kernels/nn_ops.h).
  const DType through = *dbias_dtype == DType::f32 ? DType::f32 : x.dtype();
  r.dbias = dbias_from_column_partials(partials, cols, through, *dbias_dtype);
  return r;
}

}  // namespace octet::kernels::cuda
