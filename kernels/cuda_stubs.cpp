// The CUDA entry points of kernels/cuda/*_cuda.h in a build without CUDA (OCTET_CUDA=OFF): CMake
// compiles this file in place of kernels/cuda/. The checked entry points in kernels/*.cpp call these
// only for tensors on a CUDA device, so each one throws an error that names the op and its inputs
// and says how to get a CUDA build.
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/common.h"
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/elementwise_cuda.h"
#include "kernels/cuda/fp8_cuda.h"
#include "kernels/cuda/fp8_gemm_cuda.h"
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/cuda/nn_ops_cuda.h"
#include "kernels/cuda/optimizers_cuda.h"
#include "kernels/cuda/random_masks_cuda.h"
#include "kernels/cuda/reduce_cuda.h"
#include "kernels/cuda/shape_ops_cuda.h"

namespace octet::kernels::cuda {
namespace {

[[noreturn]] void no_cuda(const char* op, const std::string& inputs) {
  OCTET_FAIL(op, ": Octet was built without CUDA", inputs.empty() ? "" : " (" + inputs + ")",
             "; rebuild with OCTET_CUDA=ON (nvcc on PATH), or move the tensors to the cpu");
}
[[noreturn]] void no_cuda(const char* op, std::initializer_list<const Tensor*> tensors) {
  no_cuda(op, describe_all(tensors));
}
[[noreturn]] void no_cuda(const char* op, Device device) { no_cuda(op, "on " + device.str()); }

}  // namespace

// ---- attention_cuda.h ----

std::string cudnn_attention_unsupported_reason(const Tensor& q, const Tensor& k, const Tensor& v) {
  no_cuda("cudnn_attention_unsupported_reason", {&q, &k, &v});
}
std::optional<AttentionOutput> cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double,
                                                       std::string&) {
  no_cuda("cudnn_attention_forward", {&q, &k, &v});
}
std::optional<AttentionGrads> cudnn_attention_backward(const Tensor&, const Tensor& q, const Tensor& k, const Tensor& v,
                                                       const Tensor&, const Tensor&, double, std::string&) {
  no_cuda("cudnn_attention_backward", {&q, &k, &v});
}
size_t cudnn_attention_cached_plans() { no_cuda("cudnn_attention_cached_plans", ""); }
size_t cudnn_version() { no_cuda("cudnn_version", ""); }
AttentionOutput unfused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double) {
  no_cuda("unfused_attention_forward", {&q, &k, &v});
}
AttentionGrads unfused_attention_backward(const Tensor&, const Tensor& q, const Tensor& k, const Tensor& v,
                                          const Tensor&, const Tensor&, double) {
  no_cuda("unfused_attention_backward", {&q, &k, &v});
}
std::string cudnn_packed_attention_unsupported_reason(const Tensor& qkv) {
  no_cuda("cudnn_packed_attention_unsupported_reason", {&qkv});
}
std::optional<AttentionOutput> cudnn_packed_attention_forward(const Tensor& qkv, double, std::string&) {
  no_cuda("cudnn_packed_attention_forward", {&qkv});
}
std::optional<Tensor> cudnn_packed_attention_backward(const Tensor&, const Tensor& qkv, const Tensor&, const Tensor&,
                                                      double, std::string&) {
  no_cuda("cudnn_packed_attention_backward", {&qkv});
}
AttentionOutput unfused_packed_attention_forward(const Tensor& qkv, double) {
  no_cuda("unfused_packed_attention_forward", {&qkv});
}
Tensor unfused_packed_attention_backward(const Tensor&, const Tensor& qkv, const Tensor&, const Tensor&, double) {
  no_cuda("unfused_packed_attention_backward", {&qkv});
}

// ---- elementwise_cuda.h ----

