// GELU (forward and backward) writing FP8 on the GPU (kernels/fp8.h gelu_fp8_forward,
// dgelu_fp8_cast_dbias): one pass of the FP8 cast's tile kernel (fp8_cast_tiles.cuh) whose input
// computes each element instead of reading it, so the GELU's output (its backward's dy) in x's dtype is
// never stored.
//
// Bits. An element is what the unfused sequence writes and then reads back: GeluForwardOf<T>
// (GeluBackwardOf<T>) of gelu_elements.cuh, the very code gelu.cu maps for x's dtype T, on x (dact, x)
// widened as gelu.cu widens them (to_float of the device types), rounded to T as gelu.cu stores it
// (from_float<T>, or the paired conversion that gives the same bits: widen_rounded_pairs), then
// widened as fp8_cast reads a stored element (widen_stored: the bits of StoredInput's widening, NaN
// included). The rest -- bytes, transposed copy and padding, amax, scale_inv, the per-tile column sums
// and their fixed order, dbias's rounding -- is fp8_cast's (fp8_cast_dbias's) own kernel and code, so
// every output is that of the unfused sequence bit for bit.
//
// Bytes: reads x (and dact) once and writes what fp8_cast (fp8_cast_dbias) writes; the unfused
// sequence also writes the GELU's output in x's dtype and reads it back.
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_cast_tiles.cuh"
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/cuda/fp8_elements.cuh"
#include "kernels/cuda/gelu_elements.cuh"

namespace octet::kernels::cuda {
namespace {

// v[j] = widen_stored(from_float<T>(y[j])) for 8 values, rounded two at a time: for bf16 and f16 one
// paired conversion (cvt.rn.bf16x2.f32, cvt.rn.f16x2.f32) per two values instead of one conversion
// each, which run on the SM's quarter-rate pipe beside GELU's reciprocal and exponential. Each half of
// a pair is the correctly rounded value of its own input (NaN: the canonical NaN, as gelu.cu's map,
// whose compiled loop pairs its conversions the same way), so the bits are from_float's.
template <class T>
__device__ __forceinline__ void widen_rounded_pairs(const float y[kSegment], float v[kSegment]) {
#pragma unroll
  for (int j = 0; j < kSegment; j += 2) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      const __nv_bfloat162 r = __floats2bfloat162_rn(y[j], y[j + 1]);
      v[j] = widen_stored(r.x);
      v[j + 1] = widen_stored(r.y);
    } else if constexpr (std::is_same_v<T, __half>) {
      const __half2 r = __floats2half2_rn(y[j], y[j + 1]);
      v[j] = widen_stored(r.x);
      v[j + 1] = widen_stored(r.y);
    } else {
      v[j] = y[j];
      v[j + 1] = y[j + 1];
    }
  }
}

// gelu(x[i]) as fp8_cast reads it from gelu_forward's output (x2 unused).
template <class T, bool kTanh>
struct GeluInput {
  using Element = T;
  static constexpr int kMinBlocksPerSm = kTanh ? 5 : 6;  // at most 96 (tanh) or 80 registers
  static constexpr bool kMaySumColumns = false;  // the forward has no bias gradient to sum
  using Loaded = Eight<T>;
  static __device__ __forceinline__ float stored(T x) {
    return widen_stored(from_float<T>(GeluForwardOf<T, kTanh>{}(to_float(x), 0.f)));
  }
  static __device__ __forceinline__ Loaded load(const T* x, const T*, int64_t i) { return load_eight(x + i); }
  static __device__ __forceinline__ void values(const Loaded& in, float v[kSegment]) {
    float y[kSegment];
#pragma unroll
    for (int j = 0; j < kSegment; ++j) y[j] = GeluForwardOf<T, kTanh>{}(to_float(in[j]), 0.f);
    widen_rounded_pairs<T>(y, v);
  }
  static __device__ __forceinline__ float one(const T* x, const T*, int64_t i) { return stored(x[i]); }
};

