// Register-tiled small f32 GEMM (kernels/cpu/tile_gemm.h says what and why).
//
// The structure is a GEMM micro-kernel's, cut down to matrices that fit in L1/L2:
//   - B is already packed (rows of whole vectors, zero past n), so it is loaded without masks;
//   - one tile keeps MR × NV vectors of C in registers (MR·NV <= 24 of AVX-512's 32) and, for each
//     p, does NV loads of B, MR broadcasts of A and MR·NV fused multiply-adds, then writes its C
//     block once, times alpha, clipped to the real rows and columns;
//   - A is not packed: at these sizes copying an MR × k block of A costs about as much as the tile's
//     arithmetic (k·MR scalar moves against k·MR·NV vector FMAs with NV = 2). Each of the MR rows
//     keeps a pointer and every step reads all of them at one offset p·a_col, which serves A stored
//     row-major (a_col = 1) and transposed (a_row = 1) alike.
// MR × NV is 6 × 4 (64 columns) when C is wider than 48 columns, 8 × 3 or 8 × 2 otherwise; the
// narrower tiles also take the columns left over. The last block of rows points its missing rows at
// A's last row (their results are not stored).
#include "kernels/cpu/tile_gemm.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <type_traits>
#include <utility>

#include "core/error.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OCTET_TILE_GEMM 1
#define OCTET_AVX512 __attribute__((target("arch=x86-64-v4")))
#define OCTET_AVX512_INLINE __attribute__((target("arch=x86-64-v4"), always_inline)) inline
#else
#define OCTET_TILE_GEMM 0
#define OCTET_AVX512
#define OCTET_AVX512_INLINE inline
#endif

namespace octet::kernels::cpu::tile_gemm {

namespace {

std::atomic<bool> g_enabled{true};

bool cpu_has_avx512() {
#if OCTET_TILE_GEMM
  static const bool has = __builtin_cpu_supports("x86-64-v4");
  return has;
#else
  return false;
#endif
}

// 16 floats; GCC lowers arithmetic on it to one AVX-512 instruction inside x86-64-v4 functions.
typedef float Vec __attribute__((vector_size(64)));
typedef uint32_t Bits __attribute__((vector_size(64)));      // a Vec's 16 floats as their bits
typedef uint16_t HalfBits __attribute__((vector_size(32)));  // 16 bf16 values

// Rounds 16 floats to bf16 bits the way float_to_bf16_bits (core/float_formats.h) rounds one: to
// nearest, ties to even, and any NaN to 0x7FFF. Lane compares give all ones (true) or zeros.
OCTET_AVX512_INLINE HalfBits round_to_bf16(Vec v) {
  Bits u;
  std::memcpy(&u, &v, sizeof u);
  const Bits rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const Bits nan = reinterpret_cast<Bits>((u & 0x7FFFFFFFu) > 0x7F800000u);
  return __builtin_convertvector((nan & 0x7FFFu) | (~nan & rounded), HalfBits);
}

// Where a tile stores its C elements: floats (C = alpha·A·B + beta·C + bias), or bf16 bits, each the
// same f32 value rounded once (beta must then be 0: a bf16 C is not read back).
OCTET_AVX512_INLINE void store(float* dst, Vec r, size_t lanes) { std::memcpy(dst, &r, lanes * sizeof(float)); }
OCTET_AVX512_INLINE void store(uint16_t* dst, Vec r, size_t lanes) {
  const HalfBits h = round_to_bf16(r);
  std::memcpy(dst, &h, lanes * sizeof(uint16_t));
}

OCTET_AVX512_INLINE Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The MR × NV tile of C at c, from A's rows i0.. at a: rows < `rows` and columns < `cols` are stored.
// Row i reads A through its own pointer (row `rows` - 1 for the missing rows of the last tile), so the
// inner loop is MR broadcasts at one running offset p·a_col whatever A's strides are.
template <int MR, int NV, class Out>
OCTET_AVX512_INLINE void tile(int64_t k, const float* a, int64_t a_row, int64_t a_col, const float* b, int64_t ldb,
                              float alpha, float beta, Out* c, int64_t ldc, const float* bias, int rows,
                              int64_t cols) {
  const float* ar[MR];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) ar[i] = a + std::min(i, rows - 1) * a_row;
  Vec acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = Vec{};
  }
  for (int64_t p = 0, ap = 0; p < k; ++p, ap += a_col) {
    Vec bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) bv[j] = load(b + p * ldb + j * kLanes);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const float av = ar[i][ap];  // scalar × vector broadcasts (a plain 0 + av would not be exact for -0)
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] += av * bv[j];
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    if (i >= rows) break;
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      const int64_t left = cols - j * kLanes;
      if (left <= 0) break;
      const size_t lanes = static_cast<size_t>(std::min(left, kLanes));
      const size_t bytes = lanes * sizeof(float);
      Out* dst = c + i * ldc + j * kLanes;
      Vec r = acc[i][j] * alpha;
      if constexpr (std::is_same_v<Out, float>) {
        if (beta != 0.0f) {  // as in BLAS, C is not read when beta is 0 (it may be uninitialised)
          Vec old = Vec{};
          std::memcpy(&old, dst, bytes);
          r += beta * old;
        }
      }
      if (bias != nullptr) {
        Vec add = Vec{};
        std::memcpy(&add, bias + j * kLanes, bytes);
        r += add;
      }
      store(dst, r, lanes);
    }
  }
}

