// Differentiable reductions and softmax. A reduction's gradient is the output gradient spread back
// over the reduced elements: broadcast (sum), broadcast and scaled (mean), or routed to the argmax.
#include "autograd/function.h"
#include "autograd/ops.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace octet {

using autograd::Grads;
using autograd::record;
namespace k = kernels;

namespace {

// a's shape with dim d kept as extent 1: the shape a keepdim=false gradient is first restored to.
Shape keepdim_shape(const Shape& shape, int64_t d) {
  Shape s = shape;
  s[d] = 1;
  return s;
}

// g (the gradient of a reduction over `dim`) broadcast back over the reduced dim.
Tensor spread(const Tensor& g, const Shape& input_shape, int64_t dim) {
  return k::broadcast_to(g.reshape(keepdim_shape(input_shape, dim)), input_shape);
}

}  // namespace

Tensor sum(const Tensor& a) {
  const Shape shape = a.shape();
  return record("sum", k::sum(a.detach()), {a},
                [shape](const Grads& g) -> Grads { return {k::broadcast_to(g[0], shape)}; });
}

Tensor sum(const Tensor& a, int64_t dim, bool keepdim) {
  const Shape shape = a.shape();
  const int64_t d = shape.normalize_dim(dim, "sum");
  return record("sum_dim", k::sum(a.detach(), d, keepdim), {a},
                [shape, d](const Grads& g) -> Grads { return {spread(g[0], shape, d)}; });
}

Tensor mean(const Tensor& a) {
  const Shape shape = a.shape();
  const double scale = 1.0 / static_cast<double>(a.numel());
  return record("mean", k::mean(a.detach()), {a}, [shape, scale](const Grads& g) -> Grads {
    return {k::broadcast_to(k::mul_scalar(g[0], scale), shape)};
  });
}

Tensor mean(const Tensor& a, int64_t dim, bool keepdim) {
  const Shape shape = a.shape();
  const int64_t d = shape.normalize_dim(dim, "mean");
  const double scale = 1.0 / static_cast<double>(shape[d]);
  return record("mean_dim", k::mean(a.detach(), d, keepdim), {a}, [shape, d, scale](const Grads& g) -> Grads {
    return {spread(k::mul_scalar(g[0], scale), shape, d)};
  });
}

Tensor max(const Tensor& a, int64_t dim, bool keepdim) {
  const Shape shape = a.shape();
  const int64_t d = shape.normalize_dim(dim, "max");
  k::MaxResult r = k::max(a.detach(), d, keepdim);
  // The gradient is g at the first argmax and 0 elsewhere. The one-hot mask is built from kernels
  // (1 - |sign(position - index)|) so that it runs wherever the tensors live; positions are f32,
  // exact for any extent a tensor can have along one dim here.
  return record("max_dim", r.values, {a}, [shape, d, dtype = a.dtype(), indices = r.indices](const Grads& g) -> Grads {
    Shape position_shape(static_cast<size_t>(shape.ndim()), 1);
    position_shape[d] = shape[d];
    const Tensor position =
        arange(0.0, static_cast<double>(shape[d]), 1.0, DType::f32, indices.device()).reshape(position_shape);
    const Tensor index = indices.reshape(keepdim_shape(shape, d)).to(DType::f32);
    const Tensor one_hot = k::rsub_scalar(k::abs(k::sign(k::sub(position, index))), 1.0).to(dtype);
    return {k::mul(one_hot, g[0].reshape(keepdim_shape(shape, d)))};
  });
}

Tensor softmax(const Tensor& a, int64_t dim) {
  const int64_t d = a.shape().normalize_dim(dim, "softmax");
  Tensor y = k::softmax(a.detach(), d);
  return record(
      "softmax", y, {a}, [y = y.detach(), d](const Grads& g) -> Grads { return {k::softmax_backward(y, g[0], d)}; },
      {y});
}

Tensor log_softmax(const Tensor& a, int64_t dim) {
  const int64_t d = a.shape().normalize_dim(dim, "log_softmax");
  Tensor y = k::log_softmax(a.detach(), d);
  return record(
      "log_softmax", y, {a},
      [y = y.detach(), d](const Grads& g) -> Grads { return {k::log_softmax_backward(y, g[0], d)}; }, {y});
}

}  // namespace octet
