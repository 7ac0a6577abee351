// Entry points for data movement: check the arguments (errors name the op and the shapes), allocate
// the contiguous result and hand raw bytes to the backend. Patchify and unpatchify are permutes of
// a reshaped view, so they share permute's kernel.
#include "kernels/shape_ops.h"

#include <string>

#include "core/op_ledger.h"
#include "kernels/common.h"
#include "kernels/cpu/shape_ops_cpu.h"
#include "kernels/cuda/shape_ops_cuda.h"

namespace octet::kernels {

namespace {

// Product of shape[from, to).
int64_t extent_product(const Shape& shape, int64_t from, int64_t to) {
  int64_t p = 1;
  for (int64_t i = from; i < to; ++i) p *= shape[i];
  return p;
}

std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + ")";
}

// Reads a 1-D i32/i64 index tensor and checks every entry against `extent`.
std::vector<int64_t> read_indices(const char* op, const Tensor& indices, int64_t extent, int64_t dim,
                                  const std::string& target) {
  OCTET_CHECK(indices.dtype() == DType::i64 || indices.dtype() == DType::i32, op, ": indices must be i64 or i32, got ",
              indices.describe());
  OCTET_CHECK(indices.dim() == 1, op, ": indices must be 1-D, got ", indices.describe());
  std::vector<int64_t> idx = indices.to_vector<int64_t>();
  for (size_t j = 0; j < idx.size(); ++j) {
    OCTET_CHECK(idx[j] >= 0 && idx[j] < extent, op, ": index ", idx[j], " (position ", j, ") is out of range for dim ",
                dim, " of extent ", extent, " (", target, ")");
  }
  return idx;
}

// The raw-byte routines on the device holding the bytes.
void permute_bytes(Device device, const void* in, void* out, const Shape& in_shape, const std::vector<int64_t>& dims,
                   size_t elem) {
  if (device.is_cuda()) return cuda::permute(device, in, out, in_shape, dims, elem);
  cpu::permute(in, out, in_shape, dims, elem);
}

void copy_rows(Device device, const void* src, int64_t src_stride, void* dst, int64_t dst_stride, int64_t rows,
               int64_t row_bytes) {
  if (device.is_cuda()) return cuda::copy_rows(device, src, src_stride, dst, dst_stride, rows, row_bytes);
  cpu::copy_rows(src, src_stride, dst, dst_stride, rows, row_bytes);
}

}  // namespace

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  constexpr const char* op = "permute";
  check_defined(op, {&x});
  const int64_t n = x.dim();
  OCTET_CHECK(static_cast<int64_t>(dims.size()) == n, op, ": dims ", list_str(dims), " has ", dims.size(),
              " entries but x is ", n, "-d (", x.describe(), ")");
  std::vector<int64_t> norm(n);
  std::vector<bool> seen(n, false);
  Shape out_shape(n);
  for (int64_t i = 0; i < n; ++i) {
    norm[i] = x.shape().normalize_dim(dims[i], op);
    OCTET_CHECK(!seen[norm[i]], op, ": dims ", list_str(dims), " is not a permutation of 0..", n - 1, " (dim ", norm[i],
                " repeats) for x: ", x.describe());
    seen[norm[i]] = true;
    out_shape[i] = x.size(norm[i]);
  }
  Tensor out = empty(out_shape, x.dtype(), x.device());
  LedgerOp ledger("permute");
  ledger.read(x).write(out);
  permute_bytes(x.device(), x.data_ptr(), out.data_ptr(), x.shape(), norm, x.element_size());
  return out;
}

Tensor transpose_last2(const Tensor& x) {
  check_defined("transpose_last2", {&x});
  OCTET_CHECK(x.dim() >= 2, "transpose_last2: needs at least 2 dims, got ", x.describe());
  std::vector<int64_t> dims(x.dim());
  for (int64_t i = 0; i < x.dim(); ++i) dims[i] = i;
  std::swap(dims[x.dim() - 2], dims[x.dim() - 1]);
  return permute(x, dims);
}