Tensor binary(cpu::BinaryOp, const Tensor& a, const Tensor& b, const Shape&, const char* name) {
  no_cuda(name, {&a, &b});
}
Tensor unary(cpu::UnaryOp, const Tensor& a, const char* name) { no_cuda(name, {&a}); }
Tensor scalar(cpu::ScalarOp, const Tensor& a, double, const char* name) { no_cuda(name, {&a}); }
Tensor broadcast_to(const Tensor& a, const Shape&) { no_cuda("broadcast_to", {&a}); }
void add_(const Tensor& dst, const Tensor& src, double) { no_cuda("add_", {&dst, &src}); }
void mul_scalar_(const Tensor& dst, double) { no_cuda("mul_scalar_", {&dst}); }
void div_scalar_(const Tensor& dst, double) { no_cuda("div_scalar_", {&dst}); }

// ---- fp8_cuda.h, fp8_gemm_cuda.h ----

Fp8Cast fp8_cast(const Tensor& x, int64_t, int64_t, const Tensor& scale, const Tensor&, DType, bool, bool, int64_t) {
  no_cuda("fp8_cast", {&x, &scale});
}
Fp8CastWithBiasGrad fp8_cast_dbias(const Tensor& x, int64_t, int64_t, const Tensor& scale, const Tensor&, DType,
                                   bool, bool, int64_t, DType) {
  no_cuda("fp8_cast_dbias", {&x, &scale});
}
void fp8_amax_(const Tensor& x, const Tensor& amax) { no_cuda("fp8_amax_", {&x, &amax}); }
LayerNormFp8 layernorm_fp8_forward(const Tensor& x, const Tensor&, const Tensor&, const Tensor&, double,
                                   const Tensor& scale, const Tensor&, DType, bool, bool, int64_t) {
  no_cuda("layernorm_fp8_forward", {&x, &scale});
}
Fp8CastWithBiasGrad dgelu_fp8_cast_dbias(const Tensor& dact, const Tensor& x, int64_t, int64_t, GeluApproximation,
                                         const Tensor&, const Tensor&, DType, bool, bool, std::optional<DType>,
                                         int64_t) {
  no_cuda("dgelu_fp8_cast_dbias", {&dact, &x});
}
Fp8Cast gelu_fp8_forward(const Tensor& x, int64_t, int64_t, GeluApproximation, const Tensor& scale, const Tensor&,
                         DType, bool, bool, int64_t) {
  no_cuda("gelu_fp8_forward", {&x, &scale});
}
void fp8_update_scales_(const std::vector<Fp8ScalingTensors>& groups, float, AmaxCompute) {
  no_cuda("fp8_update_scales_", {&groups[0].amax_history});
}
void fp8_scale_from_amax_(const Tensor& amax, const Tensor& scale, const Tensor& scale_inv, DType, float) {
  no_cuda("fp8_scale_from_amax_", {&amax, &scale, &scale_inv});
}
void fp8_gemm(const Tensor& a, const Tensor&, const Tensor& b, const Tensor&, const Tensor& out, const Tensor&, bool,
              bool, const Tensor&) {
  no_cuda("fp8_gemm", {&a, &b, &out});
}

// ---- gemm_cuda.h ----

void gemm(const Tensor& a, bool, const Tensor& b, bool, const Tensor& c, const GemmProblem&, double, double) {
  no_cuda("gemm", {&a, &b, &c});
}
bool gemm_with_epilogue(const Tensor& a, bool, const Tensor& b, bool, const Tensor& c, const GemmProblem&, double,
                        double, const GemmEpilogueArgs&) {
  no_cuda("gemm_with_epilogue", {&a, &b, &c});
}

// ---- nn_ops_cuda.h ----

