// Differentiable elementwise arithmetic. Binary ops broadcast, so their gradients are summed back
// to each operand's shape (kernels::sum_to). Kernels always see detached tensors: they may reshape
// or convert their arguments, which core refuses on tensors that record.
#include "autograd/function.h"
#include "autograd/ops.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace octet {

using autograd::Grads;
using autograd::record;
namespace k = kernels;

namespace {

// g reduced to the operand's shape, or undefined when the operand needs no gradient. g itself when
// nothing is broadcast (a residual add): the engine never writes into a gradient it was handed, so
// both operands may share it, and sum_to would copy it.
Tensor reduce_if(bool needed, const Tensor& g, const Shape& shape) {
  if (!needed) return Tensor();
  return g.shape() == shape ? g : k::sum_to(g, shape);
}

// s - a and s / a: not in the public API (the operators reach them), but they record like any op.
Tensor rsub_scalar(const Tensor& a, double s) {
  return record("rsub_scalar", k::rsub_scalar(a.detach(), s), {a},
                [](const Grads& g) -> Grads { return {k::neg(g[0])}; });
}

Tensor rdiv_scalar(const Tensor& a, double s) {
  const Tensor ad = a.detach();
  Tensor out = k::rdiv_scalar(ad, s);
  // d(s/a)/da = -s/a² = -out/a
  return record(
      "rdiv_scalar", out, {a},
      [ad, out = out.detach()](const Grads& g) -> Grads { return {k::neg(k::mul(g[0], k::div(out, ad)))}; },
      {ad, out});
}

}  // namespace