Tensor concat(const std::vector<Tensor>& xs, int64_t dim) {
  constexpr const char* op = "concat";
  OCTET_CHECK(!xs.empty(), op, ": needs at least one tensor");
  const Tensor& first = xs[0];
  for (const Tensor& x : xs) check_defined(op, {&x});
  const int64_t d = first.shape().normalize_dim(dim, op);
  Shape out_shape = first.shape();
  out_shape[d] = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = xs[i];
    OCTET_CHECK(x.dtype() == first.dtype(), op, ": tensor ", i, " is ", x.describe(), " but tensor 0 is ",
                first.describe(), "; convert with .to(dtype)");
    OCTET_CHECK(x.device() == first.device(), op, ": tensor ", i, " is ", x.describe(), " but tensor 0 is ",
                first.describe(), "; move them to one device with .to(device)");
    bool match = x.dim() == first.dim();
    for (int64_t k = 0; match && k < x.dim(); ++k) match = k == d || x.size(k) == first.size(k);
    OCTET_CHECK(match, op, ": tensor ", i, " has shape ", x.shape(), " but tensor 0 has shape ", first.shape(),
                "; all extents except dim ", d, " must match");
    out_shape[d] += x.size(d);
  }
  Tensor out = empty(out_shape, first.dtype(), first.device());
  LedgerOp ledger("concat");
  for (const Tensor& x : xs) ledger.read(x);
  ledger.write(out);
  const int64_t outer = extent_product(out_shape, 0, d);
  const int64_t inner_bytes = extent_product(out_shape, d + 1, out_shape.ndim()) * first.element_size();
  int64_t offset = 0;
  for (const Tensor& x : xs) {
    const int64_t band = x.size(d) * inner_bytes;
    copy_rows(out.device(), x.data_ptr(), band, static_cast<char*>(out.data_ptr()) + offset, out_shape[d] * inner_bytes,
              outer, band);
    offset += band;
  }
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  constexpr const char* op = "split";
  check_defined(op, {&x});
  const int64_t d = x.shape().normalize_dim(dim, op);
  int64_t total = 0;
  for (int64_t s : sizes) {
    OCTET_CHECK(s >= 0, op, ": sizes ", list_str(sizes), " has a negative entry (x: ", x.describe(), ")");
    total += s;
  }
  OCTET_CHECK(total == x.size(d), op, ": sizes ", list_str(sizes), " add up to ", total, " but dim ", d, " of ",
              x.describe(), " has extent ", x.size(d));
  LedgerOp ledger("split");
  ledger.read(x).write(x);
  const int64_t outer = extent_product(x.shape(), 0, d);
  const int64_t inner_bytes = extent_product(x.shape(), d + 1, x.dim()) * x.element_size();
  std::vector<Tensor> pieces;
  int64_t offset = 0;
  for (int64_t s : sizes) {
    Shape shape = x.shape();
    shape[d] = s;
    Tensor piece = empty(shape, x.dtype(), x.device());
    const int64_t band = s * inner_bytes;
    copy_rows(x.device(), static_cast<const char*>(x.data_ptr()) + offset, x.size(d) * inner_bytes, piece.data_ptr(),
              band, outer, band);
    offset += band;
    pieces.push_back(std::move(piece));
  }
  return pieces;
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  constexpr const char* op = "slice";
  check_defined(op, {&x});
  const int64_t d = x.shape().normalize_dim(dim, op);
  OCTET_CHECK(start >= 0 && length >= 0 && start + length <= x.size(d), op, ": rows [", start, ", ", start + length,
              ") are outside dim ", d, " (extent ", x.size(d), ") of ", x.describe());
  Shape shape = x.shape();
  shape[d] = length;
  Tensor out = empty(shape, x.dtype(), x.device());
  LedgerOp ledger("slice");
  ledger.read(out).write(out);  // reads only the rows it copies
  const int64_t inner_bytes = extent_product(x.shape(), d + 1, x.dim()) * x.element_size();
  copy_rows(x.device(), static_cast<const char*>(x.data_ptr()) + start * inner_bytes, x.size(d) * inner_bytes,
            out.data_ptr(), length * inner_bytes, extent_product(x.shape(), 0, d), length * inner_bytes);
  return out;
}

