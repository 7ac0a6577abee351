// CUDA elementwise kernels: binary ops with NumPy broadcasting, unary and scalar ops, in-place
// accumulation, and the raw-element broadcast copy. See elementwise_cuda.h for precision rules.
#include <climits>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise_cuda.h"
#include "kernels/index_math.h"

namespace octet::kernels::cuda {
namespace {

using cpu::BinaryOp;
using cpu::ScalarOp;
using cpu::UnaryOp;

constexpr int kMaxDims = 8;

// The broadcast kernels count in uint32_t (cheaper divisions) up to this many elements, and in
// uint64_t above. Both i < n and i + the grid stride must fit 32 bits: blocks_for caps the grid at
// 65535·8 blocks of 256 threads (2^27 threads), so with n above 2^32 - 2^27 a thread's last step
// wrapped past 2^32 to a small index below n and the loop went round again (at n = 2^32 - 2^20,
// some 32,000 passes over the same elements instead of 32). Below 2^31 the sum stays under
// 2^31 + 2^27.
constexpr int64_t kMax32BitElements = INT32_MAX;

// ---- compute type ---------------------------------------------------------------------------------
// Floating storage computes in float; integers in their own type.
template <class T>
using Compute = std::conditional_t<std::is_integral_v<T>, T, float>;

template <class T>
__device__ __forceinline__ Compute<T> widen(T x) {
  if constexpr (std::is_integral_v<T>) return x;
  else return to_float(x);
}
template <class T>
__device__ __forceinline__ T narrow(Compute<T> x) {
  if constexpr (std::is_integral_v<T>) return x;
  else return from_float<T>(x);
}

// Integer arithmetic in the unsigned type so overflow wraps (as on the CPU) instead of being UB.
template <class C>
__device__ __forceinline__ C wrap_add(C x, C y) {
  if constexpr (std::is_integral_v<C>) return static_cast<C>(std::make_unsigned_t<C>(x) + std::make_unsigned_t<C>(y));
  else return __fadd_rn(x, y);
}
template <class C>
__device__ __forceinline__ C wrap_sub(C x, C y) {
  if constexpr (std::is_integral_v<C>) return static_cast<C>(std::make_unsigned_t<C>(x) - std::make_unsigned_t<C>(y));
  else return __fsub_rn(x, y);
}
template <class C>
__device__ __forceinline__ C wrap_mul(C x, C y) {
  if constexpr (std::is_integral_v<C>) return static_cast<C>(std::make_unsigned_t<C>(x) * std::make_unsigned_t<C>(y));
  else return __fmul_rn(x, y);  // _rn: never fused into an FMA, so a·s + b rounds twice as on the CPU
}
template <class C>
__device__ __forceinline__ bool is_nan(C x) {
  if constexpr (std::is_integral_v<C>) return false;
  else return isnan(x);
}

// ---- the ops (kernels/cpu/elementwise.cpp has the same definitions) --------------------------------
struct Add {
  template <class C> __device__ C operator()(C x, C y) const { return wrap_add(x, y); }
};
struct Sub {
  template <class C> __device__ C operator()(C x, C y) const { return wrap_sub(x, y); }
};
struct Mul {
  template <class C> __device__ C operator()(C x, C y) const { return wrap_mul(x, y); }
};
struct Div {  // floating only (the entry point refuses integers)
  __device__ float operator()(float x, float y) const { return __fdiv_rn(x, y); }
};
struct Pow {  // floating only
  __device__ float operator()(float x, float y) const { return powf(x, y); }
};
struct Maximum {  // NaN in either operand wins, as in torch.maximum
  template <class C> __device__ C operator()(C x, C y) const { return (x > y || is_nan(x)) ? x : y; }
};

struct Neg {
  template <class C> __device__ C operator()(C x) const {
    if constexpr (std::is_integral_v<C>) return wrap_sub(C(0), x);
    else return -x;
  }
};
struct Exp {
  __device__ float operator()(float x) const { return expf(x); }
};
struct Log {
  __device__ float operator()(float x) const { return logf(x); }
};
struct Tanh {
  __device__ float operator()(float x) const { return tanhf(x); }
};
struct Sqrt {
  __device__ float operator()(float x) const { return __fsqrt_rn(x); }
};
struct Rsqrt {  // 1/sqrt, both correctly rounded as on the CPU (rsqrtf is approximate)
  __device__ float operator()(float x) const { return __fdiv_rn(1.f, __fsqrt_rn(x)); }
};
struct Abs {
  template <class C> __device__ C operator()(C x) const {
    if constexpr (std::is_integral_v<C>) return x < 0 ? Neg{}(x) : x;
    else return fabsf(x);
  }
};
struct Sign {  // NaN stays NaN
  template <class C> __device__ C operator()(C x) const {
    return is_nan(x) ? x : static_cast<C>((x > C(0)) - (x < C(0)));
  }
};

// A binary op with one operand fixed: x op s, or s op x.
template <class Op, class C, bool kScalarFirst>
struct WithScalar {
  Op op;
  C s;
  __device__ C operator()(C x) const {
    if constexpr (kScalarFirst) return op(s, x);
    else return op(x, s);
  }
};

// ---- dtype dispatch --------------------------------------------------------------------------------
// Calls f.template operator()<T>() with the storage type of a dtype the kernels take.
template <class F>
decltype(auto) dispatch_arith(DType dtype, const char* op, bool integers, F&& f) {
  switch (dtype) {
    case DType::f32: return f.template operator()<float>();
    case DType::bf16: return f.template operator()<__nv_bfloat16>();
    case DType::f16: return f.template operator()<__half>();
    case DType::i32:
      if (integers) return f.template operator()<int32_t>();
      break;
    case DType::i64:
      if (integers) return f.template operator()<int64_t>();
      break;
    default: break;
  }
  OCTET_FAIL(op, ": the CUDA kernel takes f32, bf16 or f16", integers ? " (or i32, i64)" : "", ", got ",
             dtype_name(dtype), "; convert with .to(DType::f32) first, or run on the cpu");
}

// ---- broadcasting geometry -------------------------------------------------------------------------
// Element strides of kOps operands read as the output's shape (0 along broadcast dims), with
// size-1 dims dropped and neighbouring dims merged wherever every operand continues contiguously,
// so a bias add [B, S, C] + [C] walks 2 dims. Index is uint32_t while the output has at most
// kMax32BitElements elements, which makes the per-element divisions cheap.
template <class Index, int kOps>
struct StridedIndex {
  int ndim = 0;
  Index extent[kMaxDims];
  Index stride[kOps][kMaxDims];

