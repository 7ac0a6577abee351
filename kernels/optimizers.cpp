// Entry points for the fused optimizer updates: argument checks, the per-step constants (computed in
// double, rounded once to the compute type by each kernel), and dispatch on device and dtype to
// kernels/cpu/ and kernels/cuda/.
#include "kernels/optimizers.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "core/float_formats.h"
#include "core/op_ledger.h"
#include "kernels/common.h"
#include "kernels/cpu/optimizers_cpu.h"
#include "kernels/cuda/optimizers_cuda.h"

namespace octet::kernels {
namespace {

void check_hyperparameter(const char* op, const char* name, double value, bool ok, const char* expected) {
  OCTET_CHECK(std::isfinite(value) && ok, op, ": ", name, " must be ", expected, ", got ", value);
}

// A tensor an update touches: entry `entry` of the call's list, and the field an error calls it by.
struct Named {
  const Tensor* tensor;
  size_t entry;
  const char* name;
};

// How errors name entry i of a call's list, and a field of it.
std::string entry_op(const char* op, size_t i) { return std::string(op) + " on tensors[" + std::to_string(i) + "]"; }
std::string entry_prefix(size_t i) { return "tensors[" + std::to_string(i) + "]."; }

// No two of the tensors share bytes: an in-place update whose inputs alias each other would read
// values it has already overwritten (and on the GPU two blocks would race). Sorting the byte ranges
// finds an overlapping pair, if any, in O(n log n) for a whole multi-tensor call.
void check_no_overlap(const char* op, std::vector<Named> named) {
  std::erase_if(named, [](const Named& n) { return !n.tensor->defined() || n.tensor->nbytes() == 0; });
  auto begin = [](const Named& n) { return n.tensor->storage_offset(); };
  std::stable_sort(named.begin(), named.end(), [&](const Named& a, const Named& b) {
    const Storage* sa = a.tensor->storage().get();
    const Storage* sb = b.tensor->storage().get();
    return sa != sb ? std::less<const Storage*>()(sa, sb) : begin(a) < begin(b);
  });
  const Named* reaching = nullptr;  // of the ranges seen in this storage, the one reaching furthest
  for (const Named& n : named) {
    if (reaching && reaching->tensor->storage() == n.tensor->storage()) {
      const size_t reach = begin(*reaching) + reaching->tensor->nbytes();
      // Two fields of one entry: "op on tensors[i]: param and grad"; of two: "op: tensors[i].a and tensors[j].b".
      const bool one_entry = reaching->entry == n.entry;
      const auto field = [&](const Named& x) { return (one_entry ? "" : entry_prefix(x.entry)) + x.name; };
      OCTET_CHECK(begin(n) >= reach, one_entry ? entry_op(op, n.entry) : std::string(op), ": ", field(*reaching),
                  " and ", field(n), " share memory (", describe_all({reaching->tensor, n.tensor}),
                  "); the update would read values it has already overwritten, give every tensor its own storage");
      if (begin(n) + n.tensor->nbytes() > reach) reaching = &n;
    } else {
      reaching = &n;
    }
  }
}

// The tensor the update computes on is the master copy when there is one, else the param itself.
// Without master: param is f32 or f64, grad has its dtype (or bf16 for an f32 param), the state has
// its dtype. With master: param is bf16 or f16, grad has its dtype, master and state are f32. Every
// tensor has param's shape; all of them sit on `device`.
void check_update_args(const std::string& op_name, const Tensor& param, const Tensor& grad, const Tensor& master,
                       std::initializer_list<const Tensor*> state) {
  const char* op = op_name.c_str();
  check_defined(op, {&param, &grad});
  for (const Tensor* s : state) check_defined(op, {&param, s});
  DType state_dtype = param.dtype();
  if (master.defined()) {
    OCTET_CHECK(param.dtype() == DType::bf16 || param.dtype() == DType::f16, op, ": param ", param.describe(),
                " comes with an f32 master copy, which is for bf16 or f16 params; update an f32 param in place "
                "and leave master undefined");
    OCTET_CHECK(master.dtype() == DType::f32 && master.shape() == param.shape(), op, ": master ", master.describe(),
                " must be f32 with the shape of param ", param.describe());
    OCTET_CHECK(grad.dtype() == param.dtype(), op, ": grad ", grad.describe(), " does not fit param ",
                param.describe(), "; the gradient of a low-precision param has the param's dtype");
    state_dtype = DType::f32;
  } else {
    OCTET_CHECK(param.dtype() == DType::f32 || param.dtype() == DType::f64, op, ": param is ", param.describe(),
                "; optimizers update f32 master weights (or f64), so keep the parameter in f32 and cast a copy "
                "for low-precision compute, or pass a bf16 param with its f32 master to the multi-tensor step");
    OCTET_CHECK(grad.dtype() == param.dtype() || (param.dtype() == DType::f32 && grad.dtype() == DType::bf16),
                op, ": grad ", grad.describe(), " does not fit param ", param.describe(),
                "; the gradient must have the param's dtype (or bf16 for an f32 param), convert it with .to(",
                dtype_name(param.dtype()), ")");
  }
  OCTET_CHECK(grad.shape() == param.shape(), op, ": grad ", grad.describe(), " and param ", param.describe(),
              " differ in shape; the gradient must have the param's shape");
  for (const Tensor* s : state) {
    OCTET_CHECK(s->dtype() == state_dtype && s->shape() == param.shape(), op, ": optimizer state ",
                s->describe(), " does not match param ", param.describe(), "; allocate the state with dtype ",
                dtype_name(state_dtype), " and the param's shape");
  }
  check_same_device(op, {&param, &grad});
  if (master.defined()) check_same_device(op, {&param, &master});
  for (const Tensor* s : state) check_same_device(op, {&param, s});
}

// Every entry of a multi-tensor call on the device of the first.
void check_one_device(const char* op, const Tensor& first, const Tensor& t, size_t index) {
  OCTET_CHECK(t.device() == first.device(), op, ": tensors[", index, "] is on ", t.device().str(),
              " but tensors[0] on ", first.device().str(), " (", describe_all({&first, &t}),
              "); one call updates the tensors of one device, call it once per device");
}

// Calls f.template operator()<T, G, L>() with the update type T, the gradient's storage type G and
// the type L of the param that receives the rounded master (L = T, unused, without a master).
template <class F>
void with_update_types(const Tensor& param, const Tensor& grad, const Tensor& master, F&& f) {
  if (master.defined()) {
    if (param.dtype() == DType::bf16) return f.template operator()<float, bfloat16, bfloat16>();
    return f.template operator()<float, float16, float16>();
  }
  if (param.dtype() == DType::f64) return f.template operator()<double, double, double>();
  if (grad.dtype() == DType::bf16) return f.template operator()<float, bfloat16, float>();
  return f.template operator()<float, float, float>();
}

// What an update writes: the master when there is one (with the param as its rounded copy), else
// the param itself.
template <class T, class L>
std::pair<T*, L*> updated_and_rounded(const Tensor& param, const Tensor& master) {
  if (master.defined()) return {master.data<T>(), static_cast<L*>(param.data_ptr())};
  return {param.data<T>(), nullptr};
}

cpu::AdamWConstants<double> adamw_constants(const char* op, double lr, double beta1, double beta2, double eps,
                                            double weight_decay, int64_t step) {
  check_hyperparameter(op, "lr", lr, lr >= 0, "finite and >= 0");
  check_hyperparameter(op, "beta1", beta1, beta1 >= 0 && beta1 < 1, "in [0, 1)");
  check_hyperparameter(op, "beta2", beta2, beta2 >= 0 && beta2 < 1, "in [0, 1)");
  check_hyperparameter(op, "eps", eps, eps >= 0, "finite and >= 0");
  check_hyperparameter(op, "weight_decay", weight_decay, weight_decay >= 0, "finite and >= 0");
  OCTET_CHECK(step >= 1, op,
              ": step must count updates from 1 (the bias corrections divide by 1 - beta^step), got ", step);
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  return {
      .decay = 1.0 - lr * weight_decay,
      .beta1 = beta1,
      .one_minus_beta1 = 1.0 - beta1,
      .beta2 = beta2,
      .one_minus_beta2 = 1.0 - beta2,
      .step_size = lr / bias_correction1,
      .bias_correction2_sqrt = std::sqrt(bias_correction2),
      .eps = eps,
  };
}

std::vector<Named> named_tensors(const AdamWTensors& t, size_t entry) {
  return {{&t.param, entry, "param"},
          {&t.grad, entry, "grad"},
          {&t.master, entry, "master"},
          {&t.exp_avg, entry, "exp_avg"},
          {&t.exp_avg_sq, entry, "exp_avg_sq"}};
}

void adamw_cpu(const char* op, const AdamWTensors& t, const cpu::AdamWConstants<double>& constants) {
  check_cpu(op, {&t.param, &t.grad, &t.exp_avg, &t.exp_avg_sq});
  if (t.master.defined()) check_cpu(op, {&t.master});
  with_update_types(t.param, t.grad, t.master, [&]<class T, class G, class L>() {
    const auto [updated, rounded] = updated_and_rounded<T, L>(t.param, t.master);
    cpu::adamw_step<T, G, L>(updated, static_cast<const G*>(t.grad.data_ptr()), t.exp_avg.data<T>(),
                             t.exp_avg_sq.data<T>(), rounded, t.param.numel(), cpu::rounded_to<T>(constants));
  });
}

cpu::SgdConstants<double> sgd_constants(const char* op, double lr, double momentum, double dampening, bool nesterov,
                                        double weight_decay, bool first_step) {
  check_hyperparameter(op, "momentum", momentum, momentum >= 0, "finite and >= 0");
  check_hyperparameter(op, "lr", lr, lr >= 0, "finite and >= 0");
  check_hyperparameter(op, "dampening", dampening, true, "finite");
  check_hyperparameter(op, "weight_decay", weight_decay, weight_decay >= 0, "finite and >= 0");
  OCTET_CHECK(!nesterov || (momentum > 0 && dampening == 0), op,
              ": nesterov needs momentum > 0 and dampening 0, got momentum ", momentum, " and dampening ",
              dampening);
  return {.lr = lr,
          .momentum = momentum,
          .one_minus_dampening = 1.0 - dampening,
          .weight_decay = weight_decay,
          .nesterov = nesterov,
          .first_step = first_step};
}

// The entry as the kernels take it: with momentum 0 the buffer plays no part, even when the caller
// passed one.
SgdTensors checked_sgd_entry(const std::string& op, const SgdTensors& t, double momentum, const std::string& prefix) {
  SgdTensors used = t;
  if (momentum != 0) {
    OCTET_CHECK(t.momentum_buffer.defined(), op, ": momentum is ", momentum, " but ", prefix,
                "momentum_buffer is undefined; allocate it with the param's shape (f32 for a bf16 param)");
    check_update_args(op, t.param, t.grad, t.master, {&t.momentum_buffer});
  } else {
    used.momentum_buffer = Tensor();
    check_update_args(op, t.param, t.grad, t.master, {});
  }
  return used;
}

std::vector<Named> named_tensors(const SgdTensors& t, size_t entry) {
  return {{&t.param, entry, "param"},
          {&t.grad, entry, "grad"},
          {&t.master, entry, "master"},
          {&t.momentum_buffer, entry, "momentum_buffer"}};
}

void sgd_cpu(const char* op, const SgdTensors& t, const cpu::SgdConstants<double>& constants) {
  check_cpu(op, {&t.param, &t.grad});
  if (t.master.defined()) check_cpu(op, {&t.master});
  if (t.momentum_buffer.defined()) check_cpu(op, {&t.momentum_buffer});
  with_update_types(t.param, t.grad, t.master, [&]<class T, class G, class L>() {
    const auto [updated, rounded] = updated_and_rounded<T, L>(t.param, t.master);
    T* buffer = t.momentum_buffer.defined() ? t.momentum_buffer.data<T>() : nullptr;
    cpu::sgd_step<T, G, L>(updated, static_cast<const G*>(t.grad.data_ptr()), buffer, rounded, t.param.numel(),
                           cpu::rounded_to<T>(constants));
  });
}

}  // namespace

// ---- AdamW -----------------------------------------------------------------------------------------------

void adamw_step_multi_(const std::vector<AdamWTensors>& tensors, double lr, double beta1, double beta2, double eps,
                       double weight_decay, int64_t step) {
  const char* op = "adamw_step_multi_";
  const auto constants = adamw_constants(op, lr, beta1, beta2, eps, weight_decay, step);
  if (tensors.empty()) return;
  std::vector<Named> all;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamWTensors& t = tensors[i];
    check_update_args(entry_op(op, i), t.param, t.grad, t.master,
                      {&t.exp_avg, &t.exp_avg_sq});
    check_one_device(op, tensors[0].param, t.param, i);
    for (const Named& n : named_tensors(t, i)) all.push_back(n);
  }
  check_no_overlap(op, std::move(all));
  LedgerOp ledger(op);
  for (const AdamWTensors& t : tensors) {
    // What the kernels read: with a master, the update reads the master and only writes the param.
    ledger.read({t.master.defined() ? &t.master : &t.param, &t.grad, &t.exp_avg, &t.exp_avg_sq});
    ledger.write(t.param).write(t.master).write(t.exp_avg).write(t.exp_avg_sq);
  }
  for (const AdamWTensors& t : tensors) {
    for (const Tensor* w : {&t.param, &t.master, &t.exp_avg, &t.exp_avg_sq}) {
      if (w->defined()) w->bump_version();
    }
  }
  if (tensors[0].param.is_cuda()) return cuda::adamw_step_multi_(tensors, constants);
  for (const AdamWTensors& t : tensors) adamw_cpu(op, t, constants);
}