LayerNormOutput layernorm_forward(const Tensor& x, const Tensor&, const Tensor&, double) {
  no_cuda("layernorm_forward", {&x});
}
LayerNormGrads layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("layernorm_backward", {&dy, &x});
}
AddLayerNormOutput add_layernorm_forward(const Tensor& x, const Tensor& y, const Tensor&, const Tensor&, double) {
  no_cuda("add_layernorm_forward", {&x, &y});
}
AddLayerNormGrads add_layernorm_backward(const Tensor& dy_ln, const Tensor&, const Tensor& h, const Tensor&,
                                         const Tensor&, const Tensor&) {
  no_cuda("add_layernorm_backward", {&dy_ln, &h});
}
Tensor gelu_forward(const Tensor& x, GeluApproximation) { no_cuda("gelu_forward", {&x}); }
Tensor gelu_backward(const Tensor& dy, const Tensor& x, GeluApproximation) { no_cuda("gelu_backward", {&dy, &x}); }
GeluGradAndOutput gelu_backward_and_forward(const Tensor& dy, const Tensor& x, GeluApproximation, bool,
                                            std::optional<DType>) {
  no_cuda("gelu_backward_and_forward", {&dy, &x});
}
CrossEntropyOutput cross_entropy_forward(const Tensor& logits, const Tensor& targets, double, int64_t) {
  no_cuda("cross_entropy_forward", {&logits, &targets});
}
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor&, const Tensor&, double,
                              int64_t) {
  no_cuda("cross_entropy_backward", {&logits, &targets});
}
Tensor dropout_apply(const Tensor& in, double, uint64_t, uint64_t) { no_cuda("dropout_apply", {&in}); }

// ---- optimizers_cuda.h ----

void adamw_step_multi_(const std::vector<AdamWTensors>& tensors, const cpu::AdamWConstants<double>&) {
  no_cuda("adamw_step_multi_", {&tensors[0].param, &tensors[0].grad});
}
void sgd_step_multi_(const std::vector<SgdTensors>& tensors, const cpu::SgdConstants<double>&) {
  no_cuda("sgd_step_multi_", {&tensors[0].param, &tensors[0].grad});
}
Tensor sum_of_squares_multi(const std::vector<Tensor>&, Device device) { no_cuda("sum_of_squares_multi", device); }
void widen_to_f32_multi_(const std::vector<Tensor>& sources, const std::vector<Tensor>&) {
  no_cuda("widen_to_f32_multi_", {&sources[0]});
}
ClipScalars clip_scalars(const Tensor& sum_of_squares, double) { no_cuda("clip_scalars", {&sum_of_squares}); }
void scale_multi_(const std::vector<Tensor>&, const Tensor& scale) { no_cuda("scale_multi_", {&scale}); }

// ---- random_masks_cuda.h ----

void keep_mask(const Tensor& mask, double, uint64_t, uint64_t, uint64_t) { no_cuda("keep_mask", {&mask}); }

// ---- reduce_cuda.h ----

Tensor sum(const Tensor& a, int64_t, int64_t, int64_t, float, DType, const char* op) { no_cuda(op, {&a}); }
void max(const Tensor& a, int64_t, int64_t, int64_t, Tensor&, Tensor&) { no_cuda("max", {&a}); }
Tensor amax(const Tensor& a, int64_t, int64_t, int64_t) { no_cuda("amax", {&a}); }
Tensor softmax(const Tensor& a, int64_t, int64_t, int64_t, bool) { no_cuda("softmax", {&a}); }
Tensor softmax_backward(const Tensor& y, const Tensor& dy, int64_t, int64_t, int64_t, bool) {
  no_cuda("softmax_backward", {&y, &dy});
}

// ---- shape_ops_cuda.h ----

void permute(Device device, const void*, void*, const Shape&, const std::vector<int64_t>&, size_t) {
  no_cuda("permute", device);
}
void copy_rows(Device device, const void*, int64_t, void*, int64_t, int64_t, int64_t) { no_cuda("copy_rows", device); }
void place_band(Device device, const void*, int64_t, int64_t, int64_t, int64_t, void*) {
  no_cuda("place_band", device);
}
void gather_rows(Device device, const void*, void*, int64_t, int64_t, int64_t, const std::vector<int64_t>&, size_t) {
  no_cuda("gather_rows", device);
}
Tensor scatter_add_rows(const Tensor& grad, const Shape&, int64_t, int64_t, int64_t, const std::vector<int64_t>&) {
  no_cuda("scatter_add_rows", {&grad});
}

}  // namespace octet::kernels::cuda
