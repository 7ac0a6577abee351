#pragma once
// bench_vit's choice between the GPU kernel designs that a GPU run still weighs: --bias-grad
// (kernels/linear.h). It defaults to the design the library runs when nothing sets it, so a benchmark
// without the flag times the library as it ships.
//
// The fourth GPU run (2026-11-29, an H200) settled the other two that stood here: LayerNorm's
// backward in columns (slower than the rows design: 65.2 µs against 60.4 with the residual) and the
// refill of the row kernels (slower in every kernel that took it), both now gone; and it made the
// column sum the bias gradients' default, with cuBLASLt's BGRADB epilogue kept as the trial.
#include <CLI/CLI.hpp>

#include <string>

#include "core/device.h"

namespace octet {

struct KernelDesignFlags {
  std::string bias_grad = "column-sum";  // column-sum | epilogue
  // "--bias-grad epilogue", or "" for the defaults: for the run's header.
  std::string describe() const;
};

void add_kernel_design_flags(CLI::App& app, KernelDesignFlags& flags);
// Checks the flags against the device the run resolved to and sets the process-wide designs. On the
// CPU each op has one kernel: a design other than the default throws octet::Error naming the flag and
// the fix, and sets nothing.
void apply_kernel_design_flags(const KernelDesignFlags& flags, const Device& device);

}  // namespace octet
