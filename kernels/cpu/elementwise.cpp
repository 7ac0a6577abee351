// CPU elementwise kernels: one loop per broadcasting pattern, one functor per op.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/bf16_chunks.h"
#include "kernels/cpu/elementwise_cpu.h"
#include "kernels/index_math.h"

namespace octet::kernels::cpu {
namespace {

// Below this many elements, starting threads costs more than the loop itself.
constexpr int64_t kParallelThreshold = 1 << 15;

// Integer arithmetic is done in the unsigned type so that overflow wraps (as in PyTorch) instead of
// being undefined behaviour; floating types pass through unchanged.
template <class T, bool = std::is_integral_v<T>>
struct Wrapping {
  using type = T;
};
template <class T>
struct Wrapping<T, true> {
  using type = std::make_unsigned_t<T>;
};
template <class T>
using W = typename Wrapping<T>::type;

template <class T>
bool is_nan(T x) {
  if constexpr (std::is_floating_point_v<T>) return std::isnan(x);
  else return false;
}

// ---- the ops ----------------------------------------------------------------------------------------

struct Add {
  template <class T> T operator()(T x, T y) const { return static_cast<T>(W<T>(x) + W<T>(y)); }
};
struct Sub {
  template <class T> T operator()(T x, T y) const { return static_cast<T>(W<T>(x) - W<T>(y)); }
};
struct Mul {
  template <class T> T operator()(T x, T y) const { return static_cast<T>(W<T>(x) * W<T>(y)); }
};
struct Div {
  template <class T> T operator()(T x, T y) const { return x / y; }
};
struct Pow {
  template <class T> T operator()(T x, T y) const { return static_cast<T>(std::pow(x, y)); }
};
// NaN in either operand wins, as in torch.maximum.
struct Maximum {
  template <class T> T operator()(T x, T y) const { return (x > y || is_nan(x)) ? x : y; }
};

struct Neg {
  template <class T> T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return -x;  // -(+0) is -0, which 0 - x would miss
    else return static_cast<T>(W<T>(0) - W<T>(x));
  }
};
struct Exp {
  template <class T> T operator()(T x) const { return static_cast<T>(std::exp(x)); }
};
struct Log {
  template <class T> T operator()(T x) const { return static_cast<T>(std::log(x)); }
};
struct Tanh {
  template <class T> T operator()(T x) const { return static_cast<T>(std::tanh(x)); }
};
struct Sqrt {
  template <class T> T operator()(T x) const { return static_cast<T>(std::sqrt(x)); }
};
struct Rsqrt {
  template <class T> T operator()(T x) const { return static_cast<T>(1 / std::sqrt(x)); }
};
struct Abs {
  template <class T> T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return std::abs(x);
    else return x < 0 ? Neg{}(x) : x;
  }
};
// NaN stays NaN (torch.sign does the same).
struct Sign {
  template <class T> T operator()(T x) const { return is_nan(x) ? x : static_cast<T>((x > 0) - (x < 0)); }
};

// ---- broadcasting helpers ----------------------------------------------------------------------------

// Leading 1s do not change the memory layout, so [1, 1, C] is treated as [C].
Shape strip_leading_ones(const Shape& s) {
  size_t i = 0;
  while (i < s.size() && s[i] == 1) ++i;
  return Shape(s.begin() + static_cast<std::ptrdiff_t>(i), s.end());
}

// Whether `small` equals the trailing dims of `out` (a bias [C] against [B, S, C]).
bool is_trailing(const Shape& small, const Shape& out) {
  if (small.size() > out.size()) return false;
  return std::equal(small.rbegin(), small.rend(), out.rbegin());
}

// Offset of the first element of row r (rows run along the last dim of out) in an operand with
// the given broadcast strides.
int64_t row_offset(int64_t r, const Shape& out, const std::vector<int64_t>& strides) {
  int64_t offset = 0;
  for (int64_t d = out.ndim() - 2; d >= 0; --d) {
    offset += (r % out[d]) * strides[d];
    r /= out[d];
  }
  return offset;
}

// ---- loops ---------------------------------------------------------------------------------------------

