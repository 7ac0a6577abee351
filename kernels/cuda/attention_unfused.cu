// Unfused attention on the GPU: the path for what cuDNN's fused kernels do not take (f32 tensors,
// head dims above 128 or not a multiple of 8) and for A/B runs with OCTET_DISABLE_CUDNN_ATTENTION=1.
//
// Same mathematics and precision as the CPU reference (kernels/cpu/attention.cpp): inputs widen to
// f32, everything is computed in f32, each output is rounded once to the input dtype; lse is the
// natural-log log-sum-exp of each row of scale·q·kᵀ, f32 [B, H, S].
//
// One block owns one output row and recomputes its scores from q, k and v, so the S×Sk matrix never
// goes to memory (its row sits in shared memory, or in a global scratch row when a row is larger
// than shared memory allows). The k and v rows every block reads come mostly from L2. This is
// simple rather than fast; the fused cuDNN path is the fast one.
#include <cstdint>

#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/common.cuh"

namespace octet::kernels::cuda {

namespace {

constexpr int kRowThreads = 128;
// Dynamic shared memory a block takes: a block gets 48 KiB without opting in to more, and the
// kernels' own static shared memory (the reduction scratch) comes out of the same 48 KiB.
constexpr size_t kDynamicSharedBytes = 46 * 1024;

// Where each block keeps its row of `row_floats` f32 scores: in shared memory after `fixed_floats`
// staged input rows when it fits, else in a global buffer of one row per block.
struct RowStorage {
  size_t shared_bytes;
  Tensor scratch;  // undefined when the rows live in shared memory
  float* scratch_ptr() const { return scratch.defined() ? static_cast<float*>(scratch.data_ptr()) : nullptr; }
};
RowStorage row_storage(int64_t fixed_floats, int64_t row_floats, int64_t rows, const Tensor& like, const char* op) {
  const size_t fixed_bytes = static_cast<size_t>(fixed_floats) * sizeof(float);
  OCTET_CHECK(fixed_bytes <= kDynamicSharedBytes, op, ": head dim ", like.size(3),
              " is too large for the unfused GPU attention kernel (", like.describe(), ")");
  const size_t row_bytes = static_cast<size_t>(row_floats) * sizeof(float);
  if (fixed_bytes + row_bytes <= kDynamicSharedBytes) return {fixed_bytes + row_bytes, Tensor()};
  return {fixed_bytes, empty({rows, row_floats}, DType::f32, like.device())};
}

unsigned row_blocks(int64_t rows, const char* op) {
  OCTET_CHECK(rows <= 0x7fffffff, op, ": ", rows, " rows are more than one grid holds");
  return static_cast<unsigned>(rows);
}

// Forward, one block per query row i of head h:
//   x_j = scale·(q_i·k_j),  lse_i = max_j x_j + log Σ_j exp(x_j − max),  out_i = Σ_j exp(x_j − lse_i)·v_j
// Moves: q, out and lse once (S·D + S·D + S elements per head) and k, v once per query row
// (2·S·Sk·D element reads per head, mostly from L2).
template <class T>
__global__ void attention_forward_rows(const T* q, const T* k, const T* v, T* out, float* lse, int64_t s, int64_t sk,
                                       int64_t d, float scale, float* scratch) {
  extern __shared__ float shared[];
  __shared__ float reduce_scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t head = row / s;
  float* q_row = shared;
  float* scores = scratch != nullptr ? scratch + row * sk : shared + d;
  const T* k_head = k + head * sk * d;
  const T* v_head = v + head * sk * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) q_row[c] = to_float(q[row * d + c]);
  __syncthreads();

  float local_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < sk; j += blockDim.x) {
    const T* k_row = k_head + j * d;
    float dot = 0.f;
    for (int64_t c = 0; c < d; ++c) dot += q_row[c] * to_float(k_row[c]);
    scores[j] = dot * scale;
    local_max = fmaxf(local_max, scores[j]);
  }
  const float row_max = block_max(local_max, reduce_scratch);
  float local_sum = 0.f;
  for (int64_t j = threadIdx.x; j < sk; j += blockDim.x) {
    const float e = expf(scores[j] - row_max);
    scores[j] = e;
    local_sum += e;
  }
  const float sum = block_sum(local_sum, reduce_scratch);  // its barriers also publish scores[]
  if (threadIdx.x == 0) lse[row] = row_max + logf(sum);
  const float inv_sum = 1.f / sum;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < sk; ++j) acc += scores[j] * to_float(v_head[j * d + c]);
    out[row * d + c] = from_float<T>(acc * inv_sum);
  }
}