  // Offsets into each operand of output element i.
  __device__ __forceinline__ void offsets(Index i, Index (&off)[kOps]) const {
#pragma unroll
    for (int k = 0; k < kOps; ++k) off[k] = 0;
#pragma unroll
    for (int d = kMaxDims - 1; d >= 0; --d) {
      if (d >= ndim) continue;
      const Index q = i / extent[d], r = i - q * extent[d];
#pragma unroll
      for (int k = 0; k < kOps; ++k) off[k] += r * stride[k][d];
      i = q;
    }
  }
};

template <class Index, int kOps>
StridedIndex<Index, kOps> strided_index(const Shape& out, const Shape* const (&operands)[kOps], const char* op) {
  std::vector<int64_t> strides[kOps];
  for (int k = 0; k < kOps; ++k) strides[k] = broadcast_strides(*operands[k], out);
  std::vector<int64_t> extent;
  std::vector<int64_t> merged[kOps];
  for (int64_t d = 0; d < out.ndim(); ++d) {
    if (out[d] == 1) continue;
    bool continues = !extent.empty();
    for (int k = 0; k < kOps && continues; ++k) continues = merged[k].back() == strides[k][d] * out[d];
    if (continues) {
      extent.back() *= out[d];
      for (int k = 0; k < kOps; ++k) merged[k].back() = strides[k][d];
    } else {
      extent.push_back(out[d]);
      for (int k = 0; k < kOps; ++k) merged[k].push_back(strides[k][d]);
    }
  }
  OCTET_CHECK(extent.size() <= kMaxDims, op, ": the CUDA kernel broadcasts over at most ", kMaxDims,
              " dims once contiguous dims are merged, got shape ", out, "; reshape the operands to fewer dims");
  StridedIndex<Index, kOps> index;
  index.ndim = static_cast<int>(extent.size());
  for (int d = 0; d < index.ndim; ++d) {
    index.extent[d] = static_cast<Index>(extent[d]);
    for (int k = 0; k < kOps; ++k) index.stride[k][d] = static_cast<Index>(merged[k][d]);
  }
  return index;
}

// ---- kernels ---------------------------------------------------------------------------------------

// out = op(a, b) over n elements of equal shapes, one 16-byte pack per access where all three
// pointers allow it. Reads 2n and writes n elements.
template <class T, class Op>
__global__ void binary_same_shape(const T* a, const T* b, T* out, int64_t n, bool vectorized, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vectorized) {
    constexpr int N = Pack<T>::N;
    const int64_t packs = n / N;
    for (int64_t p = first; p < packs; p += stride) {
      const Pack<T> x = load_pack(a + p * N), y = load_pack(b + p * N);
      Pack<T> r;
#pragma unroll
      for (int k = 0; k < N; ++k) r.v[k] = narrow<T>(op(widen(x.v[k]), widen(y.v[k])));
      store_pack(out + p * N, r);
    }
    done = packs * N;
  }
  for (int64_t i = done + first; i < n; i += stride) out[i] = narrow<T>(op(widen(a[i]), widen(b[i])));
}

// out = op(a, b) with a and b broadcast to out's shape by index arithmetic. Reads at most 2n
// elements (repeated reads of a broadcast operand mostly hit the cache) and writes n.
template <class T, class Op, class Index>
__global__ void binary_broadcast(const T* a, const T* b, T* out, Index n, StridedIndex<Index, 2> index, Op op) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    Index off[2];
    index.offsets(i, off);
    out[i] = narrow<T>(op(widen(a[off[0]]), widen(b[off[1]])));
  }
}

