#pragma once
// Register-tiled f32 matrix products for small matrices: attention's per-head GEMMs (S = 50-257 rows,
// head width 32-128), where OpenBLAS spends more on each call's setup, packing and buffer lock than on
// the arithmetic (about 44 GFLOP/s per core on 50×50×32, a third of what the same core reaches on
// large sgemm).
//
// C[m, n] = alpha · A·B + beta · C, with
//   - A read through two strides, element (i, p) at a[i·a_row + p·a_col], so A or Aᵀ in any row-major
//     buffer (attention's Pᵀ·dout reads P transposed this way);
//   - B "packed": k rows of ldb floats, ldb a multiple of 16 and every row zero past column n
//     (pack_rows / pack_transposed make it from a strided matrix);
//   - C written in place through its leading dimension, n columns per row and nothing past them.
//
// Each C element is one dot product in the order p = 0, 1, ..., k-1 (fused multiply-adds), then
// times alpha, plus beta times its old value, plus its bias: the same bits whatever the element's position, the
// matrix's size, the thread count or the layout.
//
// The kernels are AVX-512 code (x86-64-v4): available() says whether this CPU runs them. Where it does
// not (older x86, other architectures, compilers other than GCC), callers use OpenBLAS instead.
#include <cstdint>

namespace octet::kernels::cpu::tile_gemm {

inline constexpr int64_t kLanes = 16;  // floats per vector; ldb and packed widths are multiples of this

// Whether multiply() may be called: an AVX-512 CPU, a GCC x86-64 build, and not switched off.
bool available();
// Switches the tile kernels off (false) or back on, so tests can run attention's OpenBLAS path too.
// Returns the previous setting.
bool set_enabled(bool enabled);

inline int64_t padded(int64_t n) { return (n + kLanes - 1) / kLanes * kLanes; }

// dst[r, 0:ld_dst) = src[r, 0:cols) then zeros, for r < rows.
void pack_rows(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst);
// dst[c, 0:ld_dst) = src[0:rows, c] then zeros, for c < cols: the transpose, packed. ld_dst must be
// at least padded(rows) (it writes whole vectors). On an AVX-512 CPU in 16 × 16 blocks through the
// registers; the bits are src's either way.
void pack_transposed(const float* src, int64_t ld_src, int64_t rows, int64_t cols, float* dst, int64_t ld_dst);

// C = alpha · A·B + beta · C (+ bias, a row of n added to every row of C, when not null) as above;
// C is not read when beta is 0. Requires available().
void multiply(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row, int64_t a_col,
              const float* b, int64_t ldb, float beta, float* c, int64_t ldc, const float* bias = nullptr);
// The same product with C in bf16 (its bits): each element is the f32 value multiply() would store
// with beta = 0, rounded once to nearest even (NaN to 0x7FFF, as float_to_bf16_bits). C is not read.
void multiply_to_bf16(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t a_row, int64_t a_col,
                      const float* b, int64_t ldb, uint16_t* c, int64_t ldc, const float* bias = nullptr);

}  // namespace octet::kernels::cpu::tile_gemm