Tensor slice_backward(const Tensor& grad, const Shape& full_shape, int64_t dim, int64_t start) {
  constexpr const char* op = "slice_backward";
  check_defined(op, {&grad});
  const int64_t d = full_shape.normalize_dim(dim, op);
  bool match = grad.dim() == full_shape.ndim();
  for (int64_t k = 0; match && k < grad.dim(); ++k) match = k == d || grad.size(k) == full_shape[k];
  OCTET_CHECK(match, op, ": grad ", grad.describe(), " does not fit full shape ", full_shape, " outside dim ", d);
  const int64_t length = grad.size(d);
  OCTET_CHECK(start >= 0 && start + length <= full_shape[d], op, ": rows [", start, ", ", start + length,
              ") are outside dim ", d, " (extent ", full_shape[d], ") of full shape ", full_shape, " (grad ",
              grad.describe(), ")");
  Tensor out = empty(full_shape, grad.dtype(), grad.device());
  LedgerOp ledger("slice_backward");
  ledger.read(grad).write(out);
  const int64_t inner_bytes = extent_product(full_shape, d + 1, full_shape.ndim()) * grad.element_size();
  // Zero bytes are 0.0 in every floating dtype, so the band and the zeros around it are written in one pass.
  if (grad.is_cuda()) {
    cuda::place_band(grad.device(), grad.data_ptr(), extent_product(full_shape, 0, d), full_shape[d] * inner_bytes,
                     start * inner_bytes, length * inner_bytes, out.data_ptr());
    return out;
  }
  check_cpu(op, {&grad});
  cpu::place_band(grad.data_ptr(), extent_product(full_shape, 0, d), full_shape[d] * inner_bytes,
                  start * inner_bytes, length * inner_bytes, out.data_ptr());
  return out;
}

// [B, C, H, W] is [B, C, H/p, p, W/p, p]; patches are its permute (0, 2, 4, 1, 3, 5), which is
// [B, H/p, W/p, C, p, p] = [B, N, C·p·p] in memory.
Tensor patchify(const Tensor& images, int64_t patch) {
  constexpr const char* op = "patchify";
  check_defined(op, {&images});
  check_dim(op, images, 4);
  const int64_t b = images.size(0), c = images.size(1), h = images.size(2), w = images.size(3);
  OCTET_CHECK(patch >= 1, op, ": patch size must be positive, got ", patch);
  OCTET_CHECK(h % patch == 0 && w % patch == 0, op, ": image height ", h, " and width ", w,
              " must be multiples of the patch size ", patch, " (images: ", images.describe(), ")");
  const int64_t gh = h / patch, gw = w / patch;
  Tensor out = empty({b, gh * gw, c * patch * patch}, images.dtype(), images.device());
  LedgerOp ledger("patchify");
  ledger.read(images).write(out);
  permute_bytes(images.device(), images.data_ptr(), out.data_ptr(), Shape{b, c, gh, patch, gw, patch},
                {0, 2, 4, 1, 3, 5}, images.element_size());
  return out;
}