// out = op(a) over n elements (out may be a: in place). Reads n and writes n elements.
template <class T, class Op>
__global__ void map(const T* a, T* out, int64_t n, bool vectorized, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vectorized) {
    constexpr int N = Pack<T>::N;
    const int64_t packs = n / N;
    for (int64_t p = first; p < packs; p += stride) {
      Pack<T> x = load_pack(a + p * N);
#pragma unroll
      for (int k = 0; k < N; ++k) x.v[k] = narrow<T>(op(widen(x.v[k])));
      store_pack(out + p * N, x);
    }
    done = packs * N;
  }
  for (int64_t i = done + first; i < n; i += stride) out[i] = narrow<T>(op(widen(a[i])));
}

// N elements of one type moved with one aligned access.
template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// dst = dst + alpha·src, dst of storage type D and src of S, computed in D's compute type (src
// widened to it). Reads 2n elements and writes n.
template <class D, class S>
__global__ void axpy(D* dst, const S* src, Compute<D> alpha, int64_t n, bool vectorized) {
  constexpr int N = 16 / (sizeof(D) > sizeof(S) ? sizeof(D) : sizeof(S));
  using C = Compute<D>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vectorized) {
    const int64_t packs = n / N;
    for (int64_t p = first; p < packs; p += stride) {
      Vec<D, N> d = reinterpret_cast<const Vec<D, N>*>(dst)[p];
      const Vec<S, N> s = reinterpret_cast<const Vec<S, N>*>(src)[p];
#pragma unroll
      for (int k = 0; k < N; ++k) d.v[k] = narrow<D>(wrap_add(widen(d.v[k]), wrap_mul(alpha, static_cast<C>(widen(s.v[k])))));
      reinterpret_cast<Vec<D, N>*>(dst)[p] = d;
    }
    done = packs * N;
  }
  for (int64_t i = done + first; i < n; i += stride) {
    dst[i] = narrow<D>(wrap_add(widen(dst[i]), wrap_mul(alpha, static_cast<C>(widen(src[i])))));
  }
}

