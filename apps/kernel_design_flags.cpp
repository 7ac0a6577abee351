// --bias-grad (apps/kernel_design_flags.h).
#include "apps/kernel_design_flags.h"

#include "core/error.h"
#include "kernels/linear.h"

namespace octet {

std::string KernelDesignFlags::describe() const {
  std::string text;
  auto add = [&](const char* flag, const std::string& value, const char* library_default) {
    if (value != library_default) text += (text.empty() ? "" : " ") + std::string(flag) + " " + value;
  };
  add("--bias-grad", bias_grad, "column-sum");
  return text;
}

void add_kernel_design_flags(CLI::App& app, KernelDesignFlags& flags) {
  app.add_option("--bias-grad", flags.bias_grad,
                 "where the GPU sums the Linears' bias gradients: column-sum (the weight-gradient GEMM alone, then "
                 "Octet's column reduction over dy) or epilogue (cuBLASLt's BGRADB on the weight-gradient GEMM)")
      ->check(CLI::IsMember({"column-sum", "epilogue"}))
      ->capture_default_str();
}

void apply_kernel_design_flags(const KernelDesignFlags& flags, const Device& device) {
  const std::string chosen = flags.describe();
  OCTET_CHECK(chosen.empty() || device.is_cuda(), chosen, " picks a GPU kernel design, but this run is on ",
              device.str(), ", where each op has one kernel; drop the flag, or run on a GPU (--device cuda)");
  kernels::set_linear_bias_grad_design(flags.bias_grad == "epilogue" ? kernels::LinearBiasGradDesign::kEpilogue
                                                                     : kernels::LinearBiasGradDesign::kColumnSum);
}

}  // namespace octet