// Tiles of MR rows across all of C's columns, kMaxVectors at a time then the remainder.
template <int MR, int kMaxVectors, class Out>
OCTET_AVX512 void multiply_rows(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row,
                                int64_t a_col, const float* b, int64_t ldb, float beta, Out* c, int64_t ldc,
                                const float* bias) {
  constexpr int64_t kMaxCols = kMaxVectors * kLanes;
  for (int64_t i0 = 0; i0 < m; i0 += MR) {
    const int rows = static_cast<int>(std::min<int64_t>(MR, m - i0));
    const float* ai = a + i0 * a_row;
    for (int64_t j0 = 0; j0 < n; j0 += kMaxCols) {
      const int64_t cols = std::min(kMaxCols, n - j0);
      const int64_t vectors = (cols + kLanes - 1) / kLanes;
      const float* bj = b + j0;
      Out* cij = c + i0 * ldc + j0;
      const float* bias_j = bias == nullptr ? nullptr : bias + j0;
      if (vectors == kMaxVectors) {
        tile<MR, kMaxVectors>(k, ai, a_row, a_col, bj, ldb, alpha, beta, cij, ldc, bias_j, rows, cols);
      } else if (vectors == 3) {
        tile<MR, 3>(k, ai, a_row, a_col, bj, ldb, alpha, beta, cij, ldc, bias_j, rows, cols);
      } else if (vectors == 2) {
        tile<MR, 2>(k, ai, a_row, a_col, bj, ldb, alpha, beta, cij, ldc, bias_j, rows, cols);
      } else {
        tile<MR, 1>(k, ai, a_row, a_col, bj, ldb, alpha, beta, cij, ldc, bias_j, rows, cols);
      }
    }
  }
}

// ---- the transpose for pack_transposed ---------------------------------------------------------------

// One stage of transposing a 16 × 16 block held as 16 row vectors: rows i and i + H (i without bit H)
// trade their off-diagonal H × H blocks. Element k of row i with bit H set goes to row i + H at k - H,
// and element k of row i + H without bit H goes to row i at k + H. The stages H = 8, 4, 2, 1 together
// move element (i, k) to (k, i): 64 two-source shuffles a block, where a scalar transpose does 256
// loads and 256 stores, each store to another row of dst.
template <int H, int... K>
OCTET_AVX512_INLINE void trade_blocks(Vec& lo, Vec& hi, std::integer_sequence<int, K...>) {
  const Vec a = lo, b = hi;
  lo = __builtin_shufflevector(a, b, ((K & H) != 0 ? 16 + K - H : K)...);
  hi = __builtin_shufflevector(a, b, ((K & H) != 0 ? 16 + K : K + H)...);
}

template <int H>
OCTET_AVX512_INLINE void transpose_stage(Vec (&v)[kLanes]) {
#pragma GCC unroll 16
  for (int i = 0; i < kLanes; ++i) {
    if ((i & H) == 0) trade_blocks<H>(v[i], v[i + H], std::make_integer_sequence<int, kLanes>{});
  }
}

