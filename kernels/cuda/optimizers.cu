// Multi-tensor AdamW and SGD updates, the sum of squares and the scale of the gradient clip, on the GPU.
//
// One launch covers many parameters (the idea of apex's and PyTorch's multi_tensor_apply): the host
// cuts every tensor into chunks of kChunk elements and writes a table that gives each block the
// tensor and chunk it works on, plus the tensors' pointers and sizes. The table is a kernel argument
// of fixed capacity (under the classic 4 KiB parameter limit): the launch copies it along with the
// other arguments, so the host can refill it for the next launch at once, with no device buffer to
// allocate, no extra copy, and no pinned staging buffer that would need an event before its reuse.
// A call that does not fit (more than kMaxTensors tensors or kMaxBlocks chunks) takes several
// launches; entries with different dtypes (say bf16 params with f32 masters next to f32 params) go
// in separate launches, one per dtype combination.
//
// The arithmetic is the CPU kernel's (kernels/cpu/optimizers.cpp), operation for operation, with
// explicitly rounded intrinsics (__fmul_rn, ...) so that nvcc does not contract a·b + c into an
// FMA: the GPU update then gives the same bits as the CPU update of the same f32 values.
#include <array>
#include <type_traits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/optimizers_cuda.h"

namespace octet::kernels::cuda {
namespace {

constexpr int kMaxTensors = 36;
constexpr int kMaxBlocks = 320;
constexpr int64_t kChunk = 65536;  // elements per block: 128 per thread at 512 threads
constexpr int kUpdateThreads = 512;
constexpr int kIlp = 4;  // elements each thread loads before it computes, to keep more loads in flight

// Depth pointers per tensor (param, grad, state..., master), their sizes, and each block's work.
template <int Depth>
struct TensorTable {
  void* ptrs[Depth][kMaxTensors];
  int64_t numel[kMaxTensors];
  int32_t chunk_of_block[kMaxBlocks];
  uint8_t tensor_of_block[kMaxBlocks];
};
static_assert(sizeof(TensorTable<5>) + 128 <= 4096, "the table must fit the 4 KiB kernel parameter space");

// Fills tables with the chunks of `tensors` (pointer rows and element counts) and calls
// launch(table, blocks, first_block) for each full table and the last one. first_block counts the
// blocks of earlier launches, for kernels that write one result per block.
template <int Depth, class Launch>
void for_each_launch(const std::vector<std::array<void*, Depth>>& tensors, const std::vector<int64_t>& numels,
                     Launch&& launch) {
  TensorTable<Depth> table{};
  int tensors_in_table = 0, blocks_in_table = 0;
  int64_t launched_blocks = 0;
  auto flush = [&] {
    if (blocks_in_table > 0) launch(table, blocks_in_table, launched_blocks);
    launched_blocks += blocks_in_table;
    tensors_in_table = blocks_in_table = 0;
  };
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (numels[i] == 0) continue;
    const int64_t chunks = (numels[i] + kChunk - 1) / kChunk;
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
      if (chunk == 0 || blocks_in_table == 0) {
        // The tensor takes a (new) slot: either it starts here or its previous table was launched.
        if (tensors_in_table == kMaxTensors) flush();
        for (int d = 0; d < Depth; ++d) table.ptrs[d][tensors_in_table] = tensors[i][d];
        table.numel[tensors_in_table] = numels[i];
        ++tensors_in_table;
      }
      table.tensor_of_block[blocks_in_table] = static_cast<uint8_t>(tensors_in_table - 1);
      table.chunk_of_block[blocks_in_table] = static_cast<int32_t>(chunk);
      if (++blocks_in_table == kMaxBlocks) flush();
    }
  }
  flush();
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

// The block's element range [begin, end) of its tensor.
template <int Depth>
__device__ __forceinline__ int tensor_and_range(const TensorTable<Depth>& table, int64_t& begin, int64_t& end) {
  const int t = table.tensor_of_block[blockIdx.x];
  begin = static_cast<int64_t>(table.chunk_of_block[blockIdx.x]) * kChunk;
  end = min(table.numel[t], begin + kChunk);
  return t;
}

// AdamW on one chunk per block. T: compute and state type; G: gradient storage; P: param storage.
// With a master (kMaster), the update runs on the f32 master and P (bf16/f16) receives it rounded;
// without one, P is T and the param is updated in place.
// Bytes per element: f32 param: 28 (read p, g, m, v; write p, m, v); bf16 param with f32 master:
// 28 (read g 2, master, m, v 12; write master, m, v 12 and param 2).
template <class T, class G, class P, bool kMaster>
__global__ void __launch_bounds__(kUpdateThreads) adamw_multi_kernel(TensorTable<5> table, cpu::AdamWConstants<T> c) {
  int64_t begin, end;
  const int t = tensor_and_range(table, begin, end);
  P* __restrict__ param = static_cast<P*>(table.ptrs[0][t]);
  const G* __restrict__ grad = static_cast<const G*>(table.ptrs[1][t]);
  T* __restrict__ exp_avg = static_cast<T*>(table.ptrs[2][t]);
  T* __restrict__ exp_avg_sq = static_cast<T*>(table.ptrs[3][t]);
  T* __restrict__ weight = kMaster ? static_cast<T*>(table.ptrs[4][t]) : reinterpret_cast<T*>(param);

  for (int64_t base = begin + threadIdx.x; base < end; base += int64_t{kIlp} * blockDim.x) {
    T g[kIlp], m[kIlp], v[kIlp], w[kIlp];
#pragma unroll
    for (int k = 0; k < kIlp; ++k) {
      const int64_t i = base + int64_t{k} * blockDim.x;
      if (i < end) {
        g[k] = widen<T>(grad[i]);
        m[k] = exp_avg[i];
        v[k] = exp_avg_sq[i];
        w[k] = weight[i];
      }
    }
#pragma unroll
    for (int k = 0; k < kIlp; ++k) {
      const int64_t i = base + int64_t{k} * blockDim.x;
      if (i >= end) continue;
      const T new_m = add(mul(c.beta1, m[k]), mul(c.one_minus_beta1, g[k]));
      const T new_v = add(mul(c.beta2, v[k]), mul(mul(c.one_minus_beta2, g[k]), g[k]));
      const T denom = add(div(root(new_v), c.bias_correction2_sqrt), c.eps);
      const T new_w = sub(mul(w[k], c.decay), div(mul(c.step_size, new_m), denom));
      exp_avg[i] = new_m;
      exp_avg_sq[i] = new_v;
      weight[i] = new_w;
      if constexpr (kMaster) param[i] = narrow<P>(new_w);
    }
  }
}

// SGD with momentum on one chunk per block; types as for AdamW. The momentum buffer pointer is null
// for every tensor of a launch when momentum is 0.
// Bytes per element (f32, momentum): 20 (read p, g, buf; write p, buf); without momentum: 12.
template <class T, class G, class P, bool kMaster>
__global__ void __launch_bounds__(kUpdateThreads) sgd_multi_kernel(TensorTable<4> table, cpu::SgdConstants<T> c) {
  int64_t begin, end;
  const int t = tensor_and_range(table, begin, end);
  P* __restrict__ param = static_cast<P*>(table.ptrs[0][t]);
  const G* __restrict__ grad = static_cast<const G*>(table.ptrs[1][t]);
  T* __restrict__ buffer = static_cast<T*>(table.ptrs[2][t]);
  T* __restrict__ weight = kMaster ? static_cast<T*>(table.ptrs[3][t]) : reinterpret_cast<T*>(param);

  for (int64_t base = begin + threadIdx.x; base < end; base += int64_t{kIlp} * blockDim.x) {
    T g[kIlp], b[kIlp], w[kIlp];
#pragma unroll
    for (int k = 0; k < kIlp; ++k) {
      const int64_t i = base + int64_t{k} * blockDim.x;
      if (i < end) {
        g[k] = widen<T>(grad[i]);
        w[k] = weight[i];
        b[k] = buffer && !c.first_step ? buffer[i] : T(0);
      }
    }
#pragma unroll
    for (int k = 0; k < kIlp; ++k) {
      const int64_t i = base + int64_t{k} * blockDim.x;
      if (i >= end) continue;
      T d = g[k];
      // Skipped at 0 rather than multiplied by it, so an inf parameter does not turn d into NaN.
      if (c.weight_decay != T(0)) d = add(d, mul(c.weight_decay, w[k]));
      if (buffer) {
        const T new_b = c.first_step ? d : add(mul(c.momentum, b[k]), mul(c.one_minus_dampening, d));
        buffer[i] = new_b;
        d = c.nesterov ? add(d, mul(c.momentum, new_b)) : new_b;
      }
      const T new_w = sub(w[k], mul(c.lr, d));
      weight[i] = new_w;
      if constexpr (kMaster) param[i] = narrow<P>(new_w);
    }
  }
}

// ---- sum of squares ------------------------------------------------------------------------------------
constexpr int kSumThreads = 512;
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

// Σ x² of one chunk per block, each element squared in double, into partial[first_block + block].
// Bytes: reads each element once, writes 8 bytes per block.
template <class S>
__global__ void __launch_bounds__(kSumThreads)
    sum_of_squares_chunks_kernel(TensorTable<1> table, double* partial, int64_t first_block) {
  int64_t begin, end;
  const int t = tensor_and_range(table, begin, end);
  const S* __restrict__ x = static_cast<const S*>(table.ptrs[0][t]);
  double s = 0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    double v;
    if constexpr (std::is_same_v<S, double>) v = x[i];
    else v = static_cast<double>(to_float(x[i]));
    s += v * v;
  }
  s = block_sum_double(s);
  if (threadIdx.x == 0) partial[first_block + blockIdx.x] = s;
}