// δ_i = Σ_c dout_ic·out_ic, one warp per row. Moves 2·S·D elements in, S floats out, per head.
template <class T>
__global__ void attention_delta_rows(const T* dout, const T* out, float* delta, int64_t rows, int64_t d) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; row < rows; row += warps) {
    float acc = 0.f;
    for (int64_t c = lane; c < d; c += 32) acc += to_float(dout[row * d + c]) * to_float(out[row * d + c]);
    acc = warp_sum(acc);
    if (lane == 0) delta[row] = acc;
  }
}

// dq, one block per query row i of head h:
//   dS_ij = P_ij·(dout_i·v_j − δ_i) with P_ij = exp(scale·q_i·k_j − lse_i),   dq_i = scale·Σ_j dS_ij·k_j
// Moves: q, dout, dq once (3·S·D per head) and k twice and v once per query row (3·S·Sk·D reads).
template <class T>
__global__ void attention_dq_rows(const T* dout, const T* q, const T* k, const T* v, const float* lse,
                                  const float* delta, T* dq, int64_t s, int64_t sk, int64_t d, float scale,
                                  float* scratch) {
  extern __shared__ float shared[];
  const int64_t row = blockIdx.x;
  const int64_t head = row / s;
  float* q_row = shared;
  float* dout_row = shared + d;
  float* ds = scratch != nullptr ? scratch + row * sk : shared + 2 * d;
  const T* k_head = k + head * sk * d;
  const T* v_head = v + head * sk * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    q_row[c] = to_float(q[row * d + c]);
    dout_row[c] = to_float(dout[row * d + c]);
  }
  __syncthreads();
  const float row_lse = lse[row];
  const float row_delta = delta[row];
  for (int64_t j = threadIdx.x; j < sk; j += blockDim.x) {
    const T* k_row = k_head + j * d;
    const T* v_row = v_head + j * d;
    float qk = 0.f, dp = 0.f;
    for (int64_t c = 0; c < d; ++c) {
      qk += q_row[c] * to_float(k_row[c]);
      dp += dout_row[c] * to_float(v_row[c]);
    }
    ds[j] = expf(qk * scale - row_lse) * (dp - row_delta);
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.f;
    for (int64_t j = 0; j < sk; ++j) acc += ds[j] * to_float(k_head[j * d + c]);
    dq[row * d + c] = from_float<T>(acc * scale);
  }
}

// dk and dv, one block per key row j of head h (the same P_ij and dS_ij, recomputed by column):
//   dv_j = Σ_i P_ij·dout_i,   dk_j = scale·Σ_i dS_ij·q_i
// Moves: k, v, dk, dv once (4·Sk·D per head) and q, dout twice per key row (4·S·Sk·D reads).
template <class T>
__global__ void attention_dkdv_rows(const T* dout, const T* q, const T* k, const T* v, const float* lse,
                                    const float* delta, T* dk, T* dv, int64_t s, int64_t sk, int64_t d, float scale,
                                    float* scratch) {
  extern __shared__ float shared[];
  const int64_t row = blockIdx.x;  // key row of head `head`
  const int64_t head = row / sk;
  float* k_row = shared;
  float* v_row = shared + d;
  float* p = scratch != nullptr ? scratch + row * 2 * s : shared + 2 * d;
  float* ds = p + s;
  const T* q_head = q + head * s * d;
  const T* dout_head = dout + head * s * d;
  const float* lse_head = lse + head * s;
  const float* delta_head = delta + head * s;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    k_row[c] = to_float(k[row * d + c]);
    v_row[c] = to_float(v[row * d + c]);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < s; i += blockDim.x) {
    const T* q_row = q_head + i * d;
    const T* dout_row = dout_head + i * d;
    float qk = 0.f, dp = 0.f;
    for (int64_t c = 0; c < d; ++c) {
      qk += k_row[c] * to_float(q_row[c]);
      dp += v_row[c] * to_float(dout_row[c]);
    }
    p[i] = expf(qk * scale - lse_head[i]);
    ds[i] = p[i] * (dp - delta_head[i]);
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    float acc_v = 0.f, acc_k = 0.f;
    for (int64_t i = 0; i < s; ++i) {
      acc_v += p[i] * to_float(dout_head[i * d + c]);
      acc_k += ds[i] * to_float(q_head[i * d + c]);
    }
    dv[row * d + c] = from_float<T>(acc_v);
    dk[row * d + c] = from_float<T>(acc_k * scale);
  }
}

}  // namespace

