// Differentiable linear algebra and network layers. GEMM gradients use the kernel's transpose
// flags instead of materialising transposes; the layer ops save what their fused backward kernels
// need (LayerNorm statistics, attention's log-sum-exp, dropout's Philox seed and offset).
#include <cmath>
#include <optional>
#include <utility>

#include "autograd/function.h"
#include "autograd/ops.h"
#include "core/random.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/linear.h"
#include "kernels/reduce.h"
#include "kernels/shape_ops.h"

namespace octet {

using autograd::Grads;
using autograd::record;
namespace k = kernels;

namespace {

Tensor detached(const Tensor& t) { return t.defined() ? t.detach() : Tensor(); }

// op(a)·op(b) with the result in `dtype`, the dtype of the input whose gradient it is. GEMM cannot
// write FP8, so an FP8 input gets its gradient computed in f32 and rounded.
Tensor matmul_as(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, DType dtype) {
  if (!is_fp8(dtype)) return k::matmul(a, b, trans_a, trans_b, dtype);
  return k::matmul(a, b, trans_a, trans_b, DType::f32).to(dtype);
}

// [..., r, c] summed over its leading dims to [r, c].
Tensor sum_leading(const Tensor& t) {
  if (t.dim() == 2) return t;
  return k::sum(t.reshape({-1, t.size(-2), t.size(-1)}), 0);
}

// x as [rows, last]: a view, since tensors are contiguous.
Tensor rows_of(const Tensor& x) { return x.reshape({-1, x.size(-1)}); }

}  // namespace

// C = op(A)·op(B):
//   dA = dC·op(B)ᵀ, or op(B)·dCᵀ when A is stored transposed
//   dB = op(A)ᵀ·dC, or dCᵀ·op(A) when B is stored transposed
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  const Tensor ad = a.detach(), bd = b.detach();
  const bool na = a.requires_grad(), nb = b.requires_grad();
  return record("matmul", k::matmul(ad, bd, trans_a, trans_b), {a, b}, [=](const Grads& g) -> Grads {
    const Tensor& dc = g[0];
    // A 2-D b shared by a batched a: the kernel takes a 2-D second operand only, and b's
    // gradient sums over the batch.
    const bool shared_b = bd.dim() == 2 && ad.dim() > 2;
    Tensor da, db;
    if (na) {
      if (!trans_a) {
        da = matmul_as(dc, bd, false, !trans_b, ad.dtype());
      } else if (!shared_b) {
        da = matmul_as(bd, dc, trans_b, true, ad.dtype());
      } else {
        // (op(B)·dCᵀ) = (dC·op(B)ᵀ)ᵀ: the rare batched-transposed-a case pays one transpose.
        da = k::transpose_last2(matmul_as(dc, bd, false, !trans_b, ad.dtype()));
      }
    }
    if (nb) {
      if (shared_b && !trans_a) {
        // The batch folds into the rows of one GEMM.
        const Tensor a2 = rows_of(ad), dc2 = rows_of(dc);
        db = trans_b ? matmul_as(dc2, a2, true, false, bd.dtype()) : matmul_as(a2, dc2, true, false, bd.dtype());
      } else {
        db = trans_b ? matmul_as(dc, ad, true, trans_a, bd.dtype()) : matmul_as(ad, dc, !trans_a, false, bd.dtype());
        if (shared_b) db = sum_leading(db);
      }
    }
    return {da, db};
  }, {nb ? ad : Tensor(), na ? bd : Tensor()});
}

// y = x·Wᵀ + b over x's rows: dx = dy·W, dW = dyᵀ·x, db = Σ_rows dy. On the GPU the bias add rides
// in the forward GEMM's epilogue and db in the wgrad GEMM's (kernels/linear.h).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual) {
  OCTET_CHECK(x.dim() >= 1 && weight.dim() == 2, "linear: x must be [..., in] and weight [out, in], got ",
              x.describe(), " and ", weight.describe());
  const Tensor xd = x.detach(), wd = weight.detach(), bd = detached(bias);
  Tensor y = k::linear_forward(xd, wd, bd, detached(residual));
  const bool nx = x.requires_grad(), nw = weight.requires_grad(), nb = bias.requires_grad(),
             nr = residual.requires_grad();
  const DType b_dtype = bd.defined() ? bd.dtype() : x.dtype();
  return record("linear", y, {x, weight, bias, residual}, [=](const Grads& g) -> Grads {
    if (!nx && !nw && !nb) return {Tensor(), Tensor(), Tensor(), g[0]};  // only the residual needs one
    k::LinearGrads d = k::linear_backward(g[0], xd, wd, nx, nw, nb);
    return {d.dx, d.dweight, nb ? d.dbias.to(b_dtype) : Tensor(), nr ? g[0] : Tensor()};
  }, {nw ? xd : Tensor(), nx ? wd : Tensor()});
}

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const Tensor xd = x.detach(), wd = detached(weight), bd = detached(bias);
  k::LayerNormOutput r = k::layernorm_forward(xd, wd, bd, eps);
  const bool nx = x.requires_grad(), nw = weight.requires_grad(), nb = bias.requires_grad();
  return record("layer_norm", r.y, {x, weight, bias},
                [=, mean = r.mean, rstd = r.rstd](const Grads& g) -> Grads {
                  k::LayerNormGrads d = k::layernorm_backward(g[0], xd, wd, mean, rstd);
                  return {nx ? d.dx : Tensor(), nw ? d.dweight : Tensor(), nb ? d.dbias : Tensor()};
                },
                {xd, wd});
}

