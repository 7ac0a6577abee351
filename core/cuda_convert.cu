// Device conversions, fills and copies behind Tensor::to(DType), copy_ and fill_ on CUDA tensors.
// See core/cuda_convert.h for the contract: the host's bits (core/dtype.cpp) for every dtype pair.
#include "core/cuda_convert.h"

#include <cuda_runtime.h>

#include <climits>
#include <cstring>

#include "core/cuda_stream.h"
#include "core/error.h"
#include "core/float_formats.h"

namespace octet::cuda {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

// N elements moved with one aligned access (two or more 16-byte transactions for wide types).
template <class T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};
constexpr int kVec = 8;

bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// ---- element routes ---------------------------------------------------------------------------------
// The host converts f32 <-> bf16/f16/FP8 directly with the float functions; these are those routes.
struct F32ToBf16 {
  __device__ uint16_t operator()(float x) const { return float_to_bf16_bits(x); }
};
struct F32ToF16 {
  __device__ uint16_t operator()(float x) const { return float_to_f16_bits(x); }
};
struct F32ToE4m3 {
  __device__ uint8_t operator()(float x) const { return float_to_e4m3(x, /*saturate=*/true); }
};
struct F32ToE5m2 {
  __device__ uint8_t operator()(float x) const { return float_to_e5m2(x, /*saturate=*/true); }
};
struct Bf16ToF32 {
  __device__ float operator()(uint16_t b) const { return bf16_bits_to_float(b); }
};
struct F16ToF32 {
  __device__ float operator()(uint16_t b) const { return f16_bits_to_float(b); }
};
struct E4m3ToF32 {
  __device__ float operator()(uint8_t b) const { return e4m3_to_float(b); }
};
struct E5m2ToF32 {
  __device__ float operator()(uint8_t b) const { return e5m2_to_float(b); }
};

// float <-> double as x86-64 does it on the host: a NaN keeps its sign and payload (the top 23
// bits of it when narrowing) and becomes quiet. The device's own cvt would make it canonical.
__device__ double widen(float x) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7FFFFFFFu) <= 0x7F800000u) return static_cast<double>(x);
  const uint64_t bits = (static_cast<uint64_t>(u & 0x80000000u) << 32) | 0x7FF8000000000000ull |
                        (static_cast<uint64_t>(u & 0x007FFFFFu) << 29);
  return __longlong_as_double(static_cast<long long>(bits));
}
__device__ float narrow(double x) {
  const uint64_t u = static_cast<uint64_t>(__double_as_longlong(x));
  if ((u & 0x7FFFFFFFFFFFFFFFull) <= 0x7FF0000000000000ull) return __double2float_rn(x);
  const uint32_t bits = (static_cast<uint32_t>(u >> 32) & 0x80000000u) | 0x7FC00000u |
                        (static_cast<uint32_t>(u >> 29) & 0x007FFFFFu);
  return __uint_as_float(bits);
}

// Truncation toward zero with x86-64's cvttsd2si result (INT_MIN) for NaN and out-of-range values.
__device__ int32_t to_i32(double v) {
  return (v > -2147483649.0 && v < 2147483648.0) ? static_cast<int32_t>(v) : INT32_MIN;
}
__device__ int64_t to_i64(double v) {
  return (v >= -9223372036854775808.0 && v < 9223372036854775808.0) ? static_cast<int64_t>(v) : INT64_MIN;
}

// load_double / store_double of core/dtype.cpp, on the device.
__device__ double load_double(const void* p, DType d, int64_t i) {
  switch (d) {
    case DType::f32: return widen(static_cast<const float*>(p)[i]);
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::bf16: return widen(bf16_bits_to_float(static_cast<const uint16_t*>(p)[i]));
    case DType::f16: return widen(f16_bits_to_float(static_cast<const uint16_t*>(p)[i]));
    case DType::e4m3: return widen(e4m3_to_float(static_cast<const uint8_t*>(p)[i]));
    case DType::e5m2: return widen(e5m2_to_float(static_cast<const uint8_t*>(p)[i]));
    case DType::i32: return static_cast<double>(static_cast<const int32_t*>(p)[i]);
    case DType::i64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::u8: return static_cast<double>(static_cast<const uint8_t*>(p)[i]);
  }
  return 0;
}

__device__ void store_double(void* p, DType d, int64_t i, double v) {
  switch (d) {
    case DType::f32: static_cast<float*>(p)[i] = narrow(v); return;
    case DType::f64: static_cast<double*>(p)[i] = v; return;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = double_to_bf16_bits(v); return;
    case DType::f16: static_cast<uint16_t*>(p)[i] = double_to_f16_bits(v); return;
    case DType::e4m3: static_cast<uint8_t*>(p)[i] = double_to_e4m3(v, /*saturate=*/true); return;
    case DType::e5m2: static_cast<uint8_t*>(p)[i] = double_to_e5m2(v, /*saturate=*/true); return;
    case DType::i32: static_cast<int32_t*>(p)[i] = to_i32(v); return;
    case DType::i64: static_cast<int64_t*>(p)[i] = to_i64(v); return;
    case DType::u8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(to_i32(v)); return;
  }
}

// ---- kernels ---------------------------------------------------------------------------------------------

// dst[i] = op(src[i]) for the f32 <-> narrow-format routes. Moves n·(sizeof(S) + sizeof(D)) bytes,
// kVec elements per access when both pointers allow it.
template <class S, class D, class Op>
__global__ void convert_direct(const S* src, D* dst, int64_t n, bool vectorized, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vectorized) {
    const int64_t packs = n / kVec;
    for (int64_t p = first; p < packs; p += stride) {
      const Vec<S, kVec> in = reinterpret_cast<const Vec<S, kVec>*>(src)[p];
      Vec<D, kVec> out;
#pragma unroll
      for (int k = 0; k < kVec; ++k) out.v[k] = op(in.v[k]);
      reinterpret_cast<Vec<D, kVec>*>(dst)[p] = out;
    }
    done = packs * kVec;
  }
  for (int64_t i = done + first; i < n; i += stride) dst[i] = op(src[i]);
}

