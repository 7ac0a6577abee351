#pragma once
// FP8 quantisation: casting a tensor to E4M3 or E5M2 under a per-tensor scale, measuring its amax,
// and the scale updates of the two recipes (nn/fp8.h). The GEMM that consumes the casts is in
// kernels/fp8_gemm.h.
//
// Per-tensor scaling. An FP8 format has a narrow range (E4M3: ±448, E5M2: ±57344) and few mantissa
// bits, so a tensor x is stored as q = fp8(x·scale), with the scale chosen so that the largest |x|
// lands near the top of the range. The GEMM undoes it by multiplying its f32 result by
// scale_inv = 1/scale of each operand. Casting saturates: a value beyond the range (a spike the scale
// did not foresee) becomes ±max, never inf.
//
// amax. The largest |x| of a tensor, found as the largest of the |x| bit patterns read as unsigned
// integers: for non-negative floats that order is the numeric order, with inf above every finite
// value and NaN above inf. So a NaN or inf in x makes amax NaN or inf (and the recipes then keep
// their previous scale), and the result is exact and the same on every device and thread count.
// amax ← max(amax, ·) compares bit patterns too (an atomicMax on the GPU), so an amax slot must hold a
// non-negative value or NaN: start it at +0 (a -0, bits 0x80000000, would stay above every amax).
//
// All scale, scale_inv and amax tensors are f32 and live on the device of the data they describe,
// so a GPU step never reads them back to the host.
#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "kernels/nn_ops.h"

namespace octet::kernels {

// The largest finite value of an FP8 dtype: 448 for e4m3, 57344 for e5m2.
float fp8_max(DType fp8_dtype);

// The FP8 GEMM needs its reduction dim to be a multiple of 16; the transposed cast pads to it.
inline constexpr int64_t kFp8RowPadding = 16;

struct Fp8Cast {
  Tensor data;        // [rows, cols] FP8: saturate(round_to_nearest_even(x·scale)); undefined unless rowwise
  Tensor transposed;  // [cols, padded_rows] FP8: data's transpose; columns rows..padded_rows are zero
  Tensor scale_inv;   // [1] f32, a fresh tensor: 1/scale as it was when this cast ran
};

// One pass over x, read as [rows, cols] (every leading dim is a row; cols = x.size(-1)): writes the
// row-major cast (rowwise), its transpose (transposed; rows padded with zeros up to a multiple of
// pad_rows_to, so that it can be the reduction side of an FP8 GEMM) or both, and when `amax` is
// defined, amax ← max(amax, amax(x)). scale and amax are [1] f32 views on x's device (a slot of a
// layer's FP8 state); x is f32, bf16 or f16. x·scale is rounded once to f32 and then to FP8.
// The transposed copy is what the backward GEMMs of a Linear read ("TN" layout, kernels/fp8_gemm.h).
// Bytes moved: read x once (2 bytes per element for bf16), write 1 byte per element per copy.
Fp8Cast fp8_cast(const Tensor& x, const Tensor& scale, const Tensor& amax, DType fp8_dtype, bool rowwise,
                 bool transposed, int64_t pad_rows_to = kFp8RowPadding);

struct Fp8CastWithBiasGrad : Fp8Cast {
  Tensor dbias;  // [cols] in dbias_dtype: the column sums of x, as kernels::sum(x2, 0).to(dbias_dtype)
};

// fp8_cast and the bias gradient of a Linear whose output gradient is x, from the same read of x:
// what the FP8 Linear's backward needs of dy. Writes what fp8_cast writes (the same bytes, amax and
// scale_inv) and dbias[c] = Σ_r x[r, c], summed in f32 and rounded to x's dtype and then to dbias_dtype,
// which is exactly kernels::sum(x2, 0).to(dbias_dtype) for x2 = x read as [rows, cols]:
//   - on the CPU bit for bit, the sum in kernels::sum's pairwise order (kernels/cpu/fp8.cpp);
//   - on the GPU in f32 in another fixed order: per 64-row tile, then over the tiles (deterministic,
//     but not the bits of kernels::sum on the GPU, which sums in its own order).
// dbias_dtype is f32, bf16 or f16. Bytes moved: read x once (2 bytes per element for bf16), write 1 byte
// per element per copy and cols·sizeof(dbias_dtype); the GPU also writes and reads back f32 partial
// sums, 4·cols bytes per 64 rows (1/32 of a bf16 x). The unfused sequence reads x twice.
Fp8CastWithBiasGrad fp8_cast_dbias(const Tensor& x, const Tensor& scale, const Tensor& amax, DType fp8_dtype,
                                   bool rowwise, bool transposed, DType dbias_dtype,
                                   int64_t pad_rows_to = kFp8RowPadding);

// ---- LayerNorm writing FP8: the producer of an FP8 Linear's input (Transformer Engine's LayerNormLinear) ----
//
// LayerNorm of x over its last dim, cast to FP8 as it is written: the bytes, transposed copy, amax and
// scale_inv are those of fp8_cast(layernorm_forward(x, weight, bias, eps).y, scale, amax, ...), bit
// for bit on each device, and mean and rstd those of layernorm_forward. The LayerNorm's output in x's
// dtype is never stored: on the GPU one kernel reads x once and writes only the FP8 copies and the
// statistics. The CPU, which emulates FP8, runs the two steps back to back. Under delayed scaling
// `scale` is the next Linear's input scale, known before the pass; current scaling needs the amax
// first, so it keeps the unfused LayerNorm and two-pass cast (nn/fp8_linear.h).
struct LayerNormFp8 {
  Fp8Cast cast;  // of the LayerNorm's output, as fp8_cast describes
  Tensor mean;   // as layernorm_forward returns them: f32, x's shape without the last dim
  Tensor rstd;
  Tensor h;      // add_layernorm_fp8_forward only: x + y, x's shape and dtype (the residual stream)
};
LayerNormFp8 layernorm_fp8_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps,
                                   const Tensor& scale, const Tensor& amax, DType fp8_dtype, bool rowwise,
                                   bool transposed, int64_t pad_rows_to = kFp8RowPadding);
