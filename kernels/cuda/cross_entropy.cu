// Softmax cross-entropy with label smoothing on the GPU, fused: the probabilities are never stored.
// The formulas are the CPU kernel's (kernels/cpu/cross_entropy.cpp): with q = (1 - s)·onehot(t) + s/C,
//   lse  = log Σ exp(z),   loss_row = lse - (1 - s)·z_t - (s/C)·Σ z,
//   loss = mean of loss_row over rows whose target is not ignore_index,
//   dlogits = dloss / (rows not ignored) · (exp(z - lse) - q),   0 on ignored rows.
// Nothing here waits for the GPU: the number of rows that count is found on the device, and dloss
// is read there. A target outside [0, C) that is not ignore_index gives its row a NaN loss and
// gradient (the host cannot see the values without a sync), so the mean loss shows it.
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/nn_ops_cuda.h"

namespace octet::kernels::cuda {
namespace {

constexpr int kRowThreads = 256;  // one warp per row, 8 rows per block
constexpr int kRowsPerBlock = kRowThreads / 32;
constexpr int kTotalThreads = 1024;

unsigned row_blocks(int64_t N) { return static_cast<unsigned>((N + kRowsPerBlock - 1) / kRowsPerBlock); }

// Merges a running (max, Σ exp(z - max)) pair with another; an empty pair has max = -inf.
__device__ __forceinline__ void merge_lse(float& m, float& s, float other_m, float other_s) {
  const float nm = fmaxf(m, other_m);
  if (nm == -INFINITY) return;  // both empty
  s = (m == -INFINITY ? 0.f : s * expf(m - nm)) + (other_m == -INFINITY ? 0.f : other_s * expf(other_m - nm));
  m = nm;
}

// Per row (one warp): lse[r] and row_loss[r] (0 for ignored rows, NaN for a bad target), in one read
// of the logits (an online max / sum of exponentials).
// Bytes: reads the logits once, writes 8 per row.
template <class T, class I>
__global__ void cross_entropy_rows_kernel(const T* __restrict__ logits, const I* __restrict__ targets,
                                          float* __restrict__ lse, float* __restrict__ row_loss, int64_t N, int64_t C,
                                          float label_smoothing, int64_t ignore_index) {
  const int64_t r = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= N) return;
  const T* z = logits + r * C;
  float m = -INFINITY, s = 0.f, sum_z = 0.f;
  for (int64_t c = lane; c < C; c += 32) {
    const float v = to_float(z[c]);
    sum_z += v;
    if (v > m) {
      s = (m == -INFINITY ? 0.f : s * expf(m - v)) + 1.f;
      m = v;
    } else {
      s += expf(v - m);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float other_m = __shfl_xor_sync(0xffffffffu, m, o), other_s = __shfl_xor_sync(0xffffffffu, s, o);
    merge_lse(m, s, other_m, other_s);
  }
  sum_z = warp_sum(sum_z);
  if (lane != 0) return;
  const float row_lse = m + logf(s);
  lse[r] = row_lse;
  const int64_t t = static_cast<int64_t>(targets[r]);
  if (t == ignore_index) {
    row_loss[r] = 0.f;
  } else if (t < 0 || t >= C) {
    row_loss[r] = NAN;
  } else {
    const float smooth_per_class = label_smoothing / static_cast<float>(C);
    row_loss[r] = row_lse - (1.f - label_smoothing) * to_float(z[t]) - smooth_per_class * sum_z;
  }
}

// The number of rows whose target is not ignore_index, summed by one block in a fixed order;
// valid in thread 0.
template <class I>
__device__ long long count_counted_rows(const I* targets, int64_t N, int64_t ignore_index) {
  __shared__ long long scratch[32];
  long long n = 0;
  for (int64_t r = threadIdx.x; r < N; r += blockDim.x) n += static_cast<int64_t>(targets[r]) != ignore_index;
  for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = n;
  __syncthreads();
  n = 0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) n += scratch[w];
  }
  return n;
}

// loss[0] = Σ row_loss / (rows counted), 0 when none count. One block; the sum is in double, per
// thread in row order and then across threads in a fixed order. Bytes: 4 per row plus the targets.
template <class I>
__global__ void __launch_bounds__(kTotalThreads)
    cross_entropy_mean_kernel(const float* __restrict__ row_loss, const I* __restrict__ targets, int64_t N,
                              int64_t ignore_index, float* __restrict__ loss) {
  __shared__ double partial[kTotalThreads];
  double total = 0;
  for (int64_t r = threadIdx.x; r < N; r += blockDim.x) total += row_loss[r];
  partial[threadIdx.x] = total;
  const long long counted = count_counted_rows(targets, N, ignore_index);  // synchronises the block
  if (threadIdx.x != 0) return;
  total = 0;
  for (int t = 0; t < static_cast<int>(blockDim.x); ++t) total += partial[t];
  loss[0] = counted == 0 ? 0.f : static_cast<float>(total / static_cast<double>(counted));
}