template <class T, class F>
void map(F f, const T* a, T* out, int64_t n) {
#pragma omp parallel for if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) out[i] = f(a[i]);
}

template <class T, class F>
void binary_loop(F f, const T* a, const Shape& a_full, const T* b, const Shape& b_full, T* out,
                 const Shape& out_shape) {
  const int64_t n = out_shape.numel();
  if (n == 0) return;
  const Shape as = strip_leading_ones(a_full), bs = strip_leading_ones(b_full);
  const int64_t na = as.numel(), nb = bs.numel();

  if (as == bs) {
#pragma omp parallel for if (n > kParallelThreshold)
    for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
    return;
  }
  if (nb == 1) {
    const T s = b[0];
    map([&](T x) { return f(x, s); }, a, out, n);
    return;
  }
  if (na == 1) {
    const T s = a[0];
    map([&](T y) { return f(s, y); }, b, out, n);
    return;
  }
  // One operand fills out, the other repeats every `inner` elements (bias add, per-channel scale).
  if ((na == n && is_trailing(bs, out_shape)) || (nb == n && is_trailing(as, out_shape))) {
    const bool b_repeats = na == n;
    const int64_t inner = b_repeats ? nb : na, outer = n / inner;
#pragma omp parallel for if (n > kParallelThreshold)
    for (int64_t o = 0; o < outer; ++o) {
      T* po = out + o * inner;
      if (b_repeats) {
        const T* pa = a + o * inner;
        for (int64_t j = 0; j < inner; ++j) po[j] = f(pa[j], b[j]);
      } else {
        const T* pb = b + o * inner;
        for (int64_t j = 0; j < inner; ++j) po[j] = f(a[j], pb[j]);
      }
    }
    return;
  }
  // General case: walk rows of the last dim, locating each row's start in a and b.
  const std::vector<int64_t> sa = broadcast_strides(a_full, out_shape), sb = broadcast_strides(b_full, out_shape);
  const int64_t inner = out_shape.back(), rows = n / inner;
  const int64_t sa_last = sa.back(), sb_last = sb.back();
#pragma omp parallel for if (n > kParallelThreshold)
  for (int64_t r = 0; r < rows; ++r) {
    const T* pa = a + row_offset(r, out_shape, sa);
    const T* pb = b + row_offset(r, out_shape, sb);
    T* po = out + r * inner;
    for (int64_t j = 0; j < inner; ++j) po[j] = f(pa[j * sa_last], pb[j * sb_last]);
  }
}

template <class U>
void broadcast_copy_typed(const U* src, const Shape& src_shape, U* dst, const Shape& dst_shape) {
  const int64_t n = dst_shape.numel(), ns = src_shape.numel();
  if (n == 0) return;
  if (ns == n) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(U));
    return;
  }
  if (is_trailing(strip_leading_ones(src_shape), dst_shape)) {
#pragma omp parallel for if (n > kParallelThreshold)
    for (int64_t o = 0; o < n / ns; ++o) std::memcpy(dst + o * ns, src, static_cast<size_t>(ns) * sizeof(U));
    return;
  }
  const std::vector<int64_t> strides = broadcast_strides(src_shape, dst_shape);
  const int64_t inner = dst_shape.back(), rows = n / inner, s_last = strides.back();
#pragma omp parallel for if (n > kParallelThreshold)
  for (int64_t r = 0; r < rows; ++r) {
    const U* ps = src + row_offset(r, dst_shape, strides);
    U* pd = dst + r * inner;
    for (int64_t j = 0; j < inner; ++j) pd[j] = ps[j * s_last];
  }
}

}  // namespace

// ---- entry points for kernels/elementwise.cpp --------------------------------------------------------------

void binary_same_shape_bf16(BinaryOp op, const bfloat16* a, const bfloat16* b, bfloat16* out, int64_t n) {
  const auto run = [&](auto f) {
    map_bf16_in_f32<2>({a, b}, out, n, [&](const float* x, const float* y, float* o, int64_t count) {
      for (int64_t i = 0; i < count; ++i) o[i] = f(x[i], y[i]);
    });
  };
  switch (op) {
    case BinaryOp::add: return run(Add{});
    case BinaryOp::sub: return run(Sub{});
    case BinaryOp::mul: return run(Mul{});
    case BinaryOp::div: return run(Div{});
    case BinaryOp::pow: return run(Pow{});
    case BinaryOp::maximum: return run(Maximum{});
  }
}