// (h, ln) = (x + y, layer_norm(x + y)). With dh the gradient of h (from its other consumers) and dln
// that of ln: dh_total = dh + LN-backward(dln), computed in one pass, and dx = dy = dh_total.
// record() hands the closure zeros for an output that received no gradient.
std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                                         double eps) {
  const Tensor wd = detached(weight), bd = detached(bias);
  k::AddLayerNormOutput r = k::add_layernorm_forward(x.detach(), y.detach(), wd, bd, eps);
  const bool nx = x.requires_grad(), ny = y.requires_grad(), nw = weight.requires_grad(), nb = bias.requires_grad();
  // h is an output of this node: the closure keeps a detached handle, never h itself (a cycle).
  std::vector<Tensor> outs =
      record("add_layer_norm", {r.h, r.y}, {x, y, weight, bias},
             [=, hd = r.h.detach(), mean = r.mean, rstd = r.rstd](const Grads& g) -> Grads {
               k::AddLayerNormGrads d = k::add_layernorm_backward(g[1], g[0], hd, wd, mean, rstd);
               return {nx ? d.dh : Tensor(), ny ? d.dh : Tensor(), nw ? d.dweight : Tensor(),
                       nb ? d.dbias : Tensor()};
             },
             {r.h, wd});
  return {outs[0], outs[1]};
}

// (r, ln) = (x, layer_norm(x)) as one node, r being x's data under this node. With dr and dln the
// gradients of the two: dx = dr + LN-backward(dln) in one pass (the add_layer_norm backward's kernel,
// with x as h), where layer_norm with x used twice would leave that sum to the engine's own add kernel.
std::pair<Tensor, Tensor> residual_layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const Tensor xd = x.detach(), wd = detached(weight), bd = detached(bias);
  k::LayerNormOutput r = k::layernorm_forward(xd, wd, bd, eps);
  const bool nx = x.requires_grad(), nw = weight.requires_grad(), nb = bias.requires_grad();
  // r is a handle of its own to x's data (the closure's xd must not be an output of the node: a cycle).
  std::vector<Tensor> outs =
      record("residual_layer_norm", {x.detach(), r.y}, {x, weight, bias},
             [=, mean = r.mean, rstd = r.rstd](const Grads& g) -> Grads {
               k::AddLayerNormGrads d = k::add_layernorm_backward(g[1], g[0], xd, wd, mean, rstd);
               return {nx ? d.dh : Tensor(), nw ? d.dweight : Tensor(), nb ? d.dbias : Tensor()};
             },
             {xd, wd});
  return {outs[0], outs[1]};
}

Tensor gelu(const Tensor& x, kernels::GeluApproximation approximation) {
  const Tensor xd = x.detach();
  return record(
      "gelu", k::gelu_forward(xd, approximation), {x},
      [xd, approximation](const Grads& g) -> Grads { return {k::gelu_backward(g[0], xd, approximation)}; }, {xd});
}