// out[i] = src[offset(i)]: the broadcast copy, on raw elements E. Reads at most n and writes n.
template <class E, class Index>
__global__ void broadcast_gather(const E* src, E* out, Index n, StridedIndex<Index, 1> index) {
  const Index stride = static_cast<Index>(gridDim.x) * blockDim.x;
  for (Index i = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    Index off[1];
    index.offsets(i, off);
    out[i] = src[off[0]];
  }
}

// ---- launchers ---------------------------------------------------------------------------------------

bool all_aligned16(std::initializer_list<const void*> ptrs) {
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

template <class T, class Op>
void launch_map(const Tensor& a, const Tensor& out, Op op, const char* name) {
  const int64_t n = a.numel();
  if (n == 0) return;
  const bool vec = all_aligned16({a.data_ptr(), out.data_ptr()});
  const int64_t items = vec ? n / Pack<T>::N + n % Pack<T>::N : n;
  map<T, Op><<<blocks_for(items), kThreads, 0, stream_for(a)>>>(ptr<T>(a), ptr<T>(out), n, vec, op);
  check_launch(name);
}

template <class T, class Op>
void launch_binary(const Tensor& a, const Tensor& b, const Tensor& out, Op op, const char* name) {
  const int64_t n = out.numel();
  if (n == 0) return;
  cudaStream_t stream = stream_for(out);
  if (a.numel() == n && b.numel() == n) {  // equal shapes up to leading 1s: same memory layout
    const bool vec = all_aligned16({a.data_ptr(), b.data_ptr(), out.data_ptr()});
    const int64_t items = vec ? n / Pack<T>::N + n % Pack<T>::N : n;
    binary_same_shape<T, Op><<<blocks_for(items), kThreads, 0, stream>>>(ptr<T>(a), ptr<T>(b), ptr<T>(out), n, vec, op);
  } else if (n <= kMax32BitElements) {
    const Shape* const operands[2] = {&a.shape(), &b.shape()};
    const auto index = strided_index<uint32_t, 2>(out.shape(), operands, name);
    binary_broadcast<T, Op, uint32_t><<<blocks_for(n), kThreads, 0, stream>>>(ptr<T>(a), ptr<T>(b), ptr<T>(out),
                                                                              static_cast<uint32_t>(n), index, op);
  } else {
    const Shape* const operands[2] = {&a.shape(), &b.shape()};
    const auto index = strided_index<uint64_t, 2>(out.shape(), operands, name);
    binary_broadcast<T, Op, uint64_t><<<blocks_for(n), kThreads, 0, stream>>>(ptr<T>(a), ptr<T>(b), ptr<T>(out),
                                                                              static_cast<uint64_t>(n), index, op);
  }
  check_launch(name);
}

template <class E>
void launch_broadcast_copy(const Tensor& a, const Tensor& out) {
  const int64_t n = out.numel();
  const Shape* const operands[1] = {&a.shape()};
  cudaStream_t stream = stream_for(out);
  const E* src = static_cast<const E*>(a.data_ptr());
  E* dst = static_cast<E*>(out.data_ptr());
  if (n <= kMax32BitElements) {
    const auto index = strided_index<uint32_t, 1>(out.shape(), operands, "broadcast_to");
    broadcast_gather<E, uint32_t><<<blocks_for(n), kThreads, 0, stream>>>(src, dst, static_cast<uint32_t>(n), index);
  } else {
    const auto index = strided_index<uint64_t, 1>(out.shape(), operands, "broadcast_to");
    broadcast_gather<E, uint64_t><<<blocks_for(n), kThreads, 0, stream>>>(src, dst, static_cast<uint64_t>(n), index);
  }
  check_launch("broadcast_to");
}

}  // namespace