// ---- SGD ---------------------------------------------------------------------------------------------------

void sgd_step_multi_(const std::vector<SgdTensors>& tensors, double lr, double momentum, double dampening,
                     bool nesterov, double weight_decay, bool first_step) {
  const char* op = "sgd_step_multi_";
  const auto constants = sgd_constants(op, lr, momentum, dampening, nesterov, weight_decay, first_step);
  if (tensors.empty()) return;
  std::vector<SgdTensors> used;
  used.reserve(tensors.size());
  std::vector<Named> all;
  for (size_t i = 0; i < tensors.size(); ++i) {
    used.push_back(checked_sgd_entry(entry_op(op, i), tensors[i], momentum,
                                     entry_prefix(i)));
    check_one_device(op, tensors[0].param, tensors[i].param, i);
    for (const Named& n : named_tensors(used.back(), i)) all.push_back(n);
  }
  check_no_overlap(op, std::move(all));
  LedgerOp ledger(op);
  for (const SgdTensors& t : used) {
    // What the kernels read: the master rather than the param when there is one, and the momentum
    // buffer only after the first step (the first writes it without reading it).
    ledger.read({t.master.defined() ? &t.master : &t.param, &t.grad});
    if (!first_step) ledger.read(t.momentum_buffer);
    ledger.write(t.param).write(t.master).write(t.momentum_buffer);
  }
  for (const SgdTensors& t : used) {
    for (const Tensor* w : {&t.param, &t.master, &t.momentum_buffer}) {
      if (w->defined()) w->bump_version();
    }
  }
  if (used[0].param.is_cuda()) return cuda::sgd_step_multi_(used, constants);
  for (const SgdTensors& t : used) sgd_cpu(op, t, constants);
}

