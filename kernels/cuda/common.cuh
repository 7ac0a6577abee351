#pragma once
// What every CUDA kernel file shares: the element types a floating tensor can hold on the GPU and
// their conversions to and from f32, the dtype switch, launch sizes, and the stream a tensor's
// work goes on. Included by .cu files only.
//
// Arithmetic precision matches the CPU kernels (kernels/common.h): loads widen to f32, the math is
// f32, and each output is rounded once to its dtype (round to nearest even, as the CPU does).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "core/cuda_stream.h"
#include "core/error.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace octet::kernels::cuda {

// How many blocks of `kernel` (block_threads threads, dynamic_shared bytes of dynamic shared memory)
// an SM of the current device holds at once. cudaOccupancyMaxActiveBlocksPerMultiprocessor depends on
// nothing else, and the kernels that size their grids by it launch hundreds of times a step, so it is
// asked once per kernel, launch shape and device. A kernel that needs more than 48 KiB of dynamic
// shared memory must have been allowed it first (cudaFuncSetAttribute).
inline int resident_blocks_per_sm(const void* kernel, int block_threads, size_t dynamic_shared) {
  int device = 0;
  octet::cuda::check(cudaGetDevice(&device), "cudaGetDevice");
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, size_t, int>, int> known;
  const auto key = std::make_tuple(kernel, block_threads, dynamic_shared, device);
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = known.find(key); it != known.end()) return it->second;
  int n = 0;
  octet::cuda::check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, block_threads, dynamic_shared),
                     "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  known.emplace(key, n);
  return n;
}

// ---- element types ------------------------------------------------------------------------------
// f32, bf16 and f16 tensors map to float, __nv_bfloat16 and __half. Kernels are templates over
// the storage type T and compute in float.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }

// Calls f.template operator()<T>() with T the storage type of a floating dtype on the GPU, or
// throws an error naming the op when the GPU has no kernel for that dtype (f64, FP8, integers:
// those are converted explicitly by the caller, never silently).
template <class F>
decltype(auto) dispatch_floating(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32: return f.template operator()<float>();
    case DType::bf16: return f.template operator()<__nv_bfloat16>();
    case DType::f16: return f.template operator()<__half>();
    default:
      OCTET_FAIL(op, ": the CUDA kernel takes f32, bf16 or f16, got ", dtype_name(dtype),
                 "; convert with .to(DType::f32) or run on the cpu");
  }
}

// ---- 16-byte vectorised access ------------------------------------------------------------------
// A pack of N = 16 / sizeof(T) elements loaded or stored with one 128-bit transaction. Callers use
// it when the pointer is 16-byte aligned and fall back to scalar loops for the tail.
template <class T>
struct alignas(16) Pack {
  static constexpr int N = 16 / sizeof(T);
  T v[N];
};
template <class T>
__device__ __forceinline__ Pack<T> load_pack(const T* p) { return *reinterpret_cast<const Pack<T>*>(p); }
template <class T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T>& pack) { *reinterpret_cast<Pack<T>*>(p) = pack; }
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// ---- launches -------------------------------------------------------------------------------------
constexpr int kThreads = 256;
// Blocks of `threads` that cover n work items, capped so a grid-stride loop does the rest.
inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

// The stream a tensor's work goes on, with the tensor's device made current (and left current:
// octet::cuda::launch_stream in core/cuda_stream.h), so a launch for cuda:1 never goes out while
// cuda:0 is current.
inline cudaStream_t stream_for(const Tensor& t) { return octet::cuda::launch_stream(t.device().index); }

// Throws when the last launch failed (bad configuration, or an earlier asynchronous fault).
inline void check_launch(const char* op) { octet::cuda::check(cudaGetLastError(), op); }

// Typed device pointer of a tensor whose dtype dispatch_floating (or the caller) already checked.
template <class T>
T* ptr(const Tensor& t) { return static_cast<T*>(t.data_ptr()); }

// Warp and block reductions (blockDim.x a multiple of 32, at most 1024). `combine` is associative
// and commutative; `identity` is its neutral element, which fills the lanes past the last warp.
template <class T, class Combine>
__device__ __forceinline__ T warp_reduce(T v, Combine combine) {
  for (int o = 16; o > 0; o >>= 1) v = combine(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Every thread of the block gets the result. `scratch` is __shared__ T[32].
template <class T, class Combine>
__device__ __forceinline__ T block_reduce(T v, T* scratch, T identity, Combine combine) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  v = warp_reduce(v, combine);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : identity;
  return warp_reduce(v, combine);
}

// (Lambdas, not function pointers, so that the combine always inlines.)
__device__ __forceinline__ float warp_sum(float v) {
  return warp_reduce(v, [](float a, float b) { return a + b; });
}
__device__ __forceinline__ float warp_max(float v) {
  return warp_reduce(v, [](float a, float b) { return fmaxf(a, b); });
}
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  return block_reduce(v, scratch, 0.f, [](float a, float b) { return a + b; });
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce(v, scratch, -INFINITY, [](float a, float b) { return fmaxf(a, b); });
}

// The Philox stream every random kernel reads, the same on the CPU (core/philox.h): element i gets
// word i % 4 of block offset + i / 4. Grid-stride over the blocks, one block of four elements per
// thread, calling f(i, word) for each element i < n; launch with blocks_for((n + 3) / 4).
template <class F>
__device__ __forceinline__ void for_each_philox_word(int64_t n, uint64_t seed, uint64_t offset, F&& f) {
  const int64_t blocks = (n + 3) / 4;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t b = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; b < blocks; b += stride) {
    const philox::Words words = philox::block_words(seed, offset + static_cast<uint64_t>(b));
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t i = 4 * b + k;
      if (i >= n) break;
      f(i, words.w[k]);
    }
  }
}

}  // namespace octet::kernels::cuda