// e4m3/e5m2 compute through f32, like the CPU: convert in, run the f32 kernel, round once out.
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b, const Shape& out_shape, const char* name) {
  if (is_fp8(a.dtype())) return binary(op, a.detach().to(DType::f32), b.detach().to(DType::f32), out_shape, name).to(a.dtype());
  const bool integers = op != BinaryOp::div && op != BinaryOp::pow;
  return dispatch_arith(a.dtype(), name, integers, [&]<class T>() {
    Tensor out = empty(out_shape, a.dtype(), a.device());
    using C = Compute<T>;
    switch (op) {
      case BinaryOp::add: launch_binary<T>(a, b, out, Add{}, name); break;
      case BinaryOp::sub: launch_binary<T>(a, b, out, Sub{}, name); break;
      case BinaryOp::mul: launch_binary<T>(a, b, out, Mul{}, name); break;
      case BinaryOp::maximum: launch_binary<T>(a, b, out, Maximum{}, name); break;
      case BinaryOp::div:
      case BinaryOp::pow:
        if constexpr (std::is_same_v<C, float>) {
          if (op == BinaryOp::div) launch_binary<T>(a, b, out, Div{}, name);
          else launch_binary<T>(a, b, out, Pow{}, name);
        }
        break;
    }
    return out;
  });
}

Tensor unary(UnaryOp op, const Tensor& a, const char* name) {
  if (is_fp8(a.dtype())) return unary(op, a.detach().to(DType::f32), name).to(a.dtype());
  const bool integers = op == UnaryOp::neg || op == UnaryOp::abs || op == UnaryOp::sign;
  return dispatch_arith(a.dtype(), name, integers, [&]<class T>() {
    Tensor out = empty(a.shape(), a.dtype(), a.device());
    switch (op) {
      case UnaryOp::neg: launch_map<T>(a, out, Neg{}, name); break;
      case UnaryOp::abs: launch_map<T>(a, out, Abs{}, name); break;
      case UnaryOp::sign: launch_map<T>(a, out, Sign{}, name); break;
      default:
        if constexpr (std::is_same_v<Compute<T>, float>) {
          switch (op) {
            case UnaryOp::exp: launch_map<T>(a, out, Exp{}, name); break;
            case UnaryOp::log: launch_map<T>(a, out, Log{}, name); break;
            case UnaryOp::tanh: launch_map<T>(a, out, Tanh{}, name); break;
            case UnaryOp::sqrt: launch_map<T>(a, out, Sqrt{}, name); break;
            case UnaryOp::rsqrt: launch_map<T>(a, out, Rsqrt{}, name); break;
            default: break;
          }
        }
        break;
    }
    return out;
  });
}

namespace {
// out = op(a, s) for the scalar ops; out may be a (in place).
template <class T>
void launch_scalar(ScalarOp op, const Tensor& a, const Tensor& out, double s, const char* name) {
  using C = Compute<T>;
  const C sc = static_cast<C>(s);  // rounded to f32 for floating tensors, as on the CPU
  switch (op) {
    case ScalarOp::add: return launch_map<T>(a, out, WithScalar<Add, C, false>{Add{}, sc}, name);
    case ScalarOp::mul: return launch_map<T>(a, out, WithScalar<Mul, C, false>{Mul{}, sc}, name);
    case ScalarOp::rsub: return launch_map<T>(a, out, WithScalar<Sub, C, true>{Sub{}, sc}, name);
    case ScalarOp::rdiv:
    case ScalarOp::pow:
      if constexpr (std::is_same_v<C, float>) {
        if (op == ScalarOp::rdiv) return launch_map<T>(a, out, WithScalar<Div, C, true>{Div{}, sc}, name);
        return launch_map<T>(a, out, WithScalar<Pow, C, false>{Pow{}, sc}, name);
      }
      break;
  }
}
}  // namespace