// ---- binary, broadcasting -------------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b) {
  const Shape sa = a.shape(), sb = b.shape();
  const bool na = a.requires_grad(), nb = b.requires_grad();
  return record("add", k::add(a.detach(), b.detach()), {a, b}, [=](const Grads& g) -> Grads {
    return {reduce_if(na, g[0], sa), reduce_if(nb, g[0], sb)};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  const Shape sa = a.shape(), sb = b.shape();
  const bool na = a.requires_grad(), nb = b.requires_grad();
  return record("sub", k::sub(a.detach(), b.detach()), {a, b}, [=](const Grads& g) -> Grads {
    return {reduce_if(na, g[0], sa), nb ? k::neg(k::sum_to(g[0], sb)) : Tensor()};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  const Tensor ad = a.detach(), bd = b.detach();
  const bool na = a.requires_grad(), nb = b.requires_grad();
  return record(
      "mul", k::mul(ad, bd), {a, b},
      [=](const Grads& g) -> Grads {
        return {na ? k::sum_to(k::mul(g[0], bd), ad.shape()) : Tensor(),
                nb ? k::sum_to(k::mul(g[0], ad), bd.shape()) : Tensor()};
      },
      {nb ? ad : Tensor(), na ? bd : Tensor()});
}

Tensor div(const Tensor& a, const Tensor& b) {
  const Tensor ad = a.detach(), bd = b.detach();
  const bool na = a.requires_grad(), nb = b.requires_grad();
  Tensor out = k::div(ad, bd);
  // da = g/b, db = -g·a/b² = -(g/b)·out
  return record(
      "div", out, {a, b},
      [=, out = out.detach()](const Grads& g) -> Grads {
        const Tensor g_over_b = k::div(g[0], bd);
        return {reduce_if(na, g_over_b, ad.shape()),
                nb ? k::sum_to(k::neg(k::mul(g_over_b, out)), bd.shape()) : Tensor()};
      },
      {bd, nb ? out : Tensor()});
}

Tensor pow(const Tensor& a, const Tensor& b) {
  const Tensor ad = a.detach(), bd = b.detach();
  const bool na = a.requires_grad(), nb = b.requires_grad();
  Tensor out = k::pow(ad, bd);
  // da = g·b·a^(b-1), db = g·a^b·ln a (hence a > 0 where db is needed)
  return record(
      "pow", out, {a, b},
      [=, out = out.detach()](const Grads& g) -> Grads {
        Tensor da, db;
        if (na) da = k::sum_to(k::mul(g[0], k::mul(bd, k::pow(ad, k::add_scalar(bd, -1.0)))), ad.shape());
        if (nb) db = k::sum_to(k::mul(g[0], k::mul(out, k::log(ad))), bd.shape());
        return {da, db};
      },
      {ad, bd, nb ? out : Tensor()});
}

// ---- with a scalar ----------------------------------------------------------------------------------

Tensor add(const Tensor& a, double s) {
  return record("add_scalar", k::add_scalar(a.detach(), s), {a}, [](const Grads& g) -> Grads { return {g[0]}; });
}

Tensor mul(const Tensor& a, double s) {
  return record("mul_scalar", k::mul_scalar(a.detach(), s), {a},
                [s](const Grads& g) -> Grads { return {k::mul_scalar(g[0], s)}; });
}

Tensor pow(const Tensor& a, double exponent) {
  const Tensor ad = a.detach();
  // d(a^e)/da = e·a^(e-1)
  return record(
      "pow_scalar", k::pow_scalar(ad, exponent), {a},
      [ad, exponent](const Grads& g) -> Grads {
        return {k::mul(g[0], k::mul_scalar(k::pow_scalar(ad, exponent - 1.0), exponent))};
      },
      {ad});
}

// ---- unary --------------------------------------------------------------------------------------------

Tensor neg(const Tensor& a) {
  return record("neg", k::neg(a.detach()), {a}, [](const Grads& g) -> Grads { return {k::neg(g[0])}; });
}

Tensor exp(const Tensor& a) {
  Tensor out = k::exp(a.detach());
  return record(
      "exp", out, {a}, [out = out.detach()](const Grads& g) -> Grads { return {k::mul(g[0], out)}; }, {out});
}

Tensor log(const Tensor& a) {
  const Tensor ad = a.detach();
  return record("log", k::log(ad), {a}, [ad](const Grads& g) -> Grads { return {k::div(g[0], ad)}; }, {ad});
}

Tensor tanh(const Tensor& a) {
  Tensor out = k::tanh(a.detach());
  // d tanh = 1 - tanh²
  return record(
      "tanh", out, {a},
      [out = out.detach()](const Grads& g) -> Grads { return {k::mul(g[0], k::rsub_scalar(k::mul(out, out), 1.0))}; },
      {out});
}

Tensor sqrt(const Tensor& a) {
  Tensor out = k::sqrt(a.detach());
  // d sqrt(a) = 1 / (2·sqrt(a))
  return record(
      "sqrt", out, {a},
      [out = out.detach()](const Grads& g) -> Grads { return {k::div(k::mul_scalar(g[0], 0.5), out)}; }, {out});
}

Tensor rsqrt(const Tensor& a) {
  Tensor out = k::rsqrt(a.detach());
  // d a^(-1/2) = -a^(-3/2)/2 = -out³/2
  return record(
      "rsqrt", out, {a},
      [out = out.detach()](const Grads& g) -> Grads {
        return {k::mul(g[0], k::mul_scalar(k::pow_scalar(out, 3.0), -0.5))};
      },
      {out});
}

// ---- operators ----------------------------------------------------------------------------------------

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& a) { return neg(a); }
Tensor operator+(const Tensor& a, double s) { return add(a, s); }
Tensor operator+(double s, const Tensor& a) { return add(a, s); }
Tensor operator-(const Tensor& a, double s) { return add(a, -s); }
Tensor operator-(double s, const Tensor& a) { return rsub_scalar(a, s); }
Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
// A reciprocal multiply: one rounding more than a true division, which no consumer here can see.
Tensor operator/(const Tensor& a, double s) { return mul(a, 1.0 / s); }
Tensor operator/(double s, const Tensor& a) { return rdiv_scalar(a, s); }

}  // namespace octet
