// Elementwise entry points: check the arguments, allocate the result, hand the loop to the backend.
// Floating tensors compute in their compute type (kernels/common.h) and are rounded once on the way
// out; i32/i64 tensors compute in their own type where integer arithmetic makes sense.
#include "kernels/elementwise.h"

#include <algorithm>
#include <limits>
#include <type_traits>

#include "core/op_ledger.h"
#include "kernels/common.h"
#include "kernels/cpu/elementwise_cpu.h"
#include "kernels/cuda/elementwise_cuda.h"

namespace octet::kernels {
namespace {

using cpu::BinaryOp;
using cpu::ScalarOp;
using cpu::UnaryOp;

bool is_int(DType d) { return d == DType::i32 || d == DType::i64; }

// The dtype an op computes in: the compute dtype for floating tensors, i32/i64 as they are.
DType arith_dtype(DType d) { return is_int(d) ? d : compute_dtype(d); }
Tensor to_arith(const Tensor& t) { return t.detach().to(arith_dtype(t.dtype())); }

// Calls f.template operator()<T>() with T the C++ type of arith_dtype(d).
template <class F>
decltype(auto) with_arith_type(DType d, F&& f) {
  if (d == DType::i32) return f.template operator()<int32_t>();
  if (d == DType::i64) return f.template operator()<int64_t>();
  return with_compute_type(d, f);
}

void check_arith(const char* op, const Tensor& t, bool integers_ok) {
  if (!integers_ok) return check_floating(op, t);
  OCTET_CHECK(is_floating(t.dtype()) || is_int(t.dtype()), op, ": needs a floating, i32 or i64 tensor, got ",
              t.describe());
}

// A scalar applied to an integer tensor must be a whole number that fits its type.
template <class T>
void check_scalar_fits(const char* op, const Tensor& t, double s) {
  if constexpr (std::is_integral_v<T>) {
    constexpr double lo = static_cast<double>(std::numeric_limits<T>::min());  // -2^31 or -2^63, exact
    OCTET_CHECK(s >= lo && s < -lo && static_cast<double>(static_cast<int64_t>(s)) == s, op, ": scalar ", s,
                " is not a whole number that fits ", t.describe(), "; convert the tensor with .to(f32) first");
  }
}

Tensor binary_op(const char* op, BinaryOp kind, const Tensor& a, const Tensor& b, bool integers_ok) {
  LedgerOp ledger(op);
  check_same_device(op, {&a, &b});
  check_same_dtype(op, {&a, &b});
  check_arith(op, a, integers_ok);
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), op);
  ledger.read({&a, &b}).write_bytes(shape.numel() * static_cast<int64_t>(a.element_size()));
  if (a.is_cuda()) return cuda::binary(kind, a, b, shape, op);
  check_cpu(op, {&a, &b});
  if (a.dtype() == DType::bf16 && a.shape() == b.shape()) {  // a residual add: in f32 a chunk at a time
    Tensor out = empty(shape, DType::bf16);
    cpu::binary_same_shape_bf16(kind, static_cast<const bfloat16*>(a.data_ptr()),
                                static_cast<const bfloat16*>(b.data_ptr()), static_cast<bfloat16*>(out.data_ptr()),
                                shape.numel());
    return out;
  }
  return with_arith_type(a.dtype(), [&]<class T>() {
    const Tensor ac = to_arith(a), bc = to_arith(b);
    Tensor out = empty(shape, ac.dtype());
    cpu::binary<T>(kind, ac.data<T>(), a.shape(), bc.data<T>(), b.shape(), out.data<T>(), shape);
    return out.to(a.dtype());
  });
}

Tensor unary_op(const char* op, UnaryOp kind, const Tensor& a, bool integers_ok) {
  LedgerOp ledger(op);
  check_defined(op, {&a});
  check_arith(op, a, integers_ok);
  ledger.read(a).write(a);
  if (a.is_cuda()) return cuda::unary(kind, a, op);
  check_cpu(op, {&a});
  return with_arith_type(a.dtype(), [&]<class T>() {
    const Tensor ac = to_arith(a);
    Tensor out = empty(a.shape(), ac.dtype());
    cpu::unary<T>(kind, ac.data<T>(), out.data<T>(), a.numel());
    return out.to(a.dtype());
  });
}

Tensor scalar_op(const char* op, ScalarOp kind, const Tensor& a, double s, bool integers_ok) {
  LedgerOp ledger(op);
  check_defined(op, {&a});
  check_arith(op, a, integers_ok);
  ledger.read(a).write(a);
  return with_arith_type(a.dtype(), [&]<class T>() {
    check_scalar_fits<T>(op, a, s);
    if (a.is_cuda()) return cuda::scalar(kind, a, s, op);
    check_cpu(op, {&a});
    const Tensor ac = to_arith(a);
    Tensor out = empty(a.shape(), ac.dtype());
    cpu::scalar<T>(kind, ac.data<T>(), static_cast<T>(s), out.data<T>(), a.numel());
    return out.to(a.dtype());
  });
}

// Whether `from` can be broadcast to exactly `to`.
bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.ndim() > to.ndim()) return false;
  for (int64_t i = 1; i <= from.ndim(); ++i) {
    const int64_t f = from[from.size() - i], t = to[to.size() - i];
    if (f != t && f != 1) return false;
  }
  return true;
}

}  // namespace

