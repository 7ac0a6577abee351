// CPU data movement over raw elements: permute, row-band copies (concat/split/slice), gathers and
// their accumulating transpose.
#include <algorithm>
#include <cstring>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/error.h"
#include "kernels/index_math.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/shape_ops_cpu.h"

namespace octet::kernels::cpu {

namespace {

// Below this many bytes moved, threads cost more than they save.
constexpr int64_t kParallelBytes = int64_t{1} << 18;
// Side of the square tiles a strided permute moves, so that the reads and the writes of a tile both
// stay within a few cache lines. Small, because with power-of-two strides every row of a tile maps
// to the same L1 set and 32 rows would evict each other.
constexpr int64_t kTile = 16;

using Walk = PermuteWalk;  // kernels/index_math.h

// Calls fn(in_offset, out_offset, index) for every multi-index of `extent` in row-major order,
// split into contiguous ranges across threads when `parallel`. Each thread turns the start of its
// range into a multi-index once and then counts like an odometer, so no item pays for divisions.
template <class F>
void walk_outer(const std::vector<int64_t>& extent, const std::vector<int64_t>& in_stride,
                const std::vector<int64_t>& out_stride, bool parallel, F&& fn) {
  const int64_t nd = static_cast<int64_t>(extent.size());
  int64_t count = 1;
  for (int64_t e : extent) count *= e;
#pragma omp parallel if (parallel && count > 1)
  {
    int64_t nt = 1, t = 0;
#ifdef _OPENMP
    nt = omp_get_num_threads();
    t = omp_get_thread_num();
#endif
    const int64_t lo = count * t / nt, hi = count * (t + 1) / nt;
    std::vector<int64_t> idx(nd);
    int64_t in_off = 0, out_off = 0, rem = lo;
    for (int64_t d = nd - 1; d >= 0; --d) {
      idx[d] = rem % extent[d];
      rem /= extent[d];
      in_off += idx[d] * in_stride[d];
      out_off += idx[d] * out_stride[d];
    }
    for (int64_t i = lo; i < hi; ++i) {
      fn(in_off, out_off, idx.data());
      for (int64_t d = nd - 1; d >= 0; --d) {
        in_off += in_stride[d];
        out_off += out_stride[d];
        if (++idx[d] < extent[d]) break;
        in_off -= extent[d] * in_stride[d];
        out_off -= extent[d] * out_stride[d];
        idx[d] = 0;
      }
    }
  }
}

// E is an unsigned integer of the element's size: moving elements needs only their bits.
template <class E>
void permute_typed(const E* in, E* out, const Walk& w, int64_t numel) {
  const int64_t n = static_cast<int64_t>(w.extent.size());
  std::vector<int64_t> out_stride(n);
  int64_t s = 1;
  for (int64_t k = n - 1; k >= 0; --k) {
    out_stride[k] = s;
    s *= w.extent[k];
  }
  const bool parallel = numel * static_cast<int64_t>(sizeof(E)) >= kParallelBytes;
  const int64_t last = n - 1;
  // After simplification exactly one out dim reads the input with stride 1 (the input's innermost).
  const int64_t c = std::find(w.in_stride.begin(), w.in_stride.end(), 1) - w.in_stride.begin();
  OCTET_CHECK(c < n, "permute: internal error, no unit-stride dim");

  if (c == last) {
    // Fast path: the innermost run is contiguous on both sides, one memcpy per run.
    const int64_t run = w.extent[last];
    const std::vector<int64_t> ext(w.extent.begin(), w.extent.end() - 1);
    const std::vector<int64_t> ist(w.in_stride.begin(), w.in_stride.end() - 1);
    const std::vector<int64_t> ost(out_stride.begin(), out_stride.end() - 1);
    walk_outer(ext, ist, ost, parallel, [&](int64_t io, int64_t oo, const int64_t*) {
      std::memcpy(out + oo, in + io, static_cast<size_t>(run) * sizeof(E));
    });
    return;
  }

  // Otherwise dim c is contiguous in the input and `last` in the output: a 2-D transpose between
  // them, done in kTile×kTile tiles, for every index of the other dims. Tiles along c become the
  // innermost walked dim so that a single large transpose still splits across threads.
  const int64_t a_ext = w.extent[c], b_ext = w.extent[last];
  const int64_t a_out = out_stride[c], b_in = w.in_stride[last];
  std::vector<int64_t> ext, ist, ost;
  for (int64_t k = 0; k < last; ++k) {
    if (k == c) continue;
    ext.push_back(w.extent[k]);
    ist.push_back(w.in_stride[k]);
    ost.push_back(out_stride[k]);
  }
  ext.push_back((a_ext + kTile - 1) / kTile);
  ist.push_back(kTile);
  ost.push_back(kTile * a_out);
  const size_t tile_dim = ext.size() - 1;
  walk_outer(ext, ist, ost, parallel, [&](int64_t io, int64_t oo, const int64_t* idx) {
    const int64_t a_len = std::min(kTile, a_ext - idx[tile_dim] * kTile);
    for (int64_t b0 = 0; b0 < b_ext; b0 += kTile) {
      const int64_t b_len = std::min(kTile, b_ext - b0);
      for (int64_t a = 0; a < a_len; ++a) {
        E* dst = out + oo + a * a_out + b0;
        const E* src = in + io + a + b0 * b_in;
        for (int64_t b = 0; b < b_len; ++b) dst[b] = src[b * b_in];
      }
    }
  });
}

}  // namespace

void permute(const void* in, void* out, const Shape& in_shape, const std::vector<int64_t>& dims, size_t elem) {
  const int64_t numel = in_shape.numel();
  if (numel == 0) return;
  const Walk w = simplify_permute(in_shape, dims);
  if (w.extent.size() <= 1) {  // nothing actually moves: the permute is an identity on memory
    std::memcpy(out, in, static_cast<size_t>(numel) * elem);
    return;
  }
  switch (elem) {
    case 1:
      permute_typed(static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out), w, numel);
      break;
    case 2:
      permute_typed(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(out), w, numel);
      break;
    case 4:
      permute_typed(static_cast<const uint32_t*>(in), static_cast<uint32_t*>(out), w, numel);
      break;
    case 8:
      permute_typed(static_cast<const uint64_t*>(in), static_cast<uint64_t*>(out), w, numel);
      break;
    default:
      OCTET_FAIL("permute: unsupported element size ", elem);
  }
}

