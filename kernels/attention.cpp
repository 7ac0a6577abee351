// Entry points for unfused attention: shape checks that name q, k and v, widening of low-precision
// inputs to the compute type (f32, or f64 for f64), and rounding the results back to q's dtype once.
#include "kernels/attention.h"

#include <string>

#include "kernels/common.h"
#include "kernels/cpu/attention_cpu.h"

namespace octet::kernels {

namespace {

std::string describe_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  return "q: " + q.describe() + ", k: " + k.describe() + ", v: " + v.describe();
}

void check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  check_cpu(op, {&q, &k, &v});
  check_same_dtype(op, {&q, &k, &v});
  check_floating(op, q);
  OCTET_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, ": q, k and v must be [B, H, S, D] (",
              describe_qkv(q, k, v), ")");
  OCTET_CHECK(k.shape() == v.shape(), op, ": k and v must have the same shape [B, H, Sk, D] (", describe_qkv(q, k, v),
              ")");
  OCTET_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3), op,
              ": q and k must agree on batch, heads and head dim (", describe_qkv(q, k, v), ")");
  OCTET_CHECK(k.size(2) >= 1 && q.size(3) >= 1, op, ": needs at least one key and a nonzero head dim (",
              describe_qkv(q, k, v), ")");
}

}  // namespace

AttentionOutput attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  constexpr const char* op = "attention_forward";
  check_qkv(op, q, k, v);
  const int64_t b = q.size(0), h = q.size(1), s = q.size(2), d = q.size(3), sk = k.size(2);
  const DType ct = compute_dtype(q.dtype());
  Tensor out = empty(q.shape(), ct, q.device());
  Tensor lse = empty({b, h, s}, ct, q.device());
  if (out.numel() > 0) {
    const Tensor qc = to_compute(q), kc = to_compute(k), vc = to_compute(v);
    with_compute_type(ct, [&]<class T>() {
      cpu::attention_forward<T>(qc.data<T>(), kc.data<T>(), vc.data<T>(), out.data<T>(), lse.data<T>(), b * h, s, sk, d,
                                static_cast<T>(scale));
    });
  }
  return {out.to(q.dtype()), lse};
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, double scale) {
  constexpr const char* op = "attention_backward";
  check_qkv(op, q, k, v);
  check_cpu(op, {&dout, &out, &lse});
  OCTET_CHECK(dout.shape() == q.shape() && out.shape() == q.shape(), op,
              ": dout and out must have q's shape (dout: ", dout.describe(), ", out: ", out.describe(), ", ",
              describe_qkv(q, k, v), ")");
  check_floating(op, dout);
  check_floating(op, out);
  const int64_t b = q.size(0), h = q.size(1), s = q.size(2), d = q.size(3), sk = k.size(2);
  const DType ct = compute_dtype(q.dtype());
  OCTET_CHECK(lse.shape() == Shape({b, h, s}) && lse.dtype() == ct, op, ": lse ", lse.describe(), " should be ",
              dtype_name(ct), Shape({b, h, s}), ", as attention_forward returns it (q: ", q.describe(), ")");
  Tensor dq = empty(q.shape(), ct, q.device());
  Tensor dk = empty(k.shape(), ct, q.device());
  Tensor dv = empty(v.shape(), ct, q.device());
  if (q.numel() == 0) {  // no queries: nothing flows to k and v
    dk.zero_();
    dv.zero_();
  } else {
    // dout and out are widened exactly like the inputs; out is the rounded forward output, so δ uses
    // what the forward actually returned.
    const Tensor qc = to_compute(q), kc = to_compute(k), vc = to_compute(v);
    const Tensor doc = dout.detach().to(ct), oc = out.detach().to(ct);
    with_compute_type(ct, [&]<class T>() {
      cpu::attention_backward<T>(doc.data<T>(), qc.data<T>(), kc.data<T>(), vc.data<T>(), oc.data<T>(), lse.data<T>(),
                                 dq.data<T>(), dk.data<T>(), dv.data<T>(), b * h, s, sk, d, static_cast<T>(scale));
    });
  }
  return {dq.to(q.dtype()), dk.to(q.dtype()), dv.to(q.dtype())};
}

}  // namespace octet::kernels