// ---- f32 master copies ---------------------------------------------------------------------------------------

void widen_to_f32_multi_(const std::vector<Tensor>& sources, const std::vector<Tensor>& destinations) {
  const char* op = "widen_to_f32_multi_";
  OCTET_CHECK(sources.size() == destinations.size(), op, ": got ", sources.size(), " sources and ",
              destinations.size(), " destinations; pass one f32 destination per source");
  if (sources.empty()) return;
  std::vector<Named> all;
  for (size_t i = 0; i < sources.size(); ++i) {
    const Tensor &src = sources[i], &dst = destinations[i];
    const std::string entry = entry_op(op, i);
    check_defined(entry.c_str(), {&src, &dst});
    OCTET_CHECK(src.dtype() == DType::bf16 || src.dtype() == DType::f16, entry, ": source ", src.describe(),
                " must be bf16 or f16 (the parameters that get f32 master copies); copy other dtypes with copy_");
    OCTET_CHECK(dst.dtype() == DType::f32 && dst.shape() == src.shape(), entry, ": destination ", dst.describe(),
                " must be f32 with the shape of source ", src.describe());
    check_same_device(entry.c_str(), {&src, &dst});
    check_one_device(op, sources[0], src, i);
    all.push_back({&src, i, "source"});
    all.push_back({&dst, i, "destination"});
  }
  check_no_overlap(op, std::move(all));
  LedgerOp ledger(op);
  for (size_t i = 0; i < sources.size(); ++i) ledger.read(sources[i]).write(destinations[i]);
  for (const Tensor& dst : destinations) dst.bump_version();
  if (sources[0].is_cuda()) return cuda::widen_to_f32_multi_(sources, destinations);
  for (size_t i = 0; i < sources.size(); ++i) destinations[i].copy_(sources[i]);
}