// total[0] = Σ partial[0..n), one block: thread j sums partial[j], partial[j + 1024], ... in order,
// then the fixed tree. Bytes: 8 per partial read, 8 written.
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
// clip that does not bind). Bytes per element: reads and writes x (2·sizeof(S)), or nothing.
template <class S>
__global__ void __launch_bounds__(kUpdateThreads) scale_chunks_kernel(TensorTable<1> table, const double* scale) {
  using C = std::conditional_t<std::is_same_v<S, double>, double, float>;
  const double s = *scale;
  if (s == 1.0) return;
  const C c = static_cast<C>(s);  // round to nearest, as the host's static_cast
  int64_t begin, end;
  const int t = tensor_and_range(table, begin, end);
  S* __restrict__ x = static_cast<S*>(table.ptrs[0][t]);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) x[i] = narrow<S>(mul(widen<C>(x[i]), c));
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
      for_each_launch<5>(ptrs, numels, [&](const TensorTable<5>& table, int blocks, int64_t) {
        adamw_multi_kernel<T, G, P, kMaster><<<blocks, kUpdateThreads, 0, stream>>>(table, c);
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
      for_each_launch<4>(ptrs, numels, [&](const TensorTable<4>& table, int blocks, int64_t) {
        sgd_multi_kernel<T, G, P, kMaster><<<blocks, kUpdateThreads, 0, stream>>>(table, c);
        check_launch("sgd_step_multi_");
      });
    });
  }
}