namespace {

// The backward of linear(gelu(pre), weight) for a node that kept pre but not gelu(pre): dpre (when
// asked for) and the Linear's weight and bias gradients. With both, the dgrad GEMM first, then one
// pass over pre gives dpre (written over dact) and the GELU's output again for the wgrad GEMM
// (k::gelu_backward_and_forward): one read of pre, where the two GELU kernels read it twice. At most
// two [tokens, hidden] temporaries at a time, dpre and the GELU's output, as with the kernels one
// after another. The values are those of the separate kernels, bit for bit.
//
// dpre_sum_dtype: the same pass also sums dpre over its rows, in that dtype (dpre_sum), for the
// caller's own bias whose output pre is (linear_gelu_linear's fc1), so that no later kernel reads dpre
// again for it (cuBLASLt's BGRADB epilogue on fc1's wgrad GEMM did). Only where that pass runs: when
// dpre_sum comes back undefined, the caller sums dpre itself.
struct GeluLinearGrads {
  Tensor dpre;
  Tensor dpre_sum;
  k::LinearGrads linear;
};
GeluLinearGrads gelu_linear_backward(const Tensor& dy, const Tensor& pre, const Tensor& weight,
                                     k::GeluApproximation approximation, bool need_dpre, bool need_dweight,
                                     bool need_dbias, std::optional<DType> dpre_sum_dtype = std::nullopt) {
  GeluLinearGrads r;
  Tensor act;
  const bool need_linear = need_dweight || need_dbias;
  if (need_dpre && need_linear) {
    // dgrad: d(gelu(pre)) = dy·W (pre stands in for the activation: the same shape and dtype).
    const Tensor dact = k::linear_backward(dy, pre, weight, true, false, false).dx;
    k::GeluGradAndOutput both = k::gelu_backward_and_forward(dact, pre, approximation, true, dpre_sum_dtype);
    r.dpre = std::move(both.dx);
    r.dpre_sum = std::move(both.dbias);
    act = std::move(both.y);
  } else if (need_dpre) {
    r.dpre = k::linear_dgelu_backward(dy, pre, weight, approximation);
  }
  if (need_linear) {
    if (!act.defined()) act = k::gelu_forward(pre, approximation);
    r.linear = k::linear_backward(dy, act, weight, false, need_dweight, need_dbias);
  }
  return r;
}

// The dtype kernels::linear_backward gives a bias gradient for this weight (f32 for an FP8 weight).
DType bias_grad_dtype(const Tensor& weight) { return is_fp8(weight.dtype()) ? DType::f32 : weight.dtype(); }

}  // namespace

// The GELU's output lives only inside this call in forward, and again inside the backward closure
// (gelu_linear_backward).
Tensor gelu_linear(const Tensor& h, kernels::GeluApproximation approximation, const Tensor& weight,
                   const Tensor& bias) {
  OCTET_CHECK(h.dim() >= 1 && weight.dim() == 2 && h.size(-1) == weight.size(1), "gelu_linear: h must be [..., in] "
              "and weight [out, in], got ", h.describe(), " and ", weight.describe());
  const Tensor hd = h.detach(), wd = weight.detach(), bd = detached(bias);
  const Tensor y = k::linear_forward(k::gelu_forward(hd, approximation), wd, bd);
  const bool nh = h.requires_grad(), nw = weight.requires_grad(), nb = bias.requires_grad();
  const DType b_dtype = bd.defined() ? bd.dtype() : h.dtype();
  return record("gelu_linear", y, {h, weight, bias}, [=](const Grads& g) -> Grads {
    const GeluLinearGrads d = gelu_linear_backward(g[0], hd, wd, approximation, nh, nw, nb);
    return {d.dpre, d.linear.dweight, nb ? d.linear.dbias.to(b_dtype) : Tensor()};
  }, {hd, nh ? wd : Tensor()});
}

