#pragma once
// bench_vit's choice between the GPU kernel designs that wait for a GPU run to settle them:
// --layernorm-backward (kernels/layernorm_design.h), --bias-grad (kernels/linear.h) and --row-prefetch
// (kernels/row_prefetch.h). Each defaults to the design the library runs when nothing sets it, so a
// benchmark without the flags times the library as it ships.
#include <CLI/CLI.hpp>

#include <string>

#include "core/device.h"

namespace octet {

struct KernelDesignFlags {
  std::string layernorm_backward = "rows";  // rows | columns
  std::string bias_grad = "epilogue";       // epilogue | column-sum
  std::string row_prefetch = "refill";      // refill | after
  // "--layernorm-backward columns --bias-grad column-sum", or "" for the defaults: for the run's header.
  std::string describe() const;
};

void add_kernel_design_flags(CLI::App& app, KernelDesignFlags& flags);
// Checks the flags against the device the run resolved to and sets the process-wide designs. On the
// CPU each op has one kernel: a design other than the default throws octet::Error naming the flag and
// the fix, and sets nothing.
void apply_kernel_design_flags(const KernelDesignFlags& flags, const Device& device);

}  // namespace octet
