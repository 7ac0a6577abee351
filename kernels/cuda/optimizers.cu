// Multi-tensor AdamW and SGD updates, the f32 master copies of a first step, and the sum of squares
// and the scale of the gradient clip, on the GPU.
//
// All of these are memory-bound: an update does a dozen flops per element and moves 20 (SGD) or 28
// (AdamW) bytes of it, so its speed is the rate at which it moves bytes, and the goal is the rate
// of a device-to-device copy (about 4.3 TB/s, reads and writes counted, on an H200; 3.0 on an H100).
// Three things get there:
//
// 1. One launch for a whole list of tensors. The host cuts every tensor into chunks and passes one
//    table as the kernel's argument: per tensor its pointers (param, grad, state..., master), its
//    size, the index of its first chunk and whether all its pointers are 16-byte aligned. Since
//    CUDA 12.1 a kernel takes up to 32,764 bytes of arguments (compute capability 7.0 and later), so
//    the table holds kMaxTensors = 512 tensors of five pointers: ViT-H/16's 392 parameters are one
//    launch. (The 4 KiB table this replaces held 36 tensors and 320 blocks, and an SGD step over
//    ViT-H took 31 launches of 320 blocks each, too few to keep 132 SMs busy to the end.) The launch
//    copies its arguments, so the host refills the table at once: no device buffer, no pinned
//    staging buffer, no event to wait on before reusing it. The table is a __grid_constant__
//    argument: read in place from the constant bank, never copied to a thread's local memory.
// 2. One block per chunk (kUpdateChunk elements: ViT-H's SGD step is ~19,500 blocks), scheduled by
//    the hardware over every SM, so all SMs stay busy and the last wave is short. A block finds its
//    tensor by binary search over the tensors' first chunks (9 steps for 392 tensors; every thread
//    of the block reads the same table entries from the constant bank).
// 3. 16-byte accesses, several in flight. A thread owns packs of kPack = 8 consecutive elements and
//    moves each stream of a pack with 16-byte loads and stores: one for 8 bf16, two for 8 f32. It
//    loads every stream of kUnroll packs before it computes the first: with one pack that is 5
//    (SGD: grad, master, momentum) or 7 (AdamW) independent 16-byte loads in flight per thread, at
//    50 and 60 registers, so 4 blocks of 256 threads fit on an SM: 80 and 112 KB in flight per SM,
//    where about 33 KB covers the memory latency at full bandwidth (4.3 TB/s ÷ 132 SMs × ~1 µs of
//    latency under load). Two packs (kUnroll = 2) keep the
//    same bytes in flight with half the warps (91 and 120 registers, 2 blocks per SM); which is
//    faster is for bench_kernels to say on the GPU. The last n % 8 elements of a tensor, and all
//    of a tensor whose pointers are not all 16-byte aligned (a view at an odd offset), take a scalar
//    loop. Offsets within a chunk are 32-bit; the chunk's start is the one 64-bit product, once per
//    block.
//
// The arithmetic is the CPU kernel's (kernels/cpu/optimizers.cpp), operation for operation, with
// explicitly rounded intrinsics (__fmul_rn, ...) so that nvcc does not contract a·b + c into an
// FMA: the GPU update then gives the same bits as the CPU update of the same f32 values. The vector
// and the scalar path call the same per-element function.
//
// The sum of squares and the clip's scale use the same table with chunks of their own (65536
// elements, one block of 512 threads each, one partial sum per chunk in chunk order): exactly the
// blocks, and so the bits, they had before the table grew.
#include <array>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/float_formats.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/optimizers_cuda.h"

