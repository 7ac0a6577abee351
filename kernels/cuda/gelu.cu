// GELU forward and backward on the GPU, erf and tanh forms: the element arithmetic is in
// gelu_elements.cuh (shared with the GELU writing FP8, gelu_fp8.cu), mapped over the tensors here.
// Elementwise: 16-byte packs while every pointer is 16-byte aligned, scalars for the tail.
// Bytes per element: forward reads x, writes y (2·sizeof(T)); backward reads dy, x, writes dx (3·sizeof(T)).
#include "kernels/cuda/common.cuh"
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
                                            bool dx_into_dy) {
  constexpr const char* op = "gelu_backward_and_forward";
  GeluGradAndOutput r{dx_into_dy ? dy : empty(x.shape(), x.dtype(), x.device()), empty(x.shape(), x.dtype(), x.device())};
  dispatch_floating(x.dtype(), op, [&]<class T>() {
    if (approximation == GeluApproximation::Tanh) launch_backward_and_forward<T, true>(dy, x, r.dx, r.y, op);
    else launch_backward_and_forward<T, false>(dy, x, r.dx, r.y, op);
  });
  return r;
}

}  // namespace octet::kernels::cuda