// Every other pair goes through double, as on the host. Moves n·(source + destination size) bytes.
__global__ void convert_through_double(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    store_double(dst, dst_dtype, i, load_double(src, src_dtype, i));
  }
}

// n copies of one word W; 16 bytes per store where dst allows. Writes n·sizeof(W) bytes.
template <class W>
__global__ void fill_words(W* dst, W word, int64_t n, bool vectorized) {
  constexpr int kPerStore = 16 / sizeof(W);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if (vectorized) {
    Vec<W, kPerStore> pack;
#pragma unroll
    for (int k = 0; k < kPerStore; ++k) pack.v[k] = word;
    const int64_t packs = n / kPerStore;
    for (int64_t p = first; p < packs; p += stride) reinterpret_cast<Vec<W, kPerStore>*>(dst)[p] = pack;
    done = packs * kPerStore;
  }
  for (int64_t i = done + first; i < n; i += stride) dst[i] = word;
}

template <class S, class D, class Op>
void launch_direct(const void* src, void* dst, int64_t n, cudaStream_t stream, Op op) {
  const bool vectorized = aligned_to(src, sizeof(S) * kVec) && aligned_to(dst, sizeof(D) * kVec);
  const int64_t items = vectorized ? n / kVec + n % kVec : n;
  convert_direct<S, D, Op><<<blocks_for(items), kThreads, 0, stream>>>(static_cast<const S*>(src),
                                                                      static_cast<D*>(dst), n, vectorized, op);
}

// Launches the direct route for (s, d) and returns true, or returns false when there is none.
bool convert_direct_route(const void* src, DType s, void* dst, DType d, int64_t n, cudaStream_t stream) {
  if (s == DType::f32) {
    switch (d) {
      case DType::bf16: launch_direct<float, uint16_t>(src, dst, n, stream, F32ToBf16{}); return true;
      case DType::f16: launch_direct<float, uint16_t>(src, dst, n, stream, F32ToF16{}); return true;
      case DType::e4m3: launch_direct<float, uint8_t>(src, dst, n, stream, F32ToE4m3{}); return true;
      case DType::e5m2: launch_direct<float, uint8_t>(src, dst, n, stream, F32ToE5m2{}); return true;
      default: return false;
    }
  }
  if (d == DType::f32) {
    switch (s) {
      case DType::bf16: launch_direct<uint16_t, float>(src, dst, n, stream, Bf16ToF32{}); return true;
      case DType::f16: launch_direct<uint16_t, float>(src, dst, n, stream, F16ToF32{}); return true;
      case DType::e4m3: launch_direct<uint8_t, float>(src, dst, n, stream, E4m3ToF32{}); return true;
      case DType::e5m2: launch_direct<uint8_t, float>(src, dst, n, stream, E5m2ToF32{}); return true;
      default: return false;
    }
  }
  return false;
}

template <class W>
void launch_fill(void* dst, const void* element, int64_t n, cudaStream_t stream) {
  W word;
  std::memcpy(&word, element, sizeof word);
  const bool vectorized = aligned_to(dst, 16);
  const int64_t items = vectorized ? n / (16 / sizeof(W)) + n % (16 / sizeof(W)) : n;
  fill_words<W><<<blocks_for(items), kThreads, 0, stream>>>(static_cast<W*>(dst), word, n, vectorized);
}

}  // namespace

void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n, int device_index) {
  if (n == 0) return;
  DeviceGuard device(device_index);
  cudaStream_t stream = current_stream(device_index);
  if (src_dtype == DType::i64 && dst_dtype == DType::i64) {  // the host copies too: exact beyond 2^53
    return copy_device_bytes(dst, src, static_cast<size_t>(n) * sizeof(int64_t), device_index);
  }
  if (!convert_direct_route(src, src_dtype, dst, dst_dtype, n, stream)) {
    convert_through_double<<<blocks_for(n), kThreads, 0, stream>>>(src, src_dtype, dst, dst_dtype, n);
  }
  check(cudaGetLastError(), "convert_elements on the device (kernel launch)");
}

void fill_elements(void* dst, const void* element, size_t element_size, int64_t n, int device_index) {
  if (n == 0) return;
  DeviceGuard device(device_index);
  cudaStream_t stream = current_stream(device_index);
  const auto* bytes = static_cast<const unsigned char*>(element);
  bool uniform = true;
  for (size_t i = 1; i < element_size; ++i) uniform = uniform && bytes[i] == bytes[0];
  if (uniform) {  // zeros, most often: a memset
    check(cudaMemsetAsync(dst, bytes[0], static_cast<size_t>(n) * element_size, stream), "fill_ (cudaMemsetAsync)");
    return;
  }
  switch (element_size) {
    case 2: launch_fill<uint16_t>(dst, element, n, stream); break;
    case 4: launch_fill<uint32_t>(dst, element, n, stream); break;
    case 8: launch_fill<uint64_t>(dst, element, n, stream); break;
    default: OCTET_FAIL("fill_: no device fill for ", element_size, "-byte elements");
  }
  check(cudaGetLastError(), "fill_ on the device (kernel launch)");
}

void copy_device_bytes(void* dst, const void* src, size_t nbytes, int device_index) {
  if (nbytes == 0 || dst == src) return;
  DeviceGuard device(device_index);
  check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, current_stream(device_index)),
        "device-to-device copy (cudaMemcpyAsync)");
}

}  // namespace octet::cuda