// The residual add first (kernels/nn_ops.h add_layernorm_forward): h = x + y is written in x's dtype
// and its LayerNorm cast to FP8 as above, the bits of add_layernorm_forward followed by fp8_cast.
LayerNormFp8 add_layernorm_fp8_forward(const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,
                                       double eps, const Tensor& scale, const Tensor& amax, DType fp8_dtype,
                                       bool rowwise, bool transposed, int64_t pad_rows_to = kFp8RowPadding);

// GELU of x cast to FP8 as it is written (the producer of an MLP's second Linear's input): the bytes,
// transposed copy, amax and scale_inv of fp8_cast(gelu_forward(x, approximation), ...), bit for bit
// on each device, without the GELU's output in x's dtype. Emulated on the CPU as the two steps, as
// layernorm_fp8_forward is.
Fp8Cast gelu_fp8_forward(const Tensor& x, GeluApproximation approximation, const Tensor& scale, const Tensor& amax,
                         DType fp8_dtype, bool rowwise, bool transposed, int64_t pad_rows_to = kFp8RowPadding);

// GELU's backward feeding an FP8 Linear's output-gradient cast (an MLP's fc2 dgrad -> fc1's dy):
// dy = gelu_backward(dact, x, approximation), cast as fp8_cast_dbias casts it, bit for bit on each
// device: the bytes, transposed copy, amax, scale_inv and, with a dbias_dtype, the column sums of dy
// (fc1's bias gradient); without one, as fp8_cast. dy itself is never stored in x's dtype. Emulated
// on the CPU as the two steps.
Fp8CastWithBiasGrad dgelu_fp8_cast_dbias(const Tensor& dact, const Tensor& x, GeluApproximation approximation,
                                         const Tensor& scale, const Tensor& amax, DType fp8_dtype, bool rowwise,
                                         bool transposed, std::optional<DType> dbias_dtype,
                                         int64_t pad_rows_to = kFp8RowPadding);

// amax ← max(amax, amax(x)) alone: the first pass of current scaling. amax is [1] f32 on x's device.
void fp8_amax_(const Tensor& x, const Tensor& amax);

enum class AmaxCompute { Max, MostRecent };

// One group of n per-tensor scales of one FP8 format: the FP8 state of a layer's forward tensors
// (input and weight) or of its backward ones (the output gradient).
struct Fp8ScalingTensors {
  Tensor amax_history;  // [L, n] f32. Row 0 collects the amaxes of the step under way.
  Tensor scale;         // [n] f32
  Tensor scale_inv;     // [n] f32
  DType fp8_dtype = DType::e4m3;  // what these tensors are cast to: its max sets the scale
};

// Delayed scaling's update, for every group in one call (one launch on the GPU), per entry j:
//   amax      = max over all L rows of column j (Max), or row 0 (MostRecent)
//   scale     = fp8_max / amax / 2^margin, computed in f32 in that order; the previous scale is kept
//               when amax is 0, inf or NaN, and a scale that overflows to inf becomes FLT_MAX
//   scale_inv = 1 / scale
//   history   rolls one row toward the front: row i ← row i+1 and row L-1 ← row 0 (so rows 1..L-1
//             hold past amaxes from oldest to newest), then row 0 ← 0 for the next step.
// Every tensor of every group sits on one device. margin is finite and within [-126, 127] (here and in
// fp8_scale_from_amax_), so that 2^margin is a normal f32; it is rounded to f32 once, on the host.
void fp8_update_scales_(const std::vector<Fp8ScalingTensors>& groups, double margin, AmaxCompute algo);

// Current scaling: scale and scale_inv from `amax` alone, with the same rules as above (amax 0 or
// not finite keeps the previous scale; inf clamps to FLT_MAX). amax, scale, scale_inv: [n] f32 on
// one device.
void fp8_scale_from_amax_(const Tensor& amax, const Tensor& scale, const Tensor& scale_inv, DType fp8_dtype,
                          double margin);

}  // namespace octet::kernels
