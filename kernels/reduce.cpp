// Reduction and softmax entry points: check the arguments, view the input as [outer, n, inner]
// around the chosen dim, and hand the work to the backend in the compute type (kernels/common.h).
#include "kernels/reduce.h"

#include <vector>

#include "core/op_ledger.h"
#include "kernels/common.h"
#include "kernels/cpu/reduce_cpu.h"
#include "kernels/cuda/reduce_cuda.h"

namespace octet::kernels {
namespace {

// A tensor seen as [outer, n, inner] around one dim.
struct Geometry {
  int64_t outer = 1, n = 1, inner = 1;
};

// A 0-d tensor is one element along dim 0 (or -1), as in PyTorch.
int64_t normalize(const Shape& s, int64_t dim, const char* op) {
  if (s.ndim() == 0) {
    OCTET_CHECK(dim == 0 || dim == -1, op, ": dim ", dim, " is out of range for a tensor of shape []");
    return 0;
  }
  return s.normalize_dim(dim, op);
}

Geometry geometry(const Shape& s, int64_t dim, const char* op) {
  const int64_t d = normalize(s, dim, op);
  Geometry g;
  if (s.ndim() == 0) return g;
  for (int64_t i = 0; i < d; ++i) g.outer *= s[i];
  g.n = s[d];
  for (int64_t i = d + 1; i < s.ndim(); ++i) g.inner *= s[i];
  return g;
}

Geometry whole(const Shape& s) { return {1, s.numel(), 1}; }

Shape reduced_shape(const Shape& s, int64_t dim, bool keepdim, const char* op) {
  const int64_t d = normalize(s, dim, op);
  if (s.ndim() == 0) return s;
  Shape r = s;
  if (keepdim) {
    r[d] = 1;
  } else {
    r.erase(r.begin() + d);
  }
  return r;
}

void check_input(const char* op, const Tensor& a) {
  check_defined(op, {&a});
  check_floating(op, a);
}

Tensor sum_impl(const Tensor& a, Geometry g, const Shape& out_shape, bool mean) {
  const char* op = mean ? "mean" : "sum";
  LedgerOp ledger(op);
  ledger.read(a).write_bytes(out_shape.numel() * static_cast<int64_t>(a.element_size()));
  if (a.is_cuda()) {
    const float divisor = mean ? static_cast<float>(g.n) : 1.f;
    return cuda::sum(a, g.outer, g.n, g.inner, divisor, a.dtype(), op).reshape(out_shape);
  }
  check_cpu(op, {&a});
  return with_compute_type(a.dtype(), [&]<class T>() {
    const Tensor ac = to_compute(a);
    Tensor out = empty(out_shape, ac.dtype());
    const T divisor = mean ? static_cast<T>(g.n) : T(1);
    cpu::sum<T>(ac.data<T>(), g.outer, g.n, g.inner, divisor, out.data<T>());
    return out.to(a.dtype());
  });
}

MaxResult max_impl(const char* op, const Tensor& a, Geometry g, const Shape& out_shape) {
  LedgerOp ledger(op);
  ledger.read(a).write_bytes(out_shape.numel() * static_cast<int64_t>(a.element_size() + sizeof(int64_t)));
  OCTET_CHECK(g.n > 0 || g.outer * g.inner == 0, op, ": cannot take the maximum over an empty dim of ",
              a.describe());
  MaxResult r;
  if (a.is_cuda()) {
    cuda::max(a, g.outer, g.n, g.inner, r.values, r.indices);
    r.values = r.values.reshape(out_shape);
    r.indices = r.indices.reshape(out_shape);
    return r;
  }
  check_cpu(op, {&a});
  r.indices = empty(out_shape, DType::i64);
  r.values = with_compute_type(a.dtype(), [&]<class T>() {
    const Tensor ac = to_compute(a);
    Tensor values = empty(out_shape, ac.dtype());
    if (g.n > 0) cpu::max<T>(ac.data<T>(), g.outer, g.n, g.inner, values.data<T>(), r.indices.data<int64_t>());
    return values.to(a.dtype());  // exact: the maximum is one of the inputs
  });
  return r;
}

// The result stays in the compute dtype: FP8 scaling wants amax in f32 whatever the storage.
Tensor amax_impl(const Tensor& a, Geometry g, const Shape& out_shape) {
  LedgerOp ledger("amax");
  ledger.read(a).write_bytes(out_shape.numel() * static_cast<int64_t>(a.element_size()));
  if (a.is_cuda()) return cuda::amax(a, g.outer, g.n, g.inner).reshape(out_shape);
  check_cpu("amax", {&a});
  return with_compute_type(a.dtype(), [&]<class T>() {
    const Tensor ac = to_compute(a);
    Tensor out = empty(out_shape, ac.dtype());
    cpu::amax<T>(ac.data<T>(), g.outer, g.n, g.inner, out.data<T>());
    return out;
  });
}

Tensor softmax_impl(const char* op, const Tensor& a, int64_t dim, bool log) {
  LedgerOp ledger(op);
  check_input(op, a);
  ledger.read(a).write(a);
  const Geometry g = geometry(a.shape(), dim, op);
  if (a.is_cuda()) return cuda::softmax(a, g.outer, g.n, g.inner, log);
  check_cpu(op, {&a});
  return with_compute_type(a.dtype(), [&]<class T>() {
    const Tensor ac = to_compute(a);
    Tensor out = empty(a.shape(), ac.dtype());
    cpu::softmax<T>(ac.data<T>(), g.outer, g.n, g.inner, log, out.data<T>());
    return out.to(a.dtype());
  });
}

Tensor softmax_backward_impl(const char* op, const Tensor& y, const Tensor& dy, int64_t dim, bool log) {
  LedgerOp ledger(op);
  ledger.read({&y, &dy}).write(y);
  check_same_device(op, {&y, &dy});
  check_same_dtype(op, {&y, &dy});
  check_input(op, y);
  OCTET_CHECK(y.shape() == dy.shape(), op, ": y and dy must have the same shape (", describe_all({&y, &dy}), ")");
  const Geometry g = geometry(y.shape(), dim, op);
  if (y.is_cuda()) return cuda::softmax_backward(y, dy, g.outer, g.n, g.inner, log);
  check_cpu(op, {&y, &dy});
  return with_compute_type(y.dtype(), [&]<class T>() {
    const Tensor yc = to_compute(y), dyc = to_compute(dy);
    Tensor dx = empty(y.shape(), yc.dtype());
    cpu::softmax_backward<T>(yc.data<T>(), dyc.data<T>(), g.outer, g.n, g.inner, log, dx.data<T>());
    return dx.to(y.dtype());
  });
}

}  // namespace

Tensor sum(const Tensor& a, int64_t dim, bool keepdim) {
  check_input("sum", a);
  return sum_impl(a, geometry(a.shape(), dim, "sum"), reduced_shape(a.shape(), dim, keepdim, "sum"), false);
}
Tensor sum(const Tensor& a) {
  check_input("sum", a);
  return sum_impl(a, whole(a.shape()), Shape{}, false);
}
Tensor mean(const Tensor& a, int64_t dim, bool keepdim) {
  check_input("mean", a);
  return sum_impl(a, geometry(a.shape(), dim, "mean"), reduced_shape(a.shape(), dim, keepdim, "mean"), true);
}
Tensor mean(const Tensor& a) {
  check_input("mean", a);
  return sum_impl(a, whole(a.shape()), Shape{}, true);
}

MaxResult max(const Tensor& a, int64_t dim, bool keepdim) {
  check_input("max", a);
  return max_impl("max", a, geometry(a.shape(), dim, "max"), reduced_shape(a.shape(), dim, keepdim, "max"));
}
Tensor max(const Tensor& a) {
  check_input("max", a);
  OCTET_CHECK(a.numel() > 0, "max: cannot take the maximum of the empty tensor ", a.describe());
  return max_impl("max", a, whole(a.shape()), Shape{}).values;
}

Tensor amax(const Tensor& a, int64_t dim, bool keepdim) {
  check_input("amax", a);
  return amax_impl(a, geometry(a.shape(), dim, "amax"), reduced_shape(a.shape(), dim, keepdim, "amax"));
}
Tensor amax(const Tensor& a) {
  check_input("amax", a);
  return amax_impl(a, whole(a.shape()), Shape{});
}

// Dims of `a` that `shape` lacks (leading) or holds as 1 are summed. Runs of adjacent summed dims
// are merged and each run is one [outer, n, inner] pass, kept in the compute type between passes.
Tensor sum_to(const Tensor& a, const Shape& shape) {
  LedgerOp ledger("sum_to");
  check_input("sum_to", a);
  ledger.read(a).write_bytes(shape.numel() * static_cast<int64_t>(a.element_size()));
  const Shape& from = a.shape();
  const int64_t lead = from.ndim() - shape.ndim();
  bool ok = lead >= 0;
  for (int64_t i = 0; ok && i < shape.ndim(); ++i) ok = shape[i] == from[lead + i] || shape[i] == 1;
  OCTET_CHECK(ok, "sum_to: cannot sum ", a.describe(), " to shape ", shape,
              " (", shape, " must broadcast to ", from, ": aligned from the right, each extent equal or 1)");

  // Group a's dims into runs: extents[i] with summed[i] saying whether run i is reduced.
  std::vector<int64_t> extents;
  std::vector<bool> summed;
  for (int64_t d = 0; d < from.ndim(); ++d) {
    const bool s = d < lead || (shape[d - lead] == 1 && from[d] != 1);
    if (from[d] == 1) continue;  // extent 1 changes nothing either way
    if (!extents.empty() && summed.back() == s) {
      extents.back() *= from[d];
    } else {
      extents.push_back(from[d]);
      summed.push_back(s);
    }
  }
  std::vector<Geometry> passes;
  for (size_t r = 0; r < extents.size(); ++r) {
    if (!summed[r]) continue;
    Geometry g;
    for (size_t i = 0; i < r; ++i) g.outer *= extents[i];
    g.n = extents[r];
    for (size_t i = r + 1; i < extents.size(); ++i) g.inner *= extents[i];
    passes.push_back(g);
    extents[r] = 1;  // later passes see this run as gone
  }
  if (a.is_cuda()) {  // the first pass reads a's dtype directly; every pass writes f32
    Tensor cur = a;
    for (const Geometry& g : passes) cur = cuda::sum(cur, g.outer, g.n, g.inner, 1.f, DType::f32, "sum_to");
    if (cur.data_ptr() == a.data_ptr()) cur = cur.detach().clone();
    return cur.reshape(shape).to(a.dtype());
  }
  check_cpu("sum_to", {&a});
  return with_compute_type(a.dtype(), [&]<class T>() {
    Tensor cur = to_compute(a);
    for (const Geometry& g : passes) {
      Tensor next = empty({g.outer * g.inner}, cur.dtype());
      cpu::sum<T>(cur.data<T>(), g.outer, g.n, g.inner, T(1), next.data<T>());
      cur = next;
    }
    // With nothing summed, still hand back a new tensor: callers may accumulate into it.
    if (cur.data_ptr() == a.data_ptr()) cur = cur.clone();
    return cur.reshape(shape).to(a.dtype());
  });
}

Tensor softmax(const Tensor& a, int64_t dim) { return softmax_impl("softmax", a, dim, false); }
Tensor log_softmax(const Tensor& a, int64_t dim) { return softmax_impl("log_softmax", a, dim, true); }
Tensor softmax_backward(const Tensor& y, const Tensor& dy, int64_t dim) {
  return softmax_backward_impl("softmax_backward", y, dy, dim, false);
}
Tensor log_softmax_backward(const Tensor& y, const Tensor& dy, int64_t dim) {
  return softmax_backward_impl("log_softmax_backward", y, dy, dim, true);
}

}  // namespace octet::kernels