// Aligned from the right, each pair of extents must match or contain a 1 (which stretches).
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t ndim = std::max(a.size(), b.size());
  Shape out(ndim, 1);
  for (size_t i = 1; i <= ndim; ++i) {
    const int64_t da = i <= a.size() ? a[a.size() - i] : 1;
    const int64_t db = i <= b.size() ? b[b.size() - i] : 1;
    OCTET_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", a, " and ", b,
                " cannot be broadcast together (aligned from the right, each pair of extents must be equal or "
                "one of them 1)");
    out[ndim - i] = da == 1 ? db : da;
  }
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) { return binary_op("add", BinaryOp::add, a, b, true); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary_op("sub", BinaryOp::sub, a, b, true); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary_op("mul", BinaryOp::mul, a, b, true); }
// Integer division would need a floating result or a rounding rule; Octet asks for a cast instead.
Tensor div(const Tensor& a, const Tensor& b) { return binary_op("div", BinaryOp::div, a, b, false); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary_op("pow", BinaryOp::pow, a, b, false); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary_op("maximum", BinaryOp::maximum, a, b, true); }

Tensor add_scalar(const Tensor& a, double s) { return scalar_op("add_scalar", ScalarOp::add, a, s, true); }
Tensor mul_scalar(const Tensor& a, double s) { return scalar_op("mul_scalar", ScalarOp::mul, a, s, true); }
Tensor rsub_scalar(const Tensor& a, double s) { return scalar_op("rsub_scalar", ScalarOp::rsub, a, s, true); }
Tensor rdiv_scalar(const Tensor& a, double s) { return scalar_op("rdiv_scalar", ScalarOp::rdiv, a, s, false); }
Tensor pow_scalar(const Tensor& a, double e) { return scalar_op("pow_scalar", ScalarOp::pow, a, e, false); }

Tensor neg(const Tensor& a) { return unary_op("neg", UnaryOp::neg, a, true); }
Tensor exp(const Tensor& a) { return unary_op("exp", UnaryOp::exp, a, false); }
Tensor log(const Tensor& a) { return unary_op("log", UnaryOp::log, a, false); }
Tensor tanh(const Tensor& a) { return unary_op("tanh", UnaryOp::tanh, a, false); }
Tensor sqrt(const Tensor& a) { return unary_op("sqrt", UnaryOp::sqrt, a, false); }
Tensor rsqrt(const Tensor& a) { return unary_op("rsqrt", UnaryOp::rsqrt, a, false); }
Tensor abs(const Tensor& a) { return unary_op("abs", UnaryOp::abs, a, true); }
Tensor sign(const Tensor& a) { return unary_op("sign", UnaryOp::sign, a, true); }

// Any dtype: a broadcast only moves elements, so it copies raw bytes.
Tensor broadcast_to(const Tensor& a, const Shape& shape) {
  LedgerOp ledger("broadcast_to");
  check_defined("broadcast_to", {&a});
  for (int64_t d : shape) OCTET_CHECK(d >= 0, "broadcast_to: negative extent in target shape ", shape);
  OCTET_CHECK(broadcasts_to(a.shape(), shape), "broadcast_to: cannot broadcast ", a.describe(), " to ", shape,
              " (aligned from the right, each extent must equal the target's or be 1)");
  ledger.read(a).write_bytes(shape.numel() * static_cast<int64_t>(a.element_size()));
  if (a.is_cuda()) return cuda::broadcast_to(a, shape);
  check_cpu("broadcast_to", {&a});
  Tensor out = empty(shape, a.dtype());
  cpu::broadcast_copy(a.data_ptr(), a.shape(), out.data_ptr(), shape, a.element_size());
  return out;
}

// dst += alpha * src. dst's dtype decides the arithmetic; src is converted to it first.
void add_(const Tensor& dst, const Tensor& src, double alpha) {
  LedgerOp ledger("add_");
  ledger.read({&dst, &src}).write(dst);
  check_same_device("add_", {&dst, &src});
  OCTET_CHECK(dst.shape() == src.shape(), "add_: shapes differ (", describe_all({&dst, &src}),
              "); in-place accumulation needs equal shapes, broadcast or sum_to first");
  check_arith("add_", dst, true);
  OCTET_CHECK(is_floating(dst.dtype()) || is_int(src.dtype()), "add_: cannot accumulate ", src.describe(),
              " into the integer tensor ", dst.describe(), "; convert the destination to a floating dtype");
  dst.bump_version();
  with_arith_type(dst.dtype(), [&]<class T>() {
    check_scalar_fits<T>("add_", dst, alpha);
    if (dst.is_cuda()) return cuda::add_(dst, src, alpha);
    check_cpu("add_", {&dst, &src});
    const Tensor acc = to_arith(dst);  // dst itself when it is already in its compute dtype
    const Tensor s = src.detach().to(acc.dtype());
    cpu::axpy<T>(acc.data<T>(), s.data<T>(), static_cast<T>(alpha), acc.numel());
    if (acc.data_ptr() != dst.data_ptr()) dst.copy_(acc);  // round once back to dst's storage dtype
  });
}

// dst *= s, rounding once to dst's dtype.
void mul_scalar_(const Tensor& dst, double s) {
  LedgerOp ledger("mul_scalar_");
  check_defined("mul_scalar_", {&dst});
  ledger.read(dst).write(dst);
  check_arith("mul_scalar_", dst, true);
  dst.bump_version();
  with_arith_type(dst.dtype(), [&]<class T>() {
    check_scalar_fits<T>("mul_scalar_", dst, s);
    if (dst.is_cuda()) return cuda::mul_scalar_(dst, s);
    check_cpu("mul_scalar_", {&dst});
    const Tensor acc = to_arith(dst);
    cpu::scalar<T>(ScalarOp::mul, acc.data<T>(), static_cast<T>(s), acc.data<T>(), acc.numel());
    if (acc.data_ptr() != dst.data_ptr()) dst.copy_(acc);
  });
}

}  // namespace octet::kernels
