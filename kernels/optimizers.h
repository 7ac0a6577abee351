#pragma once
// Fused optimizer updates: one pass per parameter reads the gradient and the optimizer state and
// writes the new parameter and state in place. Parameters and state are f32 (the master weights;
// f64 for references and tests); the gradient is the parameter's dtype or, for an f32 parameter,
// bf16, widened on the fly instead of through a converted copy. Hyperparameters arrive as doubles
// and are rounded once to the compute type, as PyTorch's fused kernels do.
//
// Each op takes a list of parameters updated by one call: on the GPU one kernel launch covers up to
// 512 tensors (a whole ViT-H/16), as apex's multi_tensor_apply does. It also takes low-precision
// parameters with an f32 master copy (bf16 training). Both run on the CPU and on CUDA devices.
//
// Bytes moved per element (f32): AdamW reads p, g, m, v and writes p, m, v: 28 bytes;
// SGD with momentum reads p, g, buf and writes p, buf: 20 bytes. With a bf16 param and f32 master,
// AdamW reads g (2), master, m, v and writes master, m, v and the bf16 param (2): 28 bytes; SGD
// reads g (2), master, buf and writes master, buf and the param (2): 20 bytes, 16 on the first step
// (which writes buf without reading it). Never the bf16 param: the master is the value updated.
#include <cfloat>
#include <cstdint>
#include <vector>

#include "core/hostdevice.h"
#include "core/tensor.h"

namespace octet::kernels {

// One parameter's tensors for a step. `param` is what the model computes with. When it is not f32
// (bf16 training), `master` is its f32 master copy: the update is applied to master and param
// receives master rounded to param's dtype in the same pass. When param is f32 (or f64), master is
// undefined and param is updated in place. grad has param's dtype, or bf16 for an f32 param without
// master (widened on the fly); state has param's shape, in f32 (f64 for f64); start it at zero.
// All tensors of one call share a device; the entries are updated independently of each other.

// AdamW (Loshchilov & Hutter; PyTorch's torch.optim.AdamW), for the `step`-th update (from 1):
//   p ← p · (1 - lr·weight_decay)                     (decoupled decay, before the moment update)
//   m ← beta1·m + (1 - beta1)·g
//   v ← beta2·v + (1 - beta2)·g²
//   p ← p - lr / (1 - beta1^step) · m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// with m = exp_avg and v = exp_avg_sq.
struct AdamWTensors {
  Tensor param, grad, exp_avg, exp_avg_sq, master;
};
void adamw_step_multi_(const std::vector<AdamWTensors>& tensors, double lr, double beta1, double beta2,
                       double eps, double weight_decay, int64_t step);

// SGD with momentum (PyTorch's torch.optim.SGD):
//   d ← g + weight_decay·p
//   with momentum: buf ← d on the first step, else momentum·buf + (1 - dampening)·d;
//                  d ← d + momentum·buf (nesterov) or d ← buf
//   p ← p - lr·d
struct SgdTensors {
  Tensor param, grad, momentum_buffer, master;  // momentum_buffer undefined when momentum == 0
};
void sgd_step_multi_(const std::vector<SgdTensors>& tensors, double lr, double momentum, double dampening,
                     bool nesterov, double weight_decay, bool first_step);

// Σ t², accumulated in double over fixed blocks of elements and then the block sums in order, so the
// result is bitwise the same for any thread count. Any floating dtype. Read on the host: a host sync
// (core/host_sync.h), for tests and logging.
double sum_of_squares(const Tensor& t);

// Σ over all tensors of Σ t², in double, deterministic for any thread count (CPU) / for a fixed
// list of tensors (GPU: fixed chunks, fixed reduction order). sum_of_squares_multi_tensor leaves the
// total on `device`, the tensors' device, as a one-element f64 tensor (shape []): nothing is read on
// the host, so a GPU step does not wait for it. An empty list gives 0. sum_of_squares_multi reads
// that tensor on the host (one host sync).
Tensor sum_of_squares_multi_tensor(const std::vector<Tensor>& tensors, Device device);
double sum_of_squares_multi(const std::vector<Tensor>& tensors);

// The f32 master copies of low-precision parameters, made in one call: destinations[i] ←
// sources[i] widened to f32, exactly (bit for bit Tensor::to(DType::f32)). Sources are bf16 or f16,
// destinations f32 of the same shape; all on one device, no two sharing bytes. An optimizer's first
// bf16 step makes every master this way: on a GPU one launch instead of one conversion per tensor.
void widen_to_f32_multi_(const std::vector<Tensor>& sources, const std::vector<Tensor>& destinations);

// ---- gradient-norm clipping on the device -----------------------------------------------------------------

// torch.nn.utils.clip_grad_norm_'s coefficient, min(1, max_norm / (norm + 1e-6)), in double. A
// non-finite norm (an inf or NaN gradient) gives 1: the gradients stay as they are, where torch
// would scale them into NaNs or zeros. The host and the device compute it from this one source, each
// step one correctly rounded double operation (explicit _rn intrinsics on the device).
OCTET_HD double clip_coefficient(double norm, double max_norm) {
  if (!(norm <= DBL_MAX)) return 1.0;  // inf, and NaN, which fails every comparison
#if defined(__CUDA_ARCH__)
  const double coef = __ddiv_rn(max_norm, __dadd_rn(norm, 1e-6));
#else
  const double coef = max_norm / (norm + 1e-6);
#endif
  return coef < 1.0 ? coef : 1.0;
}

// From a total sum of squares (a one-element f64 tensor, on any device), on its device: the norm
// √sum_of_squares (correctly rounded, std::sqrt's bits) and clip_coefficient(norm, max_norm), each a
// one-element f64 tensor (shape []). One single-thread launch on a GPU; nothing is read on the host.
struct ClipScalars {
  Tensor norm, coef;
};
ClipScalars clip_scalars(const Tensor& sum_of_squares, double max_norm);

// t ← t · scale for every tensor of the list, in place, where `scale` is a one-element f32 or f64
// tensor on their device that the kernels read (the host never does). Each element computes as
// mul_scalar_ does: widened to its compute type (f32, f64 for f64), times the scale rounded once to
// that type, rounded once back. f32, bf16, f16 and f64 tensors; one call takes any mix of them. On a
// GPU, one multi-tensor launch per dtype in the list (and per 512 tensors, as the optimizer
// updates). A scale of exactly 1 writes nothing (x · 1 is x).
void scale_multi_(const std::vector<Tensor>& tensors, const Tensor& scale);

}  // namespace octet::kernels
