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

#include "kernels/attention_layout.h"
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
RowStorage row_storage(int64_t fixed_floats, int64_t row_floats, int64_t rows, int64_t head_dim, const Tensor& like,
                       const char* op) {
  const size_t fixed_bytes = static_cast<size_t>(fixed_floats) * sizeof(float);
  OCTET_CHECK(fixed_bytes <= kDynamicSharedBytes, op, ": head dim ", head_dim,
              " is too large for the unfused GPU attention kernel (", like.describe(), ")");
  const size_t row_bytes = static_cast<size_t>(row_floats) * sizeof(float);
  if (fixed_bytes + row_bytes <= kDynamicSharedBytes) return {fixed_bytes + row_bytes, Tensor()};
  return {fixed_bytes, empty({rows, row_floats}, DType::f32, like.device())};
}

unsigned row_blocks(int64_t rows, const char* op) {
  OCTET_CHECK(rows <= 0x7fffffff, op, ": ", rows, " rows are more than one grid holds");
  return static_cast<unsigned>(rows);
}

// Operand strides (kernels/attention_layout.h): q and dq use `qs`; k, v, dk and dv `ks`; out and
// dout `os`. Rows are numbered head-major, row = (b·H + h)·S + i, whatever the memory layout.
struct Strides {
  HeadStrides qs, ks, os;
  int64_t heads;
};

// Forward, one block per query row i of head h:
//   x_j = scale·(q_i·k_j),  lse_i = max_j x_j + log Σ_j exp(x_j − max),  out_i = Σ_j exp(x_j − lse_i)·v_j
// Moves: q, out and lse once (S·D + S·D + S elements per head) and k, v once per query row
// (2·S·Sk·D element reads per head, mostly from L2).
template <class T>
__global__ void attention_forward_rows(const T* q, const T* k, const T* v, T* out, float* lse, Strides st, int64_t s,
                                       int64_t sk, int64_t d, float scale, float* scratch) {
  extern __shared__ float shared[];
  __shared__ float reduce_scratch[32];
  const int64_t row = blockIdx.x;
  const int64_t head = row / s, i = row % s;
  float* q_row = shared;
  float* scores = scratch != nullptr ? scratch + row * sk : shared + d;
  const T* q_i = q + st.qs.head_offset(head, st.heads) + i * st.qs.row;
  const T* k_head = k + st.ks.head_offset(head, st.heads);
  const T* v_head = v + st.ks.head_offset(head, st.heads);
  T* out_i = out + st.os.head_offset(head, st.heads) + i * st.os.row;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) q_row[c] = to_float(q_i[c]);
  __syncthreads();

  float local_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < sk; j += blockDim.x) {
    const T* k_row = k_head + j * st.ks.row;
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
    for (int64_t j = 0; j < sk; ++j) acc += scores[j] * to_float(v_head[j * st.ks.row + c]);
    out_i[c] = from_float<T>(acc * inv_sum);
  }
}

// δ_i = Σ_c dout_ic·out_ic, one warp per row. Moves 2·S·D elements in, S floats out, per head.
template <class T>
__global__ void attention_delta_rows(const T* dout, const T* out, float* delta, Strides st, int64_t rows, int64_t s,
                                     int64_t d) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; row < rows; row += warps) {
    const int64_t at = st.os.head_offset(row / s, st.heads) + (row % s) * st.os.row;
    float acc = 0.f;
    for (int64_t c = lane; c < d; c += 32) acc += to_float(dout[at + c]) * to_float(out[at + c]);
    acc = warp_sum(acc);
    if (lane == 0) delta[row] = acc;
  }
}

// dq, one block per query row i of head h:
//   dS_ij = P_ij·(dout_i·v_j − δ_i) with P_ij = exp(scale·q_i·k_j − lse_i),   dq_i = scale·Σ_j dS_ij·k_j
// Moves: q, dout, dq once (3·S·D per head) and k twice and v once per query row (3·S·Sk·D reads).
template <class T>
__global__ void attention_dq_rows(const T* dout, const T* q, const T* k, const T* v, const float* lse,
                                  const float* delta, T* dq, Strides st, int64_t s, int64_t sk, int64_t d, float scale,
                                  float* scratch) {
  extern __shared__ float shared[];
  const int64_t row = blockIdx.x;
  const int64_t head = row / s, i = row % s;
  float* q_row = shared;
  float* dout_row = shared + d;
  float* ds = scratch != nullptr ? scratch + row * sk : shared + 2 * d;
  const int64_t q_at = st.qs.head_offset(head, st.heads) + i * st.qs.row;
  const T* dout_i = dout + st.os.head_offset(head, st.heads) + i * st.os.row;
  const T* k_head = k + st.ks.head_offset(head, st.heads);
  const T* v_head = v + st.ks.head_offset(head, st.heads);
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    q_row[c] = to_float(q[q_at + c]);
    dout_row[c] = to_float(dout_i[c]);
  }
  __syncthreads();
  const float row_lse = lse[row];
  const float row_delta = delta[row];
  for (int64_t j = threadIdx.x; j < sk; j += blockDim.x) {
    const T* k_row = k_head + j * st.ks.row;
    const T* v_row = v_head + j * st.ks.row;
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
    for (int64_t j = 0; j < sk; ++j) acc += ds[j] * to_float(k_head[j * st.ks.row + c]);
    dq[q_at + c] = from_float<T>(acc * scale);
  }
}