// ---- sum of squares ------------------------------------------------------------------------------------------

namespace {

double sum_of_squares_cpu(const char* op, const Tensor& t) {
  check_cpu(op, {&t});
  if (t.dtype() == DType::f64) return cpu::sum_of_squares(t.data<double>(), t.numel());
  // Every other floating format widens to f32 exactly.
  const Tensor t32 = t.detach().to(DType::f32);
  return cpu::sum_of_squares(t32.data<float>(), t32.numel());
}

// A one-element f64 tensor of shape [] on the CPU holding `value`.
Tensor cpu_scalar(double value) {
  Tensor t = empty({}, DType::f64);
  t.data<double>()[0] = value;
  return t;
}

}  // namespace

double sum_of_squares(const Tensor& t) {
  const char* op = "sum_of_squares";
  LedgerOp ledger(op);
  ledger.read(t).write_bytes(8);
  check_defined(op, {&t});
  check_floating(op, t);
  return sum_of_squares_multi_tensor({t}, t.device()).item();
}

Tensor sum_of_squares_multi_tensor(const std::vector<Tensor>& tensors, Device device) {
  const char* op = "sum_of_squares_multi";
  LedgerOp ledger(op);
  for (const Tensor& t : tensors) ledger.read(t);
  ledger.write_bytes(8);
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_defined(op, {&tensors[i]});
    check_floating(op, tensors[i]);
    OCTET_CHECK(tensors[i].device() == device, op, ": tensors[", i, "] is ", tensors[i].describe(),
                " but the total is asked for on ", device.str(), "; one call sums the tensors of one device");
  }
  if (device.is_cuda()) return cuda::sum_of_squares_multi(tensors, device);
  double total = 0;
  for (const Tensor& t : tensors) total += sum_of_squares_cpu(op, t);
  return cpu_scalar(total);
}

