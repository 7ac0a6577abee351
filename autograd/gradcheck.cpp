#include "autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "autograd/engine.h"
#include "core/grad_mode.h"
#include "core/random.h"

namespace octet::autograd {

namespace {

double projected(const std::vector<Tensor>& outputs, const std::vector<Tensor>& projections) {
  double total = 0;
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!projections[k].defined()) continue;
    const std::vector<double> y = outputs[k].detach().to_vector<double>();
    const double* r = projections[k].data<double>();
    for (size_t i = 0; i < y.size(); ++i) total += y[i] * r[i];
  }
  return total;
}

}  // namespace

GradcheckResult gradcheck(const MultiOutputFn& fn, const std::vector<Tensor>& inputs, GradcheckOptions options) {
  GradcheckResult result;
  for (const Tensor& x : inputs) {
    if (!x.requires_grad()) continue;
    OCTET_CHECK(x.dtype() == DType::f64 && x.is_leaf() && x.device().is_cpu(),
                "gradcheck: inputs that require grad must be f64 leaves on the cpu, got ", x.describe());
  }
  for (const Tensor& x : inputs) {
    if (x.requires_grad()) const_cast<Tensor&>(x).set_grad(Tensor());
  }

  // Analytic: one backward with the projections as output gradients.
  std::vector<Tensor> outputs;
  {
    EnableGradGuard grad_on;
    outputs = fn(inputs);
  }
  Generator gen(options.seed);
  std::vector<Tensor> projections(outputs.size());
  std::vector<Tensor> roots, root_grads;
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].defined() || !outputs[k].requires_grad()) continue;
    OCTET_CHECK(outputs[k].dtype() == DType::f64, "gradcheck: output ", k, " is ", outputs[k].describe(),
                "; differentiable outputs must be f64 for finite differences to mean anything");
    projections[k] = randn(outputs[k].shape(), gen, DType::f64);
    roots.push_back(outputs[k]);
    root_grads.push_back(projections[k]);
  }
  OCTET_CHECK(!roots.empty(), "gradcheck: no output requires grad; does the function use its inputs?");
  backward(roots, root_grads);

  // Numerical: central differences, one element at a time.
  NoGradGuard no_grad;
  std::ostringstream report;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!x.requires_grad()) continue;
    const std::vector<double> analytic =
        x.grad().defined() ? x.grad().to_vector<double>() : std::vector<double>(x.numel(), 0.0);
    double* data = x.data<double>();
    double worst_excess = 0;
    int64_t worst = -1;
    double worst_a = 0, worst_n = 0;
    for (int64_t j = 0; j < x.numel(); ++j) {
      const double saved = data[j];
      data[j] = saved + options.eps;
      const double plus = projected(fn(inputs), projections);
      data[j] = saved - options.eps;
      const double minus = projected(fn(inputs), projections);
      data[j] = saved;
      const double numeric = (plus - minus) / (2 * options.eps);
      const double excess = std::abs(analytic[j] - numeric) - (options.atol + options.rtol * std::abs(numeric));
      if (!(excess <= 0) && (worst < 0 || excess > worst_excess || std::isnan(excess))) {
        worst = j;
        worst_excess = excess;
        worst_a = analytic[j];
        worst_n = numeric;
      }
    }
    if (worst >= 0) {
      result.ok = false;
      report << "input " << i << " (" << x.describe() << "): element " << worst << " analytic " << worst_a
             << " vs numeric " << worst_n << "; ";
    }
  }
  result.message = report.str();
  return result;
}

GradcheckResult gradcheck(const SingleOutputFn& fn, const std::vector<Tensor>& inputs, GradcheckOptions options) {
  return gradcheck(MultiOutputFn([&fn](const std::vector<Tensor>& xs) { return std::vector<Tensor>{fn(xs)}; }),
                   inputs, options);
}

}  // namespace octet::autograd