AttentionOutput unfused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  constexpr const char* op = "attention_forward (unfused, cuda)";
  const int64_t b = q.size(0), h = q.size(1), s = q.size(2), d = q.size(3), sk = k.size(2);
  Tensor out = empty(q.shape(), q.dtype(), q.device());
  Tensor lse = empty({b, h, s}, DType::f32, q.device());
  const int64_t rows = b * h * s;
  if (rows == 0 || d == 0) return {out, lse};
  const RowStorage storage = row_storage(d, sk, rows, q, op);
  const cudaStream_t stream = stream_for(q);
  dispatch_floating(q.dtype(), op, [&]<class T>() {
    attention_forward_rows<T><<<row_blocks(rows, op), kRowThreads, storage.shared_bytes, stream>>>(
        ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<T>(out), ptr<float>(lse), s, sk, d, static_cast<float>(scale),
        storage.scratch_ptr());
  });
  check_launch(op);
  return {out, lse};
}

AttentionGrads unfused_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& out, const Tensor& lse, double scale) {
  constexpr const char* op = "attention_backward (unfused, cuda)";
  const int64_t b = q.size(0), h = q.size(1), s = q.size(2), d = q.size(3), sk = k.size(2);
  Tensor dq = empty(q.shape(), q.dtype(), q.device());
  Tensor dk = empty(k.shape(), q.dtype(), q.device());
  Tensor dv = empty(v.shape(), q.dtype(), q.device());
  const int64_t query_rows = b * h * s, key_rows = b * h * sk;
  if (key_rows == 0 || d == 0) return {dq, dk, dv};
  const cudaStream_t stream = stream_for(q);
  if (query_rows == 0) {  // no queries: nothing flows to k and v
    octet::cuda::check(cudaMemsetAsync(dk.data_ptr(), 0, dk.nbytes(), stream), op);
    octet::cuda::check(cudaMemsetAsync(dv.data_ptr(), 0, dv.nbytes(), stream), op);
    return {dq, dk, dv};
  }
  Tensor delta = empty({b, h, s}, DType::f32, q.device());
  const RowStorage dq_storage = row_storage(2 * d, sk, query_rows, q, op);
  const RowStorage dkdv_storage = row_storage(2 * d, 2 * s, key_rows, q, op);
  const float scale_f = static_cast<float>(scale);
  dispatch_floating(q.dtype(), op, [&]<class T>() {
    attention_delta_rows<T><<<blocks_for(query_rows * 32), kThreads, 0, stream>>>(ptr<T>(dout), ptr<T>(out), ptr<float>(delta),
                                                                    query_rows, d);
    attention_dq_rows<T><<<row_blocks(query_rows, op), kRowThreads, dq_storage.shared_bytes, stream>>>(
        ptr<T>(dout), ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<float>(lse), ptr<float>(delta), ptr<T>(dq), s, sk, d,
        scale_f, dq_storage.scratch_ptr());
    attention_dkdv_rows<T><<<row_blocks(key_rows, op), kRowThreads, dkdv_storage.shared_bytes, stream>>>(
        ptr<T>(dout), ptr<T>(q), ptr<T>(k), ptr<T>(v), ptr<float>(lse), ptr<float>(delta), ptr<T>(dk), ptr<T>(dv),
        s, sk, d, scale_f, dkdv_storage.scratch_ptr());
  });
  check_launch(op);
  return {dq, dk, dv};
}

}  // namespace octet::kernels::cuda