// scale[0] = dloss / (rows counted), 0 when none count; rounded once to f32 as the CPU does.
template <class I, class D>
__global__ void __launch_bounds__(kTotalThreads)
    cross_entropy_grad_scale_kernel(const I* __restrict__ targets, int64_t N, int64_t ignore_index,
                                    const D* __restrict__ dloss, float* __restrict__ scale) {
  const long long counted = count_counted_rows(targets, N, ignore_index);
  if (threadIdx.x != 0) return;
  double d;
  if constexpr (std::is_same_v<D, double>) d = dloss[0];
  else d = static_cast<double>(to_float(dloss[0]));
  scale[0] = counted == 0 ? 0.f : static_cast<float>(d / static_cast<double>(counted));
}

// dlogits per row (one warp): scale · (exp(z - lse) - q). Bytes: reads logits, writes dlogits.
template <class T, class I>
__global__ void cross_entropy_backward_kernel(const T* __restrict__ logits, const I* __restrict__ targets,
                                              const float* __restrict__ lse, const float* __restrict__ scale,
                                              T* __restrict__ dlogits, int64_t N, int64_t C, float label_smoothing,
                                              int64_t ignore_index) {
  const int64_t r = int64_t{blockIdx.x} * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= N) return;
  const T* z = logits + r * C;
  T* dz = dlogits + r * C;
  const int64_t t = static_cast<int64_t>(targets[r]);
  if (t == ignore_index) {
    for (int64_t c = lane; c < C; c += 32) dz[c] = from_float<T>(0.f);
    return;
  }
  const float grad_scale = t < 0 || t >= C ? NAN : scale[0];
  const float row_lse = lse[r];
  const float smooth_per_class = label_smoothing / static_cast<float>(C);
  for (int64_t c = lane; c < C; c += 32) {
    const float q = smooth_per_class + (c == t ? 1.f - label_smoothing : 0.f);
    dz[c] = from_float<T>(grad_scale * (expf(to_float(z[c]) - row_lse) - q));
  }
}

// Calls f.template operator()<I>() with the targets' index type.
template <class F>
void with_index_type(const Tensor& targets, F&& f) {
  if (targets.dtype() == DType::i64) return f.template operator()<int64_t>();
  f.template operator()<int32_t>();
}

}  // namespace

CrossEntropyOutput cross_entropy_forward(const Tensor& logits, const Tensor& targets, double label_smoothing,
                                         int64_t ignore_index) {
  constexpr const char* op = "cross_entropy_forward";
  const int64_t N = logits.size(0), C = logits.size(1);
  Tensor loss = empty(Shape{}, DType::f32, logits.device()), lse = empty({N}, DType::f32, logits.device());
  const Tensor row_loss = empty({N}, DType::f32, logits.device());
  cudaStream_t stream = stream_for(logits);
  dispatch_floating(logits.dtype(), op, [&]<class T>() {
    with_index_type(targets, [&]<class I>() {
      if (N > 0) {
        cross_entropy_rows_kernel<T, I><<<row_blocks(N), kRowThreads, 0, stream>>>(
            ptr<T>(logits), static_cast<const I*>(targets.data_ptr()), ptr<float>(lse), ptr<float>(row_loss), N, C,
            static_cast<float>(label_smoothing), ignore_index);
        check_launch(op);
      }
      cross_entropy_mean_kernel<I><<<1, kTotalThreads, 0, stream>>>(
          ptr<float>(row_loss), static_cast<const I*>(targets.data_ptr()), N, ignore_index, ptr<float>(loss));
      check_launch(op);
    });
  });
  return {loss, lse};
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dloss,
                              double label_smoothing, int64_t ignore_index) {
  constexpr const char* op = "cross_entropy_backward";
  const int64_t N = logits.size(0), C = logits.size(1);
  Tensor dlogits = empty(logits.shape(), logits.dtype(), logits.device());
  if (N == 0) return dlogits;
  const Tensor scale = empty({1}, DType::f32, logits.device());
  cudaStream_t stream = stream_for(logits);
  dispatch_floating(logits.dtype(), op, [&]<class T>() {
    with_index_type(targets, [&]<class I>() {
      const I* t = static_cast<const I*>(targets.data_ptr());
      auto launch_scale = [&]<class D>() {
        cross_entropy_grad_scale_kernel<I, D><<<1, kTotalThreads, 0, stream>>>(
            t, N, ignore_index, static_cast<const D*>(dloss.data_ptr()), ptr<float>(scale));
      };
      if (dloss.dtype() == DType::f64) launch_scale.template operator()<double>();
      else dispatch_floating(dloss.dtype(), op, launch_scale);
      check_launch(op);
      cross_entropy_backward_kernel<T, I><<<row_blocks(N), kRowThreads, 0, stream>>>(
          ptr<T>(logits), t, ptr<float>(lse), ptr<float>(scale), ptr<T>(dlogits), N, C,
          static_cast<float>(label_smoothing), ignore_index);
      check_launch(op);
    });
  });
  return dlogits;
}

}  // namespace octet::kernels::cuda