// dk and dv, one block per key row j of head h (the same P_ij and dS_ij, recomputed by column):
//   dv_j = Σ_i P_ij·dout_i,   dk_j = scale·Σ_i dS_ij·q_i
// Moves: k, v, dk, dv once (4·Sk·D per head) and q, dout twice per key row (4·S·Sk·D reads).
template <class T>
__global__ void attention_dkdv_rows(const T* dout, const T* q, const T* k, const T* v, const float* lse,
                                    const float* delta, T* dk, T* dv, Strides st, int64_t s, int64_t sk, int64_t d,
                                    float scale, float* scratch) {
  extern __shared__ float shared[];
  const int64_t row = blockIdx.x;  // key row j of head `head`
  const int64_t head = row / sk, j = row % sk;
  float* k_row = shared;
  float* v_row = shared + d;
  float* p = scratch != nullptr ? scratch + row * 2 * s : shared + 2 * d;
  float* ds = p + s;
  const T* q_head = q + st.qs.head_offset(head, st.heads);
  const T* dout_head = dout + st.os.head_offset(head, st.heads);
  const float* lse_head = lse + head * s;
  const float* delta_head = delta + head * s;
  const int64_t kv_at = st.ks.head_offset(head, st.heads) + j * st.ks.row;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
    k_row[c] = to_float(k[kv_at + c]);
    v_row[c] = to_float(v[kv_at + c]);
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < s; i += blockDim.x) {
    const T* q_row = q_head + i * st.qs.row;
    const T* dout_row = dout_head + i * st.os.row;
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
      acc_v += p[i] * to_float(dout_head[i * st.os.row + c]);
      acc_k += ds[i] * to_float(q_head[i * st.qs.row + c]);
    }
    dv[kv_at + c] = from_float<T>(acc_v);
    dk[kv_at + c] = from_float<T>(acc_k * scale);
  }
}

// The forward over operands already placed: q, k, v in, out and lse out.
void launch_forward(const Tensor& like, const void* q, const void* k, const void* v, void* out, float* lse,
                    const AttentionDims& z, const Strides& st, double scale, const char* op) {
  const int64_t rows = z.b * z.h * z.s;
  if (rows == 0 || z.d == 0) return;
  const RowStorage storage = row_storage(z.d, z.sk, rows, z.d, like, op);
  const cudaStream_t stream = stream_for(like);
  dispatch_floating(like.dtype(), op, [&]<class T>() {
    attention_forward_rows<T><<<row_blocks(rows, op), kRowThreads, storage.shared_bytes, stream>>>(
        static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v), static_cast<T*>(out), lse, st,
        z.s, z.sk, z.d, static_cast<float>(scale), storage.scratch_ptr());
  });
  check_launch(op);
}

// The backward over operands already placed; dq, dk and dv are written (when there are queries).
void launch_backward(const Tensor& like, const void* dout, const void* q, const void* k, const void* v,
                     const void* out, const float* lse, void* dq, void* dk, void* dv, const AttentionDims& z,
                     const Strides& st, double scale, const char* op) {
  const int64_t query_rows = z.b * z.h * z.s, key_rows = z.b * z.h * z.sk;
  if (query_rows == 0 || key_rows == 0 || z.d == 0) return;
  const cudaStream_t stream = stream_for(like);
  Tensor delta = empty({z.b, z.h, z.s}, DType::f32, like.device());
  const RowStorage dq_storage = row_storage(2 * z.d, z.sk, query_rows, z.d, like, op);
  const RowStorage dkdv_storage = row_storage(2 * z.d, 2 * z.s, key_rows, z.d, like, op);
  const float scale_f = static_cast<float>(scale);
  dispatch_floating(like.dtype(), op, [&]<class T>() {
    const T* dout_t = static_cast<const T*>(dout);
    const T* q_t = static_cast<const T*>(q);
    const T* k_t = static_cast<const T*>(k);
    const T* v_t = static_cast<const T*>(v);
    attention_delta_rows<T><<<blocks_for(query_rows * 32), kThreads, 0, stream>>>(
        dout_t, static_cast<const T*>(out), ptr<float>(delta), st, query_rows, z.s, z.d);
    attention_dq_rows<T><<<row_blocks(query_rows, op), kRowThreads, dq_storage.shared_bytes, stream>>>(
        dout_t, q_t, k_t, v_t, lse, ptr<float>(delta), static_cast<T*>(dq), st, z.s, z.sk, z.d, scale_f,
        dq_storage.scratch_ptr());
    attention_dkdv_rows<T><<<row_blocks(key_rows, op), kRowThreads, dkdv_storage.shared_bytes, stream>>>(
        dout_t, q_t, k_t, v_t, lse, ptr<float>(delta), static_cast<T*>(dk), static_cast<T*>(dv), st, z.s, z.sk, z.d,
        scale_f, dkdv_storage.scratch_ptr());
  });
  check_launch(op);
}

}  // namespace