// gelu_backward(dact, x)[i] as fp8_cast (fp8_cast_dbias) reads it from gelu_backward's output: the
// kernel's x is dact, its x2 is GELU's input x.
template <class T, bool kTanh>
struct DgeluInput {
  using Element = T;
  static constexpr int kMinBlocksPerSm = 4;  // at most 128 registers
  static constexpr bool kMaySumColumns = true;  // dgelu_fp8_cast_dbias
  struct Loaded {
    Eight<T> dact, x;
  };
  static __device__ __forceinline__ float stored(T dact, T x) {
    return widen_stored(from_float<T>(GeluBackwardOf<T, kTanh>{}(to_float(dact), to_float(x))));
  }
  static __device__ __forceinline__ Loaded load(const T* dact, const T* x, int64_t i) {
    return {load_eight(dact + i), load_eight(x + i)};
  }
  // One conversion per value here: paired as the forward's, this kernel measured slower on ViT-H's
  // 12,608 × 5120 bf16 (142 against 133 µs), where the forward gained (104 -> 95 µs).
  static __device__ __forceinline__ void values(const Loaded& in, float v[kSegment]) {
#pragma unroll
    for (int j = 0; j < kSegment; ++j) v[j] = stored(in.dact[j], in.x[j]);
  }
  static __device__ __forceinline__ float one(const T* dact, const T* x, int64_t i) { return stored(dact[i], x[i]); }
};

// Runs the tile kernel with Input<T, kTanh> for x's dtype and the approximation.
template <template <class, bool> class Input>
void run_gelu_cast(const Tensor& x, const Tensor& x2, GeluApproximation approximation, const CastArgs& a,
                   DType fp8_dtype, const char* op) {
  dispatch_floating(x.dtype(), op, [&]<class T>() {
    const T* p = ptr<const T>(x);
    const T* p2 = x2.defined() ? ptr<const T>(x2) : nullptr;
    if (approximation == GeluApproximation::Tanh) {
      run_fp8_cast_kernel<Input<T, true>>(p, p2, a, fp8_dtype, x.device().index, stream_for(x), op);
    } else {
      run_fp8_cast_kernel<Input<T, false>>(p, p2, a, fp8_dtype, x.device().index, stream_for(x), op);
    }
  });
}

}  // namespace

Fp8Cast gelu_fp8_forward(const Tensor& x, int64_t rows, int64_t cols, GeluApproximation approximation,
                         const Tensor& scale, const Tensor& amax, DType fp8_dtype, bool rowwise, bool transposed,
                         int64_t padded_rows) {
  Fp8Cast out;
  const CastArgs a =
      prepare_cast(x.device(), rows, cols, scale, amax, fp8_dtype, rowwise, transposed, padded_rows, nullptr, out);
  // Bytes: reads x, writes fp8_cast's copies. ViT-H's fc2 input, 12,608 × 5120 bf16 with both copies:
  // 129.1 MB + 2 × 64.6 MB = 258.2 MB, 60.0 µs at 4.3 TB/s (the unfused pair: 516 MB, 120 µs).
  run_gelu_cast<GeluInput>(x, Tensor(), approximation, a, fp8_dtype, "gelu_fp8_forward");
  return out;
}

Fp8CastWithBiasGrad dgelu_fp8_cast_dbias(const Tensor& dact, const Tensor& x, int64_t rows, int64_t cols,
                                         GeluApproximation approximation, const Tensor& scale, const Tensor& amax,
                                         DType fp8_dtype, bool rowwise, bool transposed,
                                         std::optional<DType> dbias_dtype, int64_t padded_rows) {
  constexpr const char* op = "dgelu_fp8_cast_dbias";
  // As fp8_cast_dbias allocates and runs it, or as fp8_cast without a bias.
  const Tensor partials =
      dbias_dtype ? column_partials_for(x.device(), rows, cols, transposed, padded_rows) : Tensor();
  Fp8CastWithBiasGrad out;
  const CastArgs a = prepare_cast(x.device(), rows, cols, scale, amax, fp8_dtype, rowwise, transposed, padded_rows,
                                  dbias_dtype ? ptr<float>(partials) : nullptr, out);
  // Bytes: reads dact and x, writes fp8_cast_dbias's copies and partials. fc1's output gradient,
  // 12,608 × 5120 bf16 with both copies and dbias: 2 × 129.1 MB + 2 × 64.6 MB + 2 × 4.0 MB = 395 MB,
  // 92 µs at 4.3 TB/s (the unfused pair: 653 MB, 152 µs).
  run_gelu_cast<DgeluInput>(dact, x, approximation, a, fp8_dtype, op);
  // dy has x's dtype: its column sums are rounded to it, as fp8_cast_dbias rounds its input's.
  if (dbias_dtype) out.dbias = dbias_from_column_partials(partials, cols, x.dtype(), *dbias_dtype);
  return out;
}

}  // namespace octet::kernels::cuda