Tensor sum_of_squares_multi(const std::vector<Tensor>& tensors, Device device) {
  // The kernels read f32, bf16, f16 and f64; FP8 tensors are widened to f32 first (exactly).
  std::vector<Tensor> readable;
  readable.reserve(tensors.size());
  int64_t total_blocks = 0;
  for (const Tensor& t : tensors) {
    const bool native =
        t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16 || t.dtype() == DType::f64;
    readable.push_back(native ? t : t.detach().to(DType::f32));
    total_blocks += (t.numel() + kChunk - 1) / kChunk;
  }
  const Tensor total = empty({}, DType::f64, device);
  if (total_blocks == 0) {
    total.zero_();
    return total;
  }
  cudaStream_t stream = octet::cuda::launch_stream(device.index);

  const Tensor partial = empty({total_blocks}, DType::f64, device);
  int64_t written = 0;  // blocks of earlier dtype groups
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
      int64_t group_blocks = 0;
      for_each_launch<1>(ptrs, numels, [&](const TensorTable<1>& table, int blocks, int64_t first_block) {
        sum_of_squares_chunks_kernel<S>
            <<<blocks, kSumThreads, 0, stream>>>(table, ptr<double>(partial), written + first_block);
        check_launch("sum_of_squares_multi");
        group_blocks = first_block + blocks;
      });
      written += group_blocks;
    };
    if (dtype == DType::f64) launch_all.template operator()<double>();
    else dispatch_floating(dtype, "sum_of_squares_multi", launch_all);
  }
  sum_partials_kernel<<<1, kFinalThreads, 0, stream>>>(ptr<double>(partial), total_blocks, ptr<double>(total));
  check_launch("sum_of_squares_multi");
  return total;  // left on the device: nothing waits for it
}

ClipScalars clip_scalars(const Tensor& sum_of_squares, double max_norm) {
  const Tensor norm = empty({}, DType::f64, sum_of_squares.device());
  const Tensor coef = empty({}, DType::f64, sum_of_squares.device());
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
      for_each_launch<1>(ptrs, numels, [&](const TensorTable<1>& table, int blocks, int64_t) {
        scale_chunks_kernel<S><<<blocks, kUpdateThreads, 0, stream>>>(table, ptr<double>(scale64));
        check_launch("scale_multi_");
      });
    };
    if (dtype == DType::f64) launch_all.template operator()<double>();
    else dispatch_floating(dtype, "scale_multi_", launch_all);
  }
}

}  // namespace octet::kernels::cuda