AttentionOutput unfused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  constexpr const char* op = "attention_forward (unfused, cuda)";
  const AttentionDims z{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
  Tensor out = empty(q.shape(), q.dtype(), q.device());
  Tensor lse = empty({z.b, z.h, z.s}, DType::f32, q.device());
  const Strides st{query_strides(AttentionLayout::kBhsd, z), key_strides(AttentionLayout::kBhsd, z),
                   output_strides(AttentionLayout::kBhsd, z), z.h};
  launch_forward(q, q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), ptr<float>(lse), z, st, scale, op);
  return {out, lse};
}

AttentionGrads unfused_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor& out, const Tensor& lse, double scale) {
  constexpr const char* op = "attention_backward (unfused, cuda)";
  const AttentionDims z{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
  Tensor dq = empty(q.shape(), q.dtype(), q.device());
  Tensor dk = empty(k.shape(), q.dtype(), q.device());
  Tensor dv = empty(v.shape(), q.dtype(), q.device());
  if (z.b * z.h * z.sk == 0 || z.d == 0) return {dq, dk, dv};
  if (z.s == 0) {  // no queries: nothing flows to k and v
    const cudaStream_t stream = stream_for(q);
    octet::cuda::check(cudaMemsetAsync(dk.data_ptr(), 0, dk.nbytes(), stream), op);
    octet::cuda::check(cudaMemsetAsync(dv.data_ptr(), 0, dv.nbytes(), stream), op);
    return {dq, dk, dv};
  }
  const Strides st{query_strides(AttentionLayout::kBhsd, z), key_strides(AttentionLayout::kBhsd, z),
                   output_strides(AttentionLayout::kBhsd, z), z.h};
  launch_backward(q, dout.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), ptr<float>(lse),
                  dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), z, st, scale, op);
  return {dq, dk, dv};
}

AttentionOutput unfused_packed_attention_forward(const Tensor& qkv, double scale) {
  constexpr const char* op = "packed_attention_forward (unfused, cuda)";
  const AttentionDims z{qkv.size(0), qkv.size(3), qkv.size(1), qkv.size(1), qkv.size(4)};
  Tensor out = empty({z.b, z.s, z.h, z.d}, qkv.dtype(), qkv.device());
  Tensor lse = empty({z.b, z.h, z.s}, DType::f32, qkv.device());
  const HeadStrides qs = query_strides(AttentionLayout::kPacked, z);
  const Strides st{qs, qs, output_strides(AttentionLayout::kPacked, z), z.h};
  const size_t elem = dtype_size(qkv.dtype());
  const char* base = static_cast<const char*>(qkv.data_ptr());
  launch_forward(qkv, base, base + packed_k_offset(z) * elem, base + packed_v_offset(z) * elem, out.data_ptr(),
                 ptr<float>(lse), z, st, scale, op);
  return {out, lse};
}

Tensor unfused_packed_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                         double scale) {
  constexpr const char* op = "packed_attention_backward (unfused, cuda)";
  const AttentionDims z{qkv.size(0), qkv.size(3), qkv.size(1), qkv.size(1), qkv.size(4)};
  Tensor dqkv = empty(qkv.shape(), qkv.dtype(), qkv.device());
  const HeadStrides qs = query_strides(AttentionLayout::kPacked, z);
  const Strides st{qs, qs, output_strides(AttentionLayout::kPacked, z), z.h};
  const size_t elem = dtype_size(qkv.dtype());
  const char* base = static_cast<const char*>(qkv.data_ptr());
  char* grad = static_cast<char*>(dqkv.data_ptr());
  // S = Sk here, so with any query every element of dqkv is some head's row of dq, dk or dv.
  launch_backward(qkv, dout.data_ptr(), base, base + packed_k_offset(z) * elem, base + packed_v_offset(z) * elem,
                  out.data_ptr(), ptr<float>(lse), grad, grad + packed_k_offset(z) * elem,
                  grad + packed_v_offset(z) * elem, z, st, scale, op);
  return dqkv;
}

}  // namespace octet::kernels::cuda