double sum_of_squares_multi(const std::vector<Tensor>& tensors) {
  if (tensors.empty()) return 0.0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    check_defined("sum_of_squares_multi", {&tensors[i]});
    check_one_device("sum_of_squares_multi", tensors[0], tensors[i], i);
  }
  return sum_of_squares_multi_tensor(tensors, tensors[0].device()).item();  // the one host read
}

// ---- gradient-norm clipping on the device --------------------------------------------------------------------

ClipScalars clip_scalars(const Tensor& sum_of_squares, double max_norm) {
  const char* op = "clip_scalars";
  LedgerOp ledger(op);
  ledger.read(sum_of_squares).write_bytes(16);  // the norm and the coefficient
  check_defined(op, {&sum_of_squares});
  OCTET_CHECK(sum_of_squares.numel() == 1 && sum_of_squares.dtype() == DType::f64, op,
              ": sum_of_squares must be a one-element f64 tensor (sum_of_squares_multi_tensor's), got ",
              sum_of_squares.describe());
  check_hyperparameter(op, "max_norm", max_norm, max_norm > 0, "finite and > 0");
  if (sum_of_squares.is_cuda()) return cuda::clip_scalars(sum_of_squares, max_norm);
  check_cpu(op, {&sum_of_squares});
  // The kernel's read of its operand, on the CPU: no host read (core/host_sync.h).
  const double norm = std::sqrt(sum_of_squares.data<double>()[0]);
  return {cpu_scalar(norm), cpu_scalar(clip_coefficient(norm, max_norm))};
}