// pack_transposed in 16 × 16 blocks: 16 rows of src (zeros past `rows`) go through the registers and
// come out as 16 vectors of dst, one per column, each a whole 64-byte store at column r0 of its row.
// The blocks run along src's rows (r0 outside), so src is read in 16 sequential streams and each
// 64-byte piece of dst is written whole, once; the zeros past `rows` up to the next vector come from
// the zero rows of the last block. Requires ld_dst >= padded(rows).
OCTET_AVX512 void pack_transposed_blocks(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst,
                                         int64_t ld_dst) {
  for (int64_t r0 = 0; r0 < rows; r0 += kLanes) {
    const int64_t nr = std::min(kLanes, rows - r0);
    for (int64_t c0 = 0; c0 < cols; c0 += kLanes) {
      const int64_t nc = std::min(kLanes, cols - c0);
      Vec v[kLanes];
      if (nr == kLanes && nc == kLanes) {
#pragma GCC unroll 16
        for (int i = 0; i < kLanes; ++i) v[i] = load(src + (r0 + i) * ld_src + c0);
      } else {  // a block at the edge: element by element (a memcpy of a variable size is a library call)
        for (int i = 0; i < kLanes; ++i) {
          v[i] = Vec{};
          for (int64_t j = 0; i < nr && j < nc; ++j) v[i][j] = src[(r0 + i) * ld_src + c0 + j];
        }
      }
      transpose_stage<8>(v);
      transpose_stage<4>(v);
      transpose_stage<2>(v);
      transpose_stage<1>(v);
      for (int64_t j = 0; j < nc; ++j) std::memcpy(dst + (c0 + j) * ld_dst + r0, &v[j], sizeof(Vec));
    }
  }
  const int64_t written = padded(rows);
  if (written < ld_dst) {
    for (int64_t c = 0; c < cols; ++c) std::fill(dst + c * ld_dst + written, dst + (c + 1) * ld_dst, 0.0f);
  }
}

}  // namespace

bool available() { return g_enabled.load(std::memory_order_relaxed) && cpu_has_avx512(); }

bool set_enabled(bool enabled) { return g_enabled.exchange(enabled); }

void pack_rows(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(src + r * ld_src, src + r * ld_src + cols, dst + r * ld_dst);
    std::fill(dst + r * ld_dst + cols, dst + (r + 1) * ld_dst, 0.0f);
  }
}

void pack_transposed(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst) {
  OCTET_CHECK(ld_dst >= padded(rows), "tile_gemm::pack_transposed: ld_dst = ", ld_dst, " is less than ", rows,
              " rows rounded up to whole vectors (", padded(rows), ")");
#if OCTET_TILE_GEMM
  if (cpu_has_avx512()) return pack_transposed_blocks(src, ld_src, rows, cols, dst, ld_dst);
#endif
  for (int64_t c = 0; c < cols; ++c) std::fill(dst + c * ld_dst + rows, dst + (c + 1) * ld_dst, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * ld_src;
    for (int64_t c = 0; c < cols; ++c) dst[c * ld_dst + r] = row[c];
  }
}

namespace {

template <class Out>
void multiply_any(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row, int64_t a_col,
                  const float* b, int64_t ldb, float beta, Out* c, int64_t ldc, const float* bias) {
  OCTET_CHECK(available(), "tile_gemm::multiply: this CPU or build has no AVX-512 tile kernels; use OpenBLAS");
#if OCTET_TILE_GEMM
  if (n <= 2 * kLanes) {
    multiply_rows<8, 2>(m, n, k, alpha, a, a_row, a_col, b, ldb, beta, c, ldc, bias);
  } else if (n <= 3 * kLanes) {
    multiply_rows<8, 3>(m, n, k, alpha, a, a_row, a_col, b, ldb, beta, c, ldc, bias);
  } else {
    multiply_rows<6, 4>(m, n, k, alpha, a, a_row, a_col, b, ldb, beta, c, ldc, bias);
  }
#else
  (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)a_row, (void)a_col, (void)b, (void)ldb, (void)beta, (void)c, (void)ldc, (void)bias;
#endif
}

}  // namespace

void multiply(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row, int64_t a_col,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias) {
  multiply_any(m, n, k, alpha, a, a_row, a_col, b, ldb, beta, c, ldc, bias);
}

void multiply_to_bf16(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row, int64_t a_col,
                      const float* b, int64_t ldb, uint16_t* c, int64_t ldc, const float* bias) {
  multiply_any(m, n, k, alpha, a, a_row, a_col, b, ldb, 0.0f, c, ldc, bias);
}

}  // namespace octet::kernels::cpu::tile_gemm
