// Differentiable shape ops and data movement. reshape, flatten, and slices that stay contiguous
// (narrow; select, slice and split when every dim before the sliced one has extent 1) return views
// of the input's storage; the rest copy through kernels/shape_ops.h.
#include "autograd/function.h"
#include "autograd/ops.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"
#include "kernels/shape_ops.h"

namespace octet {

using autograd::Grads;
using autograd::record;
namespace k = kernels;

namespace {

// A slice along dim d is one contiguous run of a's storage when every dim before d has extent 1.
bool slice_is_contiguous(const Shape& shape, int64_t d) {
  for (int64_t i = 0; i < d; ++i) {
    if (shape[i] != 1) return false;
  }
  return true;
}

// Rows [start, start + length) of a along d, as a view when possible and a copy otherwise.
Tensor slice_data(const Tensor& a, int64_t d, int64_t start, int64_t length) {
  const Shape& shape = a.shape();
  OCTET_CHECK(start >= 0 && length >= 0 && start + length <= shape[d], "slice: [", start, ", ", start + length,
              ") is outside dim ", d, " of ", a.describe());
  if (!slice_is_contiguous(shape, d)) return k::slice(a.detach(), d, start, length);
  Shape rows(shape.begin() + d, shape.end());
  Shape out = shape;
  out[d] = length;
  return a.detach().reshape(rows).narrow(start, length).reshape(out);
}

// The gradient of any slice: g placed at [start, start + length) of zeros of the input's shape.
// g is reshaped first because select drops dim d.
autograd::BackwardFn slice_grad(Shape full, int64_t d, int64_t start, int64_t length) {
  return [full = std::move(full), d, start, length](const Grads& g) -> Grads {
    Shape kept = full;
    kept[d] = length;
    return {k::slice_backward(g[0].reshape(kept), full, d, start)};
  };
}

}  // namespace

// ---- views --------------------------------------------------------------------------------------

Tensor reshape(const Tensor& a, const Shape& shape) {
  const Shape in = a.shape();
  return record("reshape", a.detach().reshape(shape), {a},
                [in](const Grads& g) -> Grads { return {g[0].reshape(in)}; });
}

Tensor flatten(const Tensor& a, int64_t start_dim) {
  if (a.dim() == 0) return reshape(a, {1});
  const int64_t d = a.shape().normalize_dim(start_dim, "flatten");
  Shape out(a.shape().begin(), a.shape().begin() + d);
  out.push_back(-1);
  return reshape(a, out);
}

Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t length) {
  const int64_t d = a.shape().normalize_dim(dim, "slice");
  return record("slice", slice_data(a, d, start, length), {a}, slice_grad(a.shape(), d, start, length));
}

Tensor narrow(const Tensor& a, int64_t start, int64_t length) { return slice(a, 0, start, length); }

Tensor select(const Tensor& a, int64_t dim, int64_t index) {
  const int64_t d = a.shape().normalize_dim(dim, "select");
  OCTET_CHECK(index >= 0 && index < a.shape()[d], "select: index ", index, " is outside dim ", d, " of ",
              a.describe());
  Shape out = a.shape();
  out.erase(out.begin() + d);
  return record("select", slice_data(a, d, index, 1).reshape(out), {a}, slice_grad(a.shape(), d, index, 1));
}

// ---- copies ----------------------------------------------------------------------------------------

Tensor permute(const Tensor& a, const std::vector<int64_t>& dims) {
  const Shape& shape = a.shape();
  OCTET_CHECK(static_cast<int64_t>(dims.size()) == shape.ndim(), "permute: ", dims.size(), " dims for ",
              a.describe());
  // Output dim i is input dim dims[i], so the gradient goes back through the inverse permutation.
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) inverse[shape.normalize_dim(dims[i], "permute")] = static_cast<int64_t>(i);
  return record("permute", k::permute(a.detach(), dims), {a},
                [inverse](const Grads& g) -> Grads { return {k::permute(g[0], inverse)}; });
}