void scale_multi_(const std::vector<Tensor>& tensors, const Tensor& scale) {
  const char* op = "scale_multi_";
  LedgerOp ledger(op);
  ledger.read(scale);
  for (const Tensor& t : tensors) ledger.read(t).write(t);
  check_defined(op, {&scale});
  OCTET_CHECK(scale.numel() == 1 && (scale.dtype() == DType::f32 || scale.dtype() == DType::f64), op,
              ": scale must be a one-element f32 or f64 tensor, got ", scale.describe());
  std::vector<Named> all;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    check_defined(op, {&t});
    const DType d = t.dtype();
    OCTET_CHECK(d == DType::f32 || d == DType::bf16 || d == DType::f16 || d == DType::f64, op, ": tensors[", i,
                "] is ", t.describe(), "; the multi-tensor scale takes f32, bf16, f16 and f64 tensors, scale others "
                "with mul_scalar_");
    OCTET_CHECK(t.device() == scale.device(), op, ": tensors[", i, "] is on ", t.device().str(), " but scale on ",
                scale.device().str(), " (", describe_all({&t, &scale}),
                "); the kernels read the scale on the tensors' device, move it there");
    all.push_back({&t, i, "tensor"});
  }
  check_no_overlap(op, std::move(all));
  if (tensors.empty()) return;
  for (const Tensor& t : tensors) t.bump_version();
  if (scale.is_cuda()) return cuda::scale_multi_(tensors, scale);
  check_cpu(op, {&scale});
  // The kernel's read of its operand, on the CPU: no host read (core/host_sync.h).
  const double s = scale.dtype() == DType::f64 ? scale.data<double>()[0] : scale.data<float>()[0];
  if (s == 1.0) return;
  for (const Tensor& t : tensors) {
    switch (t.dtype()) {
      case DType::f64: cpu::scale(t.data<double>(), t.numel(), s); break;
      case DType::bf16: cpu::scale(static_cast<bfloat16*>(t.data_ptr()), t.numel(), static_cast<float>(s)); break;
      case DType::f16: cpu::scale(static_cast<float16*>(t.data_ptr()), t.numel(), static_cast<float>(s)); break;
      default: cpu::scale(t.data<float>(), t.numel(), static_cast<float>(s)); break;
    }
  }
}

}  // namespace octet::kernels