void copy_rows(const void* src, int64_t src_stride, void* dst, int64_t dst_stride, int64_t rows, int64_t row_bytes) {
  if (rows == 0 || row_bytes == 0) return;
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  if (src_stride == row_bytes && dst_stride == row_bytes) {  // the rows are one block on both sides
    std::memcpy(d, s, static_cast<size_t>(rows * row_bytes));
    return;
  }
#pragma omp parallel for schedule(static) if (rows > 1 && rows * row_bytes >= kParallelBytes)
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(d + r * dst_stride, s + r * src_stride, static_cast<size_t>(row_bytes));
  }
}

void place_band(const void* src, int64_t rows, int64_t row_bytes, int64_t band_begin, int64_t band_bytes, void* dst) {
  const auto* s = static_cast<const char*>(src);
  auto* d = static_cast<char*>(dst);
  const int64_t band_end = band_begin + band_bytes;
  // Threads take consecutive byte ranges of dst, so one huge row (a slice along dim 0) splits too.
  parallel_ranges(rows * row_bytes, kParallelBytes, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo / row_bytes; r * row_bytes < hi; ++r) {
      const int64_t row = r * row_bytes;
      // Writes row-relative bytes [b0, b1) clipped to [lo, hi): from `from` (at row offset b0), or zeros.
      auto part = [&](int64_t b0, int64_t b1, const char* from) {
        const int64_t first = std::max(lo, row + b0), last = std::min(hi, row + b1);
        if (last <= first) return;
        if (from) std::memcpy(d + first, from + (first - row - b0), static_cast<size_t>(last - first));
        else std::memset(d + first, 0, static_cast<size_t>(last - first));
      };
      part(0, band_begin, nullptr);
      part(band_begin, band_end, s + r * band_bytes);
      part(band_end, row_bytes, nullptr);
    }
  });
}

void zero_bytes(void* dst, int64_t nbytes) {
  auto* d = static_cast<char*>(dst);
  parallel_ranges(nbytes, kParallelBytes, [&](int64_t lo, int64_t hi) {
    std::memset(d + lo, 0, static_cast<size_t>(hi - lo));
  });
}

void gather_rows(const void* x, void* out, int64_t outer, int64_t extent, int64_t inner,
                 const std::vector<int64_t>& indices, size_t elem) {
  const int64_t n = static_cast<int64_t>(indices.size());
  const int64_t row = inner * static_cast<int64_t>(elem);
  const auto* src = static_cast<const char*>(x);
  auto* dst = static_cast<char*>(out);
#pragma omp parallel for schedule(static) if (outer * n * row >= kParallelBytes)
  for (int64_t i = 0; i < outer * n; ++i) {
    const int64_t o = i / n, j = i % n;
    std::memcpy(dst + i * row, src + (o * extent + indices[j]) * row, static_cast<size_t>(row));
  }
}

template <class T>
void scatter_add_rows(const T* grad, T* acc, int64_t outer, int64_t extent, int64_t inner,
                      const std::vector<int64_t>& indices) {
  // Threads own disjoint column blocks of one outer slice; each walks all indices in order, so a
  // repeated index sums its rows in the same order on every run (no atomics, no races).
  const int64_t n = static_cast<int64_t>(indices.size());
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (inner + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (outer * n * inner >= kParallelBytes / 4)
  for (int64_t task = 0; task < outer * blocks; ++task) {
    const int64_t o = task / blocks, c0 = (task % blocks) * kBlock, c1 = std::min(inner, c0 + kBlock);
    for (int64_t j = 0; j < n; ++j) {
      const T* g = grad + (o * n + j) * inner;
      T* a = acc + (o * extent + indices[j]) * inner;
      for (int64_t c = c0; c < c1; ++c) a[c] += g[c];
    }
  }
}

template void scatter_add_rows<float>(const float*, float*, int64_t, int64_t, int64_t, const std::vector<int64_t>&);
template void scatter_add_rows<double>(const double*, double*, int64_t, int64_t, int64_t, const std::vector<int64_t>&);

}  // namespace octet::kernels::cpu
