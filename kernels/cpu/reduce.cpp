// CPU reductions and softmax over the [outer, n, inner] view described in reduce_cpu.h.
//
// Two layouts: inner == 1 (the reduced dim is last, rows are contiguous) is split into fixed
// chunks of each row so that even a reduction over everything uses every core; inner > 1 is done
// in column tiles, reading rows of the tile in order so memory access stays sequential.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "kernels/cpu/reduce_cpu.h"

namespace octet::kernels::cpu {
namespace {

// Below this many input elements, starting threads costs more than the loop itself.
constexpr int64_t kParallelThreshold = 1 << 15;
// Elements of a contiguous row reduced by one task. A constant, so results never depend on threads.
constexpr int64_t kChunk = 1 << 14;
// Columns handled together when the reduced dim is not last.
constexpr int64_t kTile = 64;
// Recursion depth bound of pairwise_rows (halving an int64 count stops well before this).
constexpr int64_t kMaxDepth = 64;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Pairwise summation: rounding error grows like log n instead of n.
template <class T>
T pairwise_sum(const T* p, int64_t n) {
  if (n <= 32) {
    T acc = 0;
    for (int64_t i = 0; i < n; ++i) acc += p[i];
    return acc;
  }
  const int64_t half = n / 2;
  return pairwise_sum(p, half) + pairwise_sum(p + half, n - half);
}

// acc[0, w) = sum of n rows of w values, rows `stride` apart, summed pairwise over the rows.
// scratch holds one row of w per recursion level. The FP8 cast with the bias gradient
// (kernels/cpu/fp8.cpp, cast_and_sum_chunks) walks this same tree: change both or neither.
template <class T>
void pairwise_rows(const T* p, int64_t n, int64_t stride, int64_t w, T* acc, T* scratch) {
  if (n <= 16) {
    std::fill(acc, acc + w, T(0));
    for (int64_t k = 0; k < n; ++k)
      for (int64_t j = 0; j < w; ++j) acc[j] += p[k * stride + j];
    return;
  }
  const int64_t half = n / 2;
  pairwise_rows(p, half, stride, w, acc, scratch + w);
  pairwise_rows(p + half * stride, n - half, stride, w, scratch, scratch + w);
  for (int64_t j = 0; j < w; ++j) acc[j] += scratch[j];
}

// Whether v should replace the running best: strictly larger (so ties keep the first), or the
// first NaN (after which nothing replaces it).
template <class T>
bool beats(T v, T best) {
  return v > best || (std::isnan(v) && !std::isnan(best));
}

template <bool kAbs, class T>
T value_of(T x) {
  if constexpr (kAbs) return std::abs(x);
  else return x;
}

// max and amax share this: the running best of value_of<kAbs>(x) and where it was first seen.
template <bool kAbs, class T>
void max_impl(const T* a, int64_t outer, int64_t n, int64_t inner, T* values, int64_t* indices) {
  const bool parallel = outer * n * inner > kParallelThreshold;
  if (inner == 1) {
    const int64_t chunks = ceil_div(n, kChunk);
    std::vector<T> best(static_cast<size_t>(outer * chunks));
    std::vector<int64_t> where(best.size());
#pragma omp parallel for if (parallel)
    for (int64_t t = 0; t < outer * chunks; ++t) {
      const int64_t begin = (t % chunks) * kChunk, end = std::min(n, begin + kChunk);
      const T* row = a + (t / chunks) * n;
      T b = value_of<kAbs>(row[begin]);
      int64_t at = begin;
      for (int64_t k = begin + 1; k < end; ++k) {
        const T v = value_of<kAbs>(row[k]);
        if (beats(v, b)) b = v, at = k;
      }
      best[t] = b, where[t] = at;
    }
    // Chunks are combined in order with the same strict test, so the first maximum still wins.
    for (int64_t o = 0; o < outer; ++o) {
      int64_t w = o * chunks;
      for (int64_t c = 1; c < chunks; ++c)
        if (beats(best[o * chunks + c], best[w])) w = o * chunks + c;
      values[o] = best[w];
      if (indices) indices[o] = where[w];
    }
    return;
  }
  const int64_t tiles = ceil_div(inner, kTile);
#pragma omp parallel for if (parallel)
  for (int64_t t = 0; t < outer * tiles; ++t) {
    const int64_t o = t / tiles, j0 = (t % tiles) * kTile, w = std::min(kTile, inner - j0);
    const T* p = a + o * n * inner + j0;
    T best[kTile];
    int64_t at[kTile];
    for (int64_t j = 0; j < w; ++j) best[j] = value_of<kAbs>(p[j]), at[j] = 0;
    for (int64_t k = 1; k < n; ++k)
      for (int64_t j = 0; j < w; ++j) {
        const T v = value_of<kAbs>(p[k * inner + j]);
        if (beats(v, best[j])) best[j] = v, at[j] = k;
      }
    for (int64_t j = 0; j < w; ++j) {
      values[o * inner + j0 + j] = best[j];
      if (indices) indices[o * inner + j0 + j] = at[j];
    }
  }
}

}  // namespace

template <class T>
void sum(const T* a, int64_t outer, int64_t n, int64_t inner, T divisor, T* out) {
  const bool parallel = outer * n * inner > kParallelThreshold;
  if (inner == 1) {
    const int64_t chunks = std::max<int64_t>(1, ceil_div(n, kChunk));
    std::vector<T> partial(static_cast<size_t>(outer * chunks));
#pragma omp parallel for if (parallel)
    for (int64_t t = 0; t < outer * chunks; ++t) {
      const int64_t begin = (t % chunks) * kChunk, end = std::min(n, begin + kChunk);
      partial[t] = pairwise_sum(a + (t / chunks) * n + begin, end - begin);
    }
#pragma omp parallel for if (parallel && outer > 1)
    for (int64_t o = 0; o < outer; ++o) out[o] = pairwise_sum(partial.data() + o * chunks, chunks) / divisor;
    return;
  }
  // Column tiles as wide as one thread's share (at least kTile), so that each row of a tile is one
  // long contiguous read. Every column is still summed by the same pairwise tree over its n values,
  // so the tile width (and with it the thread count) does not change any result.
  int64_t threads = 1;
#ifdef _OPENMP
  if (parallel) threads = omp_get_max_threads();
#endif
  const int64_t width = std::max(kTile, ceil_div(ceil_div(inner, threads), kTile) * kTile);
  const int64_t tiles = ceil_div(inner, width);
#pragma omp parallel if (parallel && outer * tiles > 1)
  {
    std::vector<T> scratch(static_cast<size_t>(kMaxDepth * width)), acc(static_cast<size_t>(width));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < outer * tiles; ++t) {
      const int64_t o = t / tiles, j0 = (t % tiles) * width, w = std::min(width, inner - j0);
      pairwise_rows(a + o * n * inner + j0, n, inner, w, acc.data(), scratch.data());
      for (int64_t j = 0; j < w; ++j) out[o * inner + j0 + j] = acc[j] / divisor;
    }
  }
}