// Backward goes through fc2 and the GELU as gelu_linear's does (gelu_linear_backward), whose pass over
// pre also sums fc1's bias gradient, then fc1's two GEMMs.
Tensor linear_gelu_linear(const Tensor& x, const Tensor& weight1, const Tensor& bias1,
                          kernels::GeluApproximation approximation, const Tensor& weight2, const Tensor& bias2,
                          const Tensor& residual) {
  OCTET_CHECK(x.dim() >= 1 && weight1.dim() == 2 && weight2.dim() == 2 && x.size(-1) == weight1.size(1) &&
                  weight2.size(1) == weight1.size(0),
              "linear_gelu_linear: x must be [..., in], weight1 [hidden, in] and weight2 [out, hidden], got ",
              x.describe(), ", ", weight1.describe(), " and ", weight2.describe());
  const Tensor xd = x.detach(), w1 = weight1.detach(), b1 = detached(bias1), w2 = weight2.detach(),
               b2 = detached(bias2);
  const k::LinearGeluOutput f = k::linear_gelu_forward(xd, w1, b1, approximation);
  const Tensor y = k::linear_forward(f.act, w2, b2, detached(residual));
  const bool nx = x.requires_grad(), nw1 = weight1.requires_grad(), nb1 = bias1.requires_grad(),
             nw2 = weight2.requires_grad(), nb2 = bias2.requires_grad(), nr = residual.requires_grad();
  const DType b1_dtype = b1.defined() ? b1.dtype() : x.dtype(), b2_dtype = b2.defined() ? b2.dtype() : x.dtype();
  const std::optional<DType> db1_dtype = nb1 ? std::optional<DType>(bias_grad_dtype(w1)) : std::nullopt;
  return record("linear_gelu_linear", y, {x, weight1, bias1, weight2, bias2, residual},
                [=, pre = f.pre](const Grads& g) -> Grads {
                  Tensor dx, dw1, db1;
                  const GeluLinearGrads fc2 =
                      gelu_linear_backward(g[0], pre, w2, approximation, nx || nw1 || nb1, nw2, nb2, db1_dtype);
                  const Tensor db2 = nb2 ? fc2.linear.dbias.to(b2_dtype) : Tensor();
                  if (fc2.dpre.defined()) {
                    const bool summed = fc2.dpre_sum.defined();
                    k::LinearGrads d;
                    if (nx || nw1 || (nb1 && !summed)) d = k::linear_backward(fc2.dpre, xd, w1, nx, nw1, nb1 && !summed);
                    dx = d.dx;
                    dw1 = d.dweight;
                    if (nb1) db1 = (summed ? fc2.dpre_sum : d.dbias).to(b1_dtype);
                  }
                  return {dx, dw1, db1, fc2.linear.dweight, db2, nr ? g[0] : Tensor()};
                },
                {nw1 ? xd : Tensor(), nx ? w1 : Tensor(), nx || nw1 || nb1 ? w2 : Tensor(), f.pre});
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, double label_smoothing, int64_t ignore_index) {
  const Tensor ld = logits.detach(), td = targets.detach();
  k::CrossEntropyOutput r = k::cross_entropy_forward(ld, td, label_smoothing, ignore_index);
  // Targets are class indices: only the logits are inputs to the graph.
  return record(
      "cross_entropy", r.loss, {logits},
      [=, lse = r.lse](const Grads& g) -> Grads {
        return {k::cross_entropy_backward(ld, td, lse, g[0], label_smoothing, ignore_index)};
      },
      {ld, td});
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  if (!training || p == 0.0) return x;
  OCTET_CHECK(p > 0.0 && p < 1.0, "dropout: p must be in [0, 1), got ", p);
  Generator& g = gen != nullptr ? *gen : default_generator();
  // The mask is a pure function of (seed, offset): reserve its stream now, regenerate it in backward.
  const uint64_t seed = g.seed();
  const uint64_t offset = g.reserve_for(x.numel());
  return record("dropout", k::dropout_forward(x.detach(), p, seed, offset), {x},
                [p, seed, offset](const Grads& grads) -> Grads {
                  return {k::dropout_backward(grads[0], p, seed, offset)};
                });
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, std::optional<double> scale) {
  OCTET_CHECK(q.dim() == 4, "scaled_dot_product_attention: q must be [B, H, S, D], got ", q.describe());
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  const Tensor qd = q.detach(), kd = k.detach(), vd = v.detach();
  kernels::AttentionOutput r = kernels::attention_forward(qd, kd, vd, s);
  const bool nq = q.requires_grad(), nk = k.requires_grad(), nv = v.requires_grad();
  return record("scaled_dot_product_attention", r.out, {q, k, v},
                [=, out = r.out.detach(), lse = r.lse](const Grads& g) -> Grads {
                  kernels::AttentionGrads d = kernels::attention_backward(g[0], qd, kd, vd, out, lse, s);
                  return {nq ? d.dq : Tensor(), nk ? d.dk : Tensor(), nv ? d.dv : Tensor()};
                },
                {qd, kd, vd, r.out});
}

Tensor packed_qkv_attention(const Tensor& qkv, int64_t num_heads, std::optional<double> scale) {
  OCTET_CHECK(num_heads > 0 && qkv.dim() == 3 && qkv.size(2) % (3 * num_heads) == 0 && qkv.size(2) > 0,
              "packed_qkv_attention: qkv must be [B, S, 3·H·D] for ", num_heads, " heads (the qkv projection's output), got ",
              qkv.describe(), "; its last dim must be a positive multiple of 3·num_heads = ", 3 * num_heads);
  const int64_t b = qkv.size(0), n = qkv.size(1), d = qkv.size(2) / (3 * num_heads);
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
  const Tensor packed = qkv.detach().reshape({b, n, 3, num_heads, d});  // a view: same memory
  kernels::AttentionOutput r = kernels::packed_attention_forward(packed, s);
  const Tensor out = r.out.reshape({b, n, num_heads * d});
  return record("packed_qkv_attention", out, {qkv},
                [=, out_heads = r.out.detach(), lse = r.lse](const Grads& g) -> Grads {
                  const Tensor dout = g[0].reshape({b, n, num_heads, d});
                  return {kernels::packed_attention_backward(dout, packed, out_heads, lse, s).reshape(qkv.shape())};
                },
                {packed, r.out});
}

}  // namespace octet