Tensor scalar(ScalarOp op, const Tensor& a, double s, const char* name) {
  if (is_fp8(a.dtype())) return scalar(op, a.detach().to(DType::f32), s, name).to(a.dtype());
  const bool integers = op == ScalarOp::add || op == ScalarOp::mul || op == ScalarOp::rsub;
  return dispatch_arith(a.dtype(), name, integers, [&]<class T>() {
    Tensor out = empty(a.shape(), a.dtype(), a.device());
    launch_scalar<T>(op, a, out, s, name);
    return out;
  });
}

Tensor broadcast_to(const Tensor& a, const Shape& shape) {
  Tensor out = empty(shape, a.dtype(), a.device());
  if (out.numel() == 0) return out;
  switch (a.element_size()) {
    case 1: launch_broadcast_copy<uint8_t>(a, out); break;
    case 2: launch_broadcast_copy<uint16_t>(a, out); break;
    case 4: launch_broadcast_copy<uint32_t>(a, out); break;
    case 8: launch_broadcast_copy<uint64_t>(a, out); break;
    default: OCTET_FAIL("broadcast_to: no CUDA copy for ", a.element_size(), "-byte elements (", a.describe(), ")");
  }
  return out;
}

void div_scalar_(const Tensor& dst, double divisor) {
  dispatch_arith(dst.dtype(), "div_scalar_", /*integers=*/false, [&]<class T>() {
    if constexpr (std::is_same_v<Compute<T>, float>) {
      launch_map<T>(dst, dst, WithScalar<Div, float, false>{Div{}, static_cast<float>(divisor)}, "div_scalar_");
    }
  });
}

void mul_scalar_(const Tensor& dst, double s) {
  if (is_fp8(dst.dtype())) {
    dst.copy_(scalar(ScalarOp::mul, dst.detach().to(DType::f32), s, "mul_scalar_"));
    return;
  }
  dispatch_arith(dst.dtype(), "mul_scalar_", true, [&]<class T>() { launch_scalar<T>(ScalarOp::mul, dst, dst, s, "mul_scalar_"); });
}

namespace {
template <class D, class S>
void launch_axpy(const Tensor& dst, const Tensor& src, double alpha) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  constexpr int N = 16 / (sizeof(D) > sizeof(S) ? sizeof(D) : sizeof(S));
  const bool vec = reinterpret_cast<uintptr_t>(dst.data_ptr()) % (sizeof(D) * N) == 0 &&
                   reinterpret_cast<uintptr_t>(src.data_ptr()) % (sizeof(S) * N) == 0;
  const int64_t items = vec ? n / N + n % N : n;
  axpy<D, S><<<blocks_for(items), kThreads, 0, stream_for(dst)>>>(ptr<D>(dst), ptr<S>(src),
                                                                  static_cast<Compute<D>>(alpha), n, vec);
  check_launch("add_");
}
}  // namespace

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  if (is_fp8(dst.dtype())) {  // accumulate in f32, round once back into dst's storage
    const Tensor acc = dst.detach().to(DType::f32);
    add_(acc, src, alpha);
    dst.copy_(acc);
    return;
  }
  dispatch_arith(dst.dtype(), "add_", true, [&]<class D>() {
    if constexpr (std::is_integral_v<D>) {
      const Tensor s = src.detach().to(dst.dtype());  // the CPU converts src to dst's integer type too
      launch_axpy<D, D>(dst, s, alpha);
    } else {
      // f32/bf16/f16 sources widen to f32 exactly inside the kernel; others are converted first.
      switch (src.dtype()) {
        case DType::f32: return launch_axpy<D, float>(dst, src, alpha);
        case DType::bf16: return launch_axpy<D, __nv_bfloat16>(dst, src, alpha);
        case DType::f16: return launch_axpy<D, __half>(dst, src, alpha);
        default: return launch_axpy<D, float>(dst, src.detach().to(DType::f32), alpha);
      }
    }
  });
}

}  // namespace octet::kernels::cuda