namespace octet::kernels::cuda {
namespace {

// ---- the table of tensors ----------------------------------------------------------------------------------

constexpr int kMaxTensors = 512;
constexpr int64_t kMaxChunks = int64_t{1} << 30;  // per launch: the grid's x dimension and int32 indices
constexpr size_t kMaxKernelArgumentBytes = 32764;  // CUDA 12.1+, compute capability 7.0+

// Depth pointers per tensor, its size, the launch's chunks it owns and whether it is aligned.
template <int Depth>
struct ChunkTable {
  void* ptrs[Depth][kMaxTensors];
  int64_t numel[kMaxTensors];
  int32_t first_chunk[kMaxTensors];  // tensor t owns chunks [first_chunk[t], first_chunk[t + 1]) of the launch
  uint8_t aligned[kMaxTensors];      // 1: every non-null pointer of tensor t is 16-byte aligned
  int32_t tensors;
};
static_assert(sizeof(ChunkTable<5>) + sizeof(cpu::AdamWConstants<double>) <= kMaxKernelArgumentBytes,
              "AdamW's table and constants must fit the 32,764 bytes of kernel arguments");

// Fills tables with whole tensors (pointer rows and element counts; empty tensors are skipped) and
// calls launch(table, chunks, chunks_before) for each: `chunks` is the launch's grid, one block
// per chunk of chunk_elems elements, and chunks_before counts the chunks of earlier launches, for
// kernels that write one result per chunk. A list of at most kMaxTensors tensors is one launch.
template <int Depth, class Launch>
void for_each_launch(const std::vector<std::array<void*, Depth>>& tensors, const std::vector<int64_t>& numels,
                     int chunk_elems, Launch&& launch) {
  auto table = std::make_unique<ChunkTable<Depth>>();  // zeroed; 27 KB, so not on the stack
  int64_t chunks = 0, chunks_before = 0;
  auto flush = [&] {
    if (table->tensors == 0) return;
    launch(*table, static_cast<unsigned>(chunks), chunks_before);
    chunks_before += chunks;
    chunks = 0;
    table->tensors = 0;
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (numels[i] == 0) continue;
    const int64_t tensor_chunks = (numels[i] + chunk_elems - 1) / chunk_elems;
    OCTET_CHECK(tensor_chunks <= kMaxChunks, "multi-tensor launch: a tensor of ", numels[i],
                " elements is more than one launch can cover; split it");
    if (table->tensors == kMaxTensors || chunks + tensor_chunks > kMaxChunks) flush();
    const int t = table->tensors++;
    bool aligned = true;
    for (int d = 0; d < Depth; ++d) {
      table->ptrs[d][t] = tensors[i][d];
      aligned = aligned && aligned16(tensors[i][d]);  // a null pointer is aligned
    }
    table->numel[t] = numels[i];
    table->first_chunk[t] = static_cast<int32_t>(chunks);
    table->aligned[t] = aligned ? 1 : 0;
    chunks += tensor_chunks;
  }
  flush();
}

// The block's chunk: its tensor, its first element in that tensor, and its length (1..chunk_elems).
struct Chunk {
  int tensor;
  int64_t begin;
  int n;
};

// Binary search for the last tensor whose first chunk is at most blockIdx.x.
template <int Depth>
__device__ __forceinline__ Chunk find_chunk(const ChunkTable<Depth>& table, int chunk_elems) {
  const int c = static_cast<int>(blockIdx.x);
  int lo = 0, hi = table.tensors - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table.first_chunk[mid] <= c) lo = mid;
    else hi = mid - 1;
  }
  Chunk chunk;
  chunk.tensor = lo;
  chunk.begin = static_cast<int64_t>(c - table.first_chunk[lo]) * chunk_elems;
  chunk.n = static_cast<int>(min(table.numel[lo] - chunk.begin, static_cast<int64_t>(chunk_elems)));
  return chunk;
}

// Stream d of the block's tensor, from the chunk's first element (null stays null).
template <class X, int Depth>
__device__ __forceinline__ X* chunk_stream(const ChunkTable<Depth>& table, int d, const Chunk& chunk) {
  X* base = static_cast<X*>(table.ptrs[d][chunk.tensor]);
  return base == nullptr ? nullptr : base + chunk.begin;
}