Tensor transpose(const Tensor& a) {
  return record("transpose", k::transpose_last2(a.detach()), {a},
                [](const Grads& g) -> Grads { return {k::transpose_last2(g[0])}; });
}

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  OCTET_CHECK(!xs.empty(), "concat: no tensors");
  const int64_t d = xs[0].shape().normalize_dim(dim, "concat");
  std::vector<Tensor> detached;
  std::vector<int64_t> sizes;
  std::vector<bool> needed;
  for (const Tensor& x : xs) {
    detached.push_back(x.detach());
    sizes.push_back(x.dim() > d ? x.shape()[d] : 0);
    needed.push_back(x.requires_grad());
  }
  return record("concat", k::concat(detached, d), xs, [sizes, needed, d](const Grads& g) -> Grads {
    std::vector<Tensor> parts = k::split(g[0], sizes, d);
    for (size_t i = 0; i < parts.size(); ++i) {
      if (!needed[i]) parts[i] = Tensor();
    }
    return parts;
  });
}

std::vector<Tensor> split(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim) {
  const int64_t d = a.shape().normalize_dim(dim, "split");
  // Pieces are views when they are contiguous runs (q, k, v out of [3, B, H, N, hd]); otherwise, or
  // when the sizes are wrong (kernels::split names the problem), copies.
  int64_t total = 0;
  bool sizes_ok = true;
  for (int64_t s : sizes) {
    sizes_ok = sizes_ok && s >= 0;
    total += s;
  }
  std::vector<Tensor> pieces;
  if (sizes_ok && total == a.shape()[d] && slice_is_contiguous(a.shape(), d)) {
    int64_t start = 0;
    for (int64_t s : sizes) {
      pieces.push_back(slice_data(a, d, start, s));
      start += s;
    }
  } else {
    pieces = k::split(a.detach(), sizes, d);
  }
  // The engine hands zeros to pieces that received no gradient, so concat sees every piece.
  return record("split", std::move(pieces), {a}, [d](const Grads& g) -> Grads { return {k::concat(g, d)}; });
}

Tensor broadcast_to(const Tensor& a, const Shape& shape) {
  const Shape in = a.shape();
  return record("broadcast_to", k::broadcast_to(a.detach(), shape), {a},
                [in](const Grads& g) -> Grads { return {k::sum_to(g[0], in)}; });
}

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& indices) {
  const Shape in = a.shape();
  const int64_t d = in.normalize_dim(dim, "index_select");
  const Tensor idx = indices.detach();
  return record(
      "index_select", k::index_select(a.detach(), d, idx), {a},
      [in, d, idx](const Grads& g) -> Grads { return {k::index_select_backward(g[0], in, d, idx)}; }, {idx});
}

Tensor patchify(const Tensor& images, int64_t patch) {
  OCTET_CHECK(images.dim() == 4, "patchify: images must be [B, C, H, W], got ", images.describe());
  const int64_t c = images.size(1), h = images.size(2), w = images.size(3);
  return record("patchify", k::patchify(images.detach(), patch), {images}, [=](const Grads& g) -> Grads {
    return {k::unpatchify(g[0], patch, c, h, w)};
  });
}

Tensor cast(const Tensor& a, DType dtype) {
  // Integer results carry no gradient, so there is nothing to record.
  if (!is_floating(dtype)) return a.detach().to(dtype);
  const DType in = a.dtype();
  return record("cast", a.detach().to(dtype), {a}, [in](const Grads& g) -> Grads { return {g[0].to(in)}; });
}

Tensor to_device(const Tensor& a, Device device) {
  const Device in = a.device();
  return record("to_device", a.detach().to(device), {a}, [in](const Grads& g) -> Grads { return {g[0].to(in)}; });
}

Tensor clone(const Tensor& a) {
  return record("clone", a.detach().clone(), {a}, [](const Grads& g) -> Grads { return {g[0]}; });
}

}  // namespace octet