// The inverse permute: [B, H/p, W/p, C, p, p] -> (0, 3, 1, 4, 2, 5) -> [B, C, H/p, p, W/p, p].
Tensor unpatchify(const Tensor& patches, int64_t patch, int64_t channels, int64_t height, int64_t width) {
  constexpr const char* op = "unpatchify";
  check_defined(op, {&patches});
  check_dim(op, patches, 3);
  OCTET_CHECK(patch >= 1 && channels >= 1, op, ": patch size ", patch, " and channels ", channels, " must be positive");
  OCTET_CHECK(height % patch == 0 && width % patch == 0, op, ": image height ", height, " and width ", width,
              " must be multiples of the patch size ", patch, " (patches: ", patches.describe(), ")");
  const int64_t gh = height / patch, gw = width / patch, b = patches.size(0);
  const Shape expected{b, gh * gw, channels * patch * patch};
  OCTET_CHECK(patches.shape() == expected, op, ": patches ", patches.describe(), " should have shape ", expected,
              " for ", channels, "x", height, "x", width, " images and patch size ", patch);
  Tensor out = empty({b, channels, height, width}, patches.dtype(), patches.device());
  LedgerOp ledger("unpatchify");
  ledger.read(patches).write(out);
  permute_bytes(patches.device(), patches.data_ptr(), out.data_ptr(), Shape{b, gh, gw, channels, patch, patch},
                {0, 3, 1, 4, 2, 5}, patches.element_size());
  return out;
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& indices) {
  constexpr const char* op = "index_select";
  check_defined(op, {&x, &indices});  // the indices are read on the host, wherever they live
  const int64_t d = x.shape().normalize_dim(dim, op);
  const std::vector<int64_t> idx = read_indices(op, indices, x.size(d), d, "x: " + x.describe());
  Shape shape = x.shape();
  shape[d] = static_cast<int64_t>(idx.size());
  Tensor out = empty(shape, x.dtype(), x.device());
  LedgerOp ledger("index_select");
  ledger.read(out).write(out);  // reads the rows it gathers
  if (x.is_cuda()) {
    cuda::gather_rows(x.device(), x.data_ptr(), out.data_ptr(), extent_product(x.shape(), 0, d), x.size(d),
                      extent_product(x.shape(), d + 1, x.dim()), idx, x.element_size());
    return out;
  }
  check_cpu(op, {&x});
  cpu::gather_rows(x.data_ptr(), out.data_ptr(), extent_product(x.shape(), 0, d), x.size(d),
                   extent_product(x.shape(), d + 1, x.dim()), idx, x.element_size());
  return out;
}

Tensor index_select_backward(const Tensor& grad, const Shape& full_shape, int64_t dim, const Tensor& indices) {
  constexpr const char* op = "index_select_backward";
  check_defined(op, {&grad, &indices});
  check_floating(op, grad);
  const int64_t d = full_shape.normalize_dim(dim, op);
  const std::vector<int64_t> idx =
      read_indices(op, indices, full_shape[d], d, "full shape " + full_shape.str() + ", grad " + grad.describe());
  bool match = grad.dim() == full_shape.ndim();
  for (int64_t k = 0; match && k < grad.dim(); ++k) {
    match = grad.size(k) == (k == d ? static_cast<int64_t>(idx.size()) : full_shape[k]);
  }
  OCTET_CHECK(match, op, ": grad ", grad.describe(), " should be full shape ", full_shape, " with dim ", d,
              " replaced by the ", idx.size(), " indices");
  LedgerOp ledger("index_select_backward");
  ledger.read(grad).write_bytes(full_shape.numel() * static_cast<int64_t>(grad.element_size()));
  if (grad.is_cuda()) {
    return cuda::scatter_add_rows(grad, full_shape, extent_product(full_shape, 0, d), full_shape[d],
                                  extent_product(full_shape, d + 1, full_shape.ndim()), idx);
  }
  check_cpu(op, {&grad});
  // Accumulate in the compute dtype so repeated bf16 rows are summed in f32 and rounded once.
  const Tensor g = to_compute(grad);
  Tensor acc = empty(full_shape, g.dtype(), grad.device());
  cpu::zero_bytes(acc.data_ptr(), static_cast<int64_t>(acc.nbytes()));
  with_compute_type(g.dtype(), [&]<class T>() {
    cpu::scatter_add_rows<T>(g.data<T>(), acc.data<T>(), extent_product(full_shape, 0, d), full_shape[d],
                             extent_product(full_shape, d + 1, full_shape.ndim()), idx);
  });
  return acc.to(grad.dtype());
}

}  // namespace octet::kernels