// ---- exactly rounded arithmetic (no FMA contraction), for float and double -------------------------------
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float root(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ double div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ double root(double a) { return __dsqrt_rn(a); }

// A stored value widened to the compute type T, and T rounded to storage type S.
template <class T, class S>
__device__ __forceinline__ T widen(S x) {
  if constexpr (std::is_same_v<S, T>) return x;
  else return static_cast<T>(to_float(x));
}
template <class S, class T>
__device__ __forceinline__ S narrow(T x) {
  if constexpr (std::is_same_v<S, T>) return x;
  else return from_float<S>(static_cast<float>(x));
}

// ---- packs of 8 elements, moved 16 bytes at a time ------------------------------------------------------

constexpr int kPack = 8;

// out[k] = T(p[k]) for k < 8: 16 / sizeof(S) elements per 16-byte load (p 16-byte aligned).
template <class T, class S>
__device__ __forceinline__ void load8(const S* p, T (&out)[kPack]) {
  constexpr int kPer = Pack<S>::N;
#pragma unroll
  for (int v = 0; v < kPack / kPer; ++v) {
    const Pack<S> x = load_pack(p + v * kPer);
#pragma unroll
    for (int k = 0; k < kPer; ++k) out[v * kPer + k] = widen<T>(x.v[k]);
  }
}
// p[k] = S(in[k]) for k < 8, 16 bytes per store.
template <class S, class T>
__device__ __forceinline__ void store8(S* p, const T (&in)[kPack]) {
  constexpr int kPer = Pack<S>::N;
#pragma unroll
  for (int v = 0; v < kPack / kPer; ++v) {
    Pack<S> x;
#pragma unroll
    for (int k = 0; k < kPer; ++k) x.v[k] = narrow<S>(in[v * kPer + k]);
    store_pack(p + v * kPer, x);
  }
}

// ---- AdamW and SGD ---------------------------------------------------------------------------------------

constexpr int kUpdateThreads = 256;
constexpr int kUpdateChunk = 32768;  // elements per block: 16 packs per thread
// Packs a thread loads before it computes the first (see the file's comment, 3.).
constexpr int kUnroll = 1;

// One element of AdamW: updates m and v and returns the new weight.
template <class T>
__device__ __forceinline__ T adamw_element(const cpu::AdamWConstants<T>& c, T g, T w, T& m, T& v) {
  m = add(mul(c.beta1, m), mul(c.one_minus_beta1, g));
  v = add(mul(c.beta2, v), mul(mul(c.one_minus_beta2, g), g));
  const T denom = add(div(root(v), c.bias_correction2_sqrt), c.eps);
  return sub(mul(w, c.decay), div(mul(c.step_size, m), denom));
}

// One element of SGD: returns the new weight, and sets new_b to the new momentum (0 without one).
template <class T>
__device__ __forceinline__ T sgd_element(const cpu::SgdConstants<T>& c, bool has_buffer, T g, T w, T b, T& new_b) {
  T d = g;
  // Skipped at 0 rather than multiplied by it, so an inf parameter does not turn d into NaN.
  if (c.weight_decay != T(0)) d = add(d, mul(c.weight_decay, w));
  new_b = T(0);
  if (has_buffer) {
    new_b = c.first_step ? d : add(mul(c.momentum, b), mul(c.one_minus_dampening, d));
    d = c.nesterov ? add(d, mul(c.momentum, new_b)) : new_b;
  }
  return sub(w, mul(c.lr, d));
}

// AdamW on one chunk per block. T: compute and state type; G: gradient storage; P: param storage.
// With a master (kMaster), the update runs on the f32 master and P (bf16/f16) receives it rounded;
// without one, P is T and the param is updated in place.
template <class T, class G, class P, bool kMaster>
__global__ void __launch_bounds__(kUpdateThreads) adamw_multi_kernel(__grid_constant__ const ChunkTable<5> table, cpu::AdamWConstants<T> c) {
  constexpr int U = kUnroll;
  const Chunk chunk = find_chunk(table, kUpdateChunk);
  P* __restrict__ param = chunk_stream<P>(table, 0, chunk);
  const G* __restrict__ grad = chunk_stream<const G>(table, 1, chunk);
  T* __restrict__ exp_avg = chunk_stream<T>(table, 2, chunk);
  T* __restrict__ exp_avg_sq = chunk_stream<T>(table, 3, chunk);
  T* __restrict__ weight = kMaster ? chunk_stream<T>(table, 4, chunk) : reinterpret_cast<T*>(param);

  int done = 0;
  if (table.aligned[chunk.tensor]) {
    const int packs = chunk.n / kPack;
    for (int first = threadIdx.x; first < packs; first += U * kUpdateThreads) {
      T g[U][kPack], m[U][kPack], v[U][kPack], w[U][kPack];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int p = first + u * kUpdateThreads;
        if (p < packs) {
          load8(grad + p * kPack, g[u]);
          load8(exp_avg + p * kPack, m[u]);
          load8(exp_avg_sq + p * kPack, v[u]);
          load8(weight + p * kPack, w[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int p = first + u * kUpdateThreads;
        if (p >= packs) break;
        T new_w[kPack];
#pragma unroll
        for (int k = 0; k < kPack; ++k) new_w[k] = adamw_element(c, g[u][k], w[u][k], m[u][k], v[u][k]);
        store8(exp_avg + p * kPack, m[u]);
        store8(exp_avg_sq + p * kPack, v[u]);
        store8(weight + p * kPack, new_w);
        if constexpr (kMaster) store8(param + p * kPack, new_w);
      }
    }
    done = packs * kPack;
  }
  for (int i = done + static_cast<int>(threadIdx.x); i < chunk.n; i += kUpdateThreads) {
    T m = exp_avg[i], v = exp_avg_sq[i];
    const T new_w = adamw_element(c, widen<T>(grad[i]), weight[i], m, v);
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    weight[i] = new_w;
    if constexpr (kMaster) param[i] = narrow<P>(new_w);
  }
}

// SGD with momentum on one chunk per block; types as for AdamW. The momentum buffer pointer is null
// for every tensor of a launch when momentum is 0. The first step writes the buffer without reading it.
template <class T, class G, class P, bool kMaster>
__global__ void __launch_bounds__(kUpdateThreads) sgd_multi_kernel(__grid_constant__ const ChunkTable<4> table, cpu::SgdConstants<T> c) {
  constexpr int U = kUnroll;
  const Chunk chunk = find_chunk(table, kUpdateChunk);
  P* __restrict__ param = chunk_stream<P>(table, 0, chunk);
  const G* __restrict__ grad = chunk_stream<const G>(table, 1, chunk);
  T* __restrict__ buffer = chunk_stream<T>(table, 2, chunk);
  T* __restrict__ weight = kMaster ? chunk_stream<T>(table, 3, chunk) : reinterpret_cast<T*>(param);
  const bool has_buffer = buffer != nullptr;
  const bool read_buffer = has_buffer && !c.first_step;

  int done = 0;
  if (table.aligned[chunk.tensor]) {
    const int packs = chunk.n / kPack;
    for (int first = threadIdx.x; first < packs; first += U * kUpdateThreads) {
      T g[U][kPack], w[U][kPack], b[U][kPack];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int p = first + u * kUpdateThreads;
        if (p < packs) {
          load8(grad + p * kPack, g[u]);
          load8(weight + p * kPack, w[u]);
          if (read_buffer) {
            load8(buffer + p * kPack, b[u]);
          } else {
#pragma unroll
            for (int k = 0; k < kPack; ++k) b[u][k] = T(0);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int p = first + u * kUpdateThreads;
        if (p >= packs) break;
        T new_w[kPack], new_b[kPack];
#pragma unroll
        for (int k = 0; k < kPack; ++k) new_w[k] = sgd_element(c, has_buffer, g[u][k], w[u][k], b[u][k], new_b[k]);
        if (has_buffer) store8(buffer + p * kPack, new_b);
        store8(weight + p * kPack, new_w);
        if constexpr (kMaster) store8(param + p * kPack, new_w);
      }
    }
    done = packs * kPack;
  }
  for (int i = done + static_cast<int>(threadIdx.x); i < chunk.n; i += kUpdateThreads) {
    T new_b;
    const T new_w = sgd_element(c, has_buffer, widen<T>(grad[i]), weight[i], read_buffer ? buffer[i] : T(0), new_b);
    if (has_buffer) buffer[i] = new_b;
    weight[i] = new_w;
    if constexpr (kMaster) param[i] = narrow<P>(new_w);
  }
}

// ---- f32 master copies -------------------------------------------------------------------------------------

// The host's bf16 and f16 widenings (core/float_formats.h), so a master is Tensor::to(f32)'s bits.
struct Bf16BitsToF32 {
  __device__ float operator()(uint16_t b) const { return bf16_bits_to_float(b); }
};
struct F16BitsToF32 {
  __device__ float operator()(uint16_t b) const { return f16_bits_to_float(b); }
};

// dst = f32(src) on one chunk per block: 8 elements per 16-byte load, two 16-byte stores, four loads
// in flight per thread.
constexpr int kWidenUnroll = 4;
template <class Widen>
__global__ void __launch_bounds__(kUpdateThreads) widen_to_f32_kernel(__grid_constant__ const ChunkTable<2> table, Widen widen_bits) {
  const Chunk chunk = find_chunk(table, kUpdateChunk);
  const uint16_t* __restrict__ src = chunk_stream<const uint16_t>(table, 0, chunk);
  float* __restrict__ dst = chunk_stream<float>(table, 1, chunk);
  int done = 0;
  if (table.aligned[chunk.tensor]) {
    // kWidenUnroll packs loaded before the first is widened: a read of 16 bytes is followed by 32 of
    // writes, so with one pack a thread had a single load in flight between its stores, and the third
    // run timed this kernel at 0.56 of a copy (1635 µs for ViT-H's 3.8 GB).
    const int packs = chunk.n / kPack;
    for (int first = threadIdx.x; first < packs; first += kWidenUnroll * kUpdateThreads) {
      Pack<uint16_t> in[kWidenUnroll];
#pragma unroll
      for (int u = 0; u < kWidenUnroll; ++u) {
        const int p = first + u * kUpdateThreads;
        if (p < packs) in[u] = load_pack(src + p * kPack);
      }
#pragma unroll
      for (int u = 0; u < kWidenUnroll; ++u) {
        const int p = first + u * kUpdateThreads;
        if (p >= packs) break;
        Pack<float> lo, hi;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          lo.v[k] = widen_bits(in[u].v[k]);
          hi.v[k] = widen_bits(in[u].v[k + 4]);
        }
        store_pack(dst + p * kPack, lo);
        store_pack(dst + p * kPack + 4, hi);
      }
    }
    done = packs * kPack;
  }
  for (int i = done + static_cast<int>(threadIdx.x); i < chunk.n; i += kUpdateThreads) dst[i] = widen_bits(src[i]);
}

// ---- sum of squares ------------------------------------------------------------------------------------

constexpr int kSumThreads = 512;
constexpr int kSumChunk = 65536;  // the chunk, and so the partial sums, the results' bits depend on
constexpr int kFinalThreads = 1024;

__device__ __forceinline__ double warp_sum_double(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// The block's total, in a fixed order (so the same inputs give the same bits); valid in thread 0.
__device__ __forceinline__ double block_sum_double(double v) {
  __shared__ double scratch[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum_double(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = threadIdx.x < warps ? scratch[threadIdx.x] : 0.0;
  return warp == 0 ? warp_sum_double(v) : 0.0;
}

// Σ x² of one chunk per block, each element squared in double, into partial[chunks_before + block].
template <class S>
__global__ void __launch_bounds__(kSumThreads)
    sum_of_squares_chunks_kernel(__grid_constant__ const ChunkTable<1> table, double* partial, int64_t chunks_before) {
  const Chunk chunk = find_chunk(table, kSumChunk);
  const S* __restrict__ x = chunk_stream<const S>(table, 0, chunk);
  double s = 0;
  for (int i = threadIdx.x; i < chunk.n; i += blockDim.x) {
    double v;
    if constexpr (std::is_same_v<S, double>) v = x[i];
    else v = static_cast<double>(to_float(x[i]));
    s += v * v;
  }
  s = block_sum_double(s);
  if (threadIdx.x == 0) partial[chunks_before + blockIdx.x] = s;
}

// total[0] = Σ partial[0..n), one block: thread j sums partial[j], partial[j + 1024], ... in order,
// then the fixed tree.
__global__ void __launch_bounds__(kFinalThreads) sum_partials_kernel(const double* partial, int64_t n, double* total) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum_double(s);
  if (threadIdx.x == 0) total[0] = s;
}

// ---- gradient-norm clipping -------------------------------------------------------------------------------

// norm = √sum_of_squares and coef = clip_coefficient(norm, max_norm) (kernels/optimizers.h), one thread.
__global__ void clip_scalars_kernel(const double* sum_of_squares, double max_norm, double* norm, double* coef) {
  const double n = __dsqrt_rn(*sum_of_squares);
  *norm = n;
  *coef = clip_coefficient(n, max_norm);
}

// x ← S(C(x) · C(scale)) on one chunk per block, with C the compute type (float; double for double
// storage), the scale read from the device and rounded once to C, as mul_scalar_ rounds its scalar.
// A scale of exactly 1 returns at once: x · 1 is x, so nothing needs writing (the common case of a
// clip that does not bind).
template <class S>
__global__ void __launch_bounds__(kSumThreads) scale_chunks_kernel(__grid_constant__ const ChunkTable<1> table, const double* scale) {
  using C = std::conditional_t<std::is_same_v<S, double>, double, float>;
  const double s = *scale;
  if (s == 1.0) return;
  const C c = static_cast<C>(s);  // round to nearest, as the host's static_cast
  const Chunk chunk = find_chunk(table, kSumChunk);
  S* __restrict__ x = chunk_stream<S>(table, 0, chunk);
  for (int i = threadIdx.x; i < chunk.n; i += blockDim.x) x[i] = narrow<S>(mul(widen<C>(x[i]), c));
}

// ---- host side ---------------------------------------------------------------------------------------------

// The dtype combination of an entry; entries of one combination share a launch.
enum class Variant { F32, F32WithBf16Grad, F64, Bf16WithMaster, F16WithMaster };
constexpr Variant kVariants[] = {Variant::F32, Variant::F32WithBf16Grad, Variant::F64, Variant::Bf16WithMaster,
                                 Variant::F16WithMaster};

Variant variant_of(const Tensor& param, const Tensor& grad, const Tensor& master) {
  if (master.defined()) return param.dtype() == DType::bf16 ? Variant::Bf16WithMaster : Variant::F16WithMaster;
  if (param.dtype() == DType::f64) return Variant::F64;
  return grad.dtype() == DType::bf16 ? Variant::F32WithBf16Grad : Variant::F32;
}

// Calls f.template operator()<T, G, P, kMaster>() for a variant.
template <class F>
void with_variant_types(Variant variant, F&& f) {
  switch (variant) {
    case Variant::F32: return f.template operator()<float, float, float, false>();
    case Variant::F32WithBf16Grad: return f.template operator()<float, __nv_bfloat16, float, false>();
    case Variant::F64: return f.template operator()<double, double, double, false>();
    case Variant::Bf16WithMaster: return f.template operator()<float, __nv_bfloat16, __nv_bfloat16, true>();
    case Variant::F16WithMaster: return f.template operator()<float, __half, __half, true>();
  }
}

void* raw(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

}  // namespace

void adamw_step_multi_(const std::vector<AdamWTensors>& tensors, const cpu::AdamWConstants<double>& constants) {
  if (tensors.empty()) return;
  cudaStream_t stream = stream_for(tensors[0].param);
  for (Variant variant : kVariants) {
    std::vector<std::array<void*, 5>> ptrs;
    std::vector<int64_t> numels;
    for (const AdamWTensors& t : tensors) {
      if (variant_of(t.param, t.grad, t.master) != variant) continue;
      ptrs.push_back({raw(t.param), raw(t.grad), raw(t.exp_avg), raw(t.exp_avg_sq), raw(t.master)});
      numels.push_back(t.param.numel());
    }
    if (ptrs.empty()) continue;
    with_variant_types(variant, [&]<class T, class G, class P, bool kMaster>() {
      const cpu::AdamWConstants<T> c = cpu::rounded_to<T>(constants);
      for_each_launch<5>(ptrs, numels, kUpdateChunk, [&](const ChunkTable<5>& table, unsigned chunks, int64_t) {
        // Bytes per element: f32 param 28 (read p, g, m, v; write p, m, v); bf16 param with f32 master
        // 28 (read g 2, master, m, v 12; write master, m, v 12, param 2). ViT-H/16 in bf16, 632 M
        // parameters: 17.7 GB, 4.1 ms at 4.3 TB/s; one launch of ~19,500 blocks.
        adamw_multi_kernel<T, G, P, kMaster><<<chunks, kUpdateThreads, 0, stream>>>(table, c);
        check_launch("adamw_step_multi_");
      });
    });
  }
}

void sgd_step_multi_(const std::vector<SgdTensors>& tensors, const cpu::SgdConstants<double>& constants) {
  if (tensors.empty()) return;
  cudaStream_t stream = stream_for(tensors[0].param);
  for (Variant variant : kVariants) {
    std::vector<std::array<void*, 4>> ptrs;
    std::vector<int64_t> numels;
    for (const SgdTensors& t : tensors) {
      if (variant_of(t.param, t.grad, t.master) != variant) continue;
      ptrs.push_back({raw(t.param), raw(t.grad), raw(t.momentum_buffer), raw(t.master)});
      numels.push_back(t.param.numel());
    }
    if (ptrs.empty()) continue;
    with_variant_types(variant, [&]<class T, class G, class P, bool kMaster>() {
      const cpu::SgdConstants<T> c = cpu::rounded_to<T>(constants);
      for_each_launch<4>(ptrs, numels, kUpdateChunk, [&](const ChunkTable<4>& table, unsigned chunks, int64_t) {
        // Bytes per element with momentum: bf16 param with f32 master 20 (read g 2, master 4,
        // buffer 4; write master 4, buffer 4, param 2), 16 on the first step, which reads no buffer;
        // f32 param 20 (read p, g, buffer; write p, buffer). Without momentum 8 fewer. ViT-H/16 in
        // bf16, 632 M parameters: 12.6 GB, 2.9 ms at 4.3 TB/s; one launch of ~19,500 blocks.
        sgd_multi_kernel<T, G, P, kMaster><<<chunks, kUpdateThreads, 0, stream>>>(table, c);
        check_launch("sgd_step_multi_");
      });
    });
  }
}

void widen_to_f32_multi_(const std::vector<Tensor>& sources, const std::vector<Tensor>& destinations) {
  if (sources.empty()) return;
  cudaStream_t stream = stream_for(sources[0]);
  for (DType dtype : {DType::bf16, DType::f16}) {
    std::vector<std::array<void*, 2>> ptrs;
    std::vector<int64_t> numels;
    for (size_t i = 0; i < sources.size(); ++i) {
      if (sources[i].dtype() != dtype) continue;
      ptrs.push_back({sources[i].data_ptr(), destinations[i].data_ptr()});
      numels.push_back(sources[i].numel());
    }
    if (ptrs.empty()) continue;
    for_each_launch<2>(ptrs, numels, kUpdateChunk, [&](const ChunkTable<2>& table, unsigned chunks, int64_t) {
      // Bytes per element: read 2, write 4. The masters of ViT-H/16's 632 M bf16 parameters: 3.8 GB,
      // 0.88 ms at 4.3 TB/s, once, on the first step (it was 392 conversions of one tensor each).
      if (dtype == DType::bf16) {
        widen_to_f32_kernel<<<chunks, kUpdateThreads, 0, stream>>>(table, Bf16BitsToF32{});
      } else {
        widen_to_f32_kernel<<<chunks, kUpdateThreads, 0, stream>>>(table, F16BitsToF32{});
      }
      check_launch("widen_to_f32_multi_");
    });
  }
}

Tensor sum_of_squares_multi(const std::vector<Tensor>& tensors, Device device) {
  // The kernels read f32, bf16, f16 and f64; FP8 tensors are widened to f32 first (exactly).
  std::vector<Tensor> readable;
  readable.reserve(tensors.size());
  int64_t total_chunks = 0;
  for (const Tensor& t : tensors) {
    const bool native =
        t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16 || t.dtype() == DType::f64;
    readable.push_back(native ? t : t.detach().to(DType::f32));
    total_chunks += (t.numel() + kSumChunk - 1) / kSumChunk;
  }
  const Tensor total = empty({}, DType::f64, device);
  if (total_chunks == 0) {
    total.zero_();
    return total;
  }
  cudaStream_t stream = octet::cuda::launch_stream(device.index);

  const Tensor partial = empty({total_chunks}, DType::f64, device);
  int64_t written = 0;  // chunks of earlier dtype groups
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    std::vector<std::array<void*, 1>> ptrs;
    std::vector<int64_t> numels;
    for (const Tensor& t : readable) {
      if (t.dtype() != dtype) continue;
      ptrs.push_back({t.data_ptr()});
      numels.push_back(t.numel());
    }
    if (ptrs.empty()) continue;
    auto launch_all = [&]<class S>() {
      int64_t group_chunks = 0;
      for_each_launch<1>(ptrs, numels, kSumChunk, [&](const ChunkTable<1>& table, unsigned chunks, int64_t before) {
        // Bytes: reads each element once (ViT-H/16's bf16 gradients: 1.26 GB, 0.29 ms at 4.3 TB/s),
        // writes 8 per chunk.
        sum_of_squares_chunks_kernel<S>
            <<<chunks, kSumThreads, 0, stream>>>(table, ptr<double>(partial), written + before);
        check_launch("sum_of_squares_multi");
        group_chunks = before + chunks;
      });
      written += group_chunks;
    };
    if (dtype == DType::f64) launch_all.template operator()<double>();
    else dispatch_floating(dtype, "sum_of_squares_multi", launch_all);
  }
  // Bytes: 8 per chunk read (ViT-H/16: ~10,000 chunks, 80 KB), 8 written; a few µs.
  sum_partials_kernel<<<1, kFinalThreads, 0, stream>>>(ptr<double>(partial), total_chunks, ptr<double>(total));
  check_launch("sum_of_squares_multi");
  return total;  // left on the device: nothing waits for it
}

ClipScalars clip_scalars(const Tensor& sum_of_squares, double max_norm) {
  const Tensor norm = empty({}, DType::f64, sum_of_squares.device());
  const Tensor coef = empty({}, DType::f64, sum_of_squares.device());
  // Bytes: 8 read, 16 written; one thread, a launch's latency.
  clip_scalars_kernel<<<1, 1, 0, stream_for(sum_of_squares)>>>(ptr<double>(sum_of_squares), max_norm,
                                                               ptr<double>(norm), ptr<double>(coef));
  check_launch("clip_scalars");
  return {norm, coef};
}

void scale_multi_(const std::vector<Tensor>& tensors, const Tensor& scale) {
  if (tensors.empty()) return;
  // The kernels read the scale in double; an f32 scale widens exactly, on the device.
  const Tensor scale64 = scale.detach().to(DType::f64);
  cudaStream_t stream = stream_for(scale64);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    std::vector<std::array<void*, 1>> ptrs;
    std::vector<int64_t> numels;
    for (const Tensor& t : tensors) {
      if (t.dtype() != dtype) continue;
      ptrs.push_back({t.data_ptr()});
      numels.push_back(t.numel());
    }
    if (ptrs.empty()) continue;
    auto launch_all = [&]<class S>() {
      for_each_launch<1>(ptrs, numels, kSumChunk, [&](const ChunkTable<1>& table, unsigned chunks, int64_t) {
        // Bytes: reads and writes each element (ViT-H/16's bf16 gradients: 2.5 GB, 0.59 ms at
        // 4.3 TB/s) when the clip binds; 8 per block (the scale) when it does not.
        scale_chunks_kernel<S><<<chunks, kSumThreads, 0, stream>>>(table, ptr<double>(scale64));
        check_launch("scale_multi_");
      });
    };
    if (dtype == DType::f64) launch_all.template operator()<double>();
    else dispatch_floating(dtype, "scale_multi_", launch_all);
  }
}

}  // namespace octet::kernels::cuda