template <class T>
void binary(BinaryOp op, const T* a, const Shape& a_shape, const T* b, const Shape& b_shape, T* out,
            const Shape& out_shape) {
  switch (op) {
    case BinaryOp::add: return binary_loop(Add{}, a, a_shape, b, b_shape, out, out_shape);
    case BinaryOp::sub: return binary_loop(Sub{}, a, a_shape, b, b_shape, out, out_shape);
    case BinaryOp::mul: return binary_loop(Mul{}, a, a_shape, b, b_shape, out, out_shape);
    case BinaryOp::div: return binary_loop(Div{}, a, a_shape, b, b_shape, out, out_shape);
    case BinaryOp::pow: return binary_loop(Pow{}, a, a_shape, b, b_shape, out, out_shape);
    case BinaryOp::maximum: return binary_loop(Maximum{}, a, a_shape, b, b_shape, out, out_shape);
  }
}

template <class T>
void unary(UnaryOp op, const T* a, T* out, int64_t n) {
  switch (op) {
    case UnaryOp::neg: return map<T>(Neg{}, a, out, n);
    case UnaryOp::exp: return map<T>(Exp{}, a, out, n);
    case UnaryOp::log: return map<T>(Log{}, a, out, n);
    case UnaryOp::tanh: return map<T>(Tanh{}, a, out, n);
    case UnaryOp::sqrt: return map<T>(Sqrt{}, a, out, n);
    case UnaryOp::rsqrt: return map<T>(Rsqrt{}, a, out, n);
    case UnaryOp::abs: return map<T>(Abs{}, a, out, n);
    case UnaryOp::sign: return map<T>(Sign{}, a, out, n);
  }
}

template <class T>
void scalar(ScalarOp op, const T* a, T s, T* out, int64_t n) {
  switch (op) {
    case ScalarOp::add: return map<T>([s](T x) { return Add{}(x, s); }, a, out, n);
    case ScalarOp::mul: return map<T>([s](T x) { return Mul{}(x, s); }, a, out, n);
    case ScalarOp::rsub: return map<T>([s](T x) { return Sub{}(s, x); }, a, out, n);
    case ScalarOp::rdiv: return map<T>([s](T x) { return Div{}(s, x); }, a, out, n);
    case ScalarOp::pow: return map<T>([s](T x) { return Pow{}(x, s); }, a, out, n);
  }
}

template <class T>
void axpy(T* dst, const T* src, T alpha, int64_t n) {
#pragma omp parallel for if (n > kParallelThreshold)
  for (int64_t i = 0; i < n; ++i) dst[i] = Add{}(dst[i], Mul{}(alpha, src[i]));
}

void broadcast_copy(const void* src, const Shape& src_shape, void* dst, const Shape& dst_shape, size_t element_size) {
  // Only the element width matters, so every dtype shares four instantiations.
  auto copy = [&]<class U>() {
    broadcast_copy_typed(static_cast<const U*>(src), src_shape, static_cast<U*>(dst), dst_shape);
  };
  switch (element_size) {
    case 1: return copy.operator()<uint8_t>();
    case 2: return copy.operator()<uint16_t>();
    case 4: return copy.operator()<uint32_t>();
    case 8: return copy.operator()<uint64_t>();
    default: break;
  }
}

#define OCTET_INSTANTIATE(T)                                                                                   \
  template void binary<T>(BinaryOp, const T*, const Shape&, const T*, const Shape&, T*, const Shape&);         \
  template void unary<T>(UnaryOp, const T*, T*, int64_t);                                                      \
  template void scalar<T>(ScalarOp, const T*, T, T*, int64_t);                                                 \
  template void axpy<T>(T*, const T*, T, int64_t);
OCTET_INSTANTIATE(float)
OCTET_INSTANTIATE(double)
OCTET_INSTANTIATE(int32_t)
OCTET_INSTANTIATE(int64_t)
#undef OCTET_INSTANTIATE

}  // namespace octet::kernels::cpu