template <class T>
void max(const T* a, int64_t outer, int64_t n, int64_t inner, T* values, int64_t* indices) {
  max_impl<false>(a, outer, n, inner, values, indices);
}

template <class T>
void amax(const T* a, int64_t outer, int64_t n, int64_t inner, T* out) {
  if (n == 0) return std::fill(out, out + outer * inner, T(0));
  max_impl<true>(a, outer, n, inner, out, nullptr);
}

// Numerically stable: exp(x - max) never overflows and the largest term is exactly 1.
template <class T>
void softmax(const T* a, int64_t outer, int64_t n, int64_t inner, bool log, T* out) {
#pragma omp parallel for if (outer * n * inner > kParallelThreshold)
  for (int64_t r = 0; r < outer * inner; ++r) {
    const int64_t base = (r / inner) * n * inner + r % inner;
    const T* x = a + base;
    T* y = out + base;
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t k = 0; k < n; ++k) m = std::max(m, x[k * inner]);
    T s = 0;
    for (int64_t k = 0; k < n; ++k) {
      const T e = std::exp(x[k * inner] - m);
      if (!log) y[k * inner] = e;
      s += e;
    }
    if (log) {
      const T log_s = std::log(s);
      for (int64_t k = 0; k < n; ++k) y[k * inner] = x[k * inner] - m - log_s;
    } else {
      for (int64_t k = 0; k < n; ++k) y[k * inner] /= s;
    }
  }
}

// softmax:      dx = y * (dy - sum(dy * y))
// log_softmax:  dx = dy - exp(y) * sum(dy)
template <class T>
void softmax_backward(const T* y, const T* dy, int64_t outer, int64_t n, int64_t inner, bool log, T* dx) {
#pragma omp parallel for if (outer * n * inner > kParallelThreshold)
  for (int64_t r = 0; r < outer * inner; ++r) {
    const int64_t base = (r / inner) * n * inner + r % inner;
    const T *py = y + base, *pdy = dy + base;
    T* pdx = dx + base;
    T s = 0;
    for (int64_t k = 0; k < n; ++k) s += log ? pdy[k * inner] : pdy[k * inner] * py[k * inner];
    for (int64_t k = 0; k < n; ++k) {
      const int64_t i = k * inner;
      pdx[i] = log ? pdy[i] - std::exp(py[i]) * s : py[i] * (pdy[i] - s);
    }
  }
}

#define OCTET_INSTANTIATE(T)                                                                  \
  template void sum<T>(const T*, int64_t, int64_t, int64_t, T, T*);                           \
  template void max<T>(const T*, int64_t, int64_t, int64_t, T*, int64_t*);                    \
  template void amax<T>(const T*, int64_t, int64_t, int64_t, T*);                             \
  template void softmax<T>(const T*, int64_t, int64_t, int64_t, bool, T*);                    \
  template void softmax_backward<T>(const T*, const T*, int64_t, int64_t, int64_t, bool, T*);
OCTET_INSTANTIATE(float)
OCTET_INSTANTIATE(double)
#undef OCTET_INSTANTIATE

}  // namespace octet::kernels::cpu
