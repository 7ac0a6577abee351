// --layernorm-backward, --bias-grad and --row-prefetch (apps/kernel_design_flags.h).
#include "apps/kernel_design_flags.h"

#include "core/error.h"
#include "kernels/layernorm_design.h"
#include "kernels/linear.h"
#include "kernels/row_prefetch.h"

namespace octet {

std::string KernelDesignFlags::describe() const {
  std::string text;
  auto add = [&](const char* flag, const std::string& value, const char* library_default) {
    if (value != library_default) text += (text.empty() ? "" : " ") + std::string(flag) + " " + value;
  };
  add("--layernorm-backward", layernorm_backward, "rows");
  add("--bias-grad", bias_grad, "epilogue");
  add("--row-prefetch", row_prefetch, "refill");
  return text;
}

void add_kernel_design_flags(CLI::App& app, KernelDesignFlags& flags) {
  app.add_option("--layernorm-backward", flags.layernorm_backward,
                 "the GPU LayerNorm backward's design: rows (a warp per row, dweight and dbias summed in shared "
                 "memory) or columns (a thread per 16-byte pack of columns down a run of rows, dweight and dbias "
                 "in registers)")
      ->check(CLI::IsMember({"rows", "columns"}))
      ->capture_default_str();
  app.add_option("--bias-grad", flags.bias_grad,
                 "where the GPU sums the Linears' bias gradients: epilogue (cuBLASLt's BGRADB on the weight-gradient "
                 "GEMM) or column-sum (the GEMM alone, then Octet's column reduction over dy)")
      ->check(CLI::IsMember({"epilogue", "column-sum"}))
      ->capture_default_str();
  app.add_option("--row-prefetch", flags.row_prefetch,
                 "when the GPU kernels that walk several rows or tiles (LayerNorm's backward in rows, LayerNorm "
                 "-> FP8, the tiled FP8 casts) load the next one: refill (into each register as soon as the current "
                 "row is done with it) or after (once the whole row is done)")
      ->check(CLI::IsMember({"refill", "after"}))
      ->capture_default_str();
}

void apply_kernel_design_flags(const KernelDesignFlags& flags, const Device& device) {
  const std::string chosen = flags.describe();
  OCTET_CHECK(chosen.empty() || device.is_cuda(), chosen, " picks a GPU kernel design, but this run is on ",
              device.str(), ", where each op has one kernel; drop the flag, or run on a GPU (--device cuda)");
  kernels::set_layernorm_backward_design(flags.layernorm_backward == "columns"
                                             ? kernels::LayerNormBackwardDesign::kColumns
                                             : kernels::LayerNormBackwardDesign::kRows);
  kernels::set_linear_bias_grad_design(flags.bias_grad == "column-sum" ? kernels::LinearBiasGradDesign::kColumnSum
                                                                       : kernels::LinearBiasGradDesign::kEpilogue);
  kernels::set_row_prefetch(flags.row_prefetch == "after" ? kernels::RowPrefetch::kAfter
                                                          : kernels::RowPrefetch::kRefill);
}

}  // namespace octet
