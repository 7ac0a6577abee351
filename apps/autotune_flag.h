#pragma once
// --autotune (kernels/autotune.h) as a command-line flag, shared by train_vit and bench_vit.
#include <CLI/CLI.hpp>

#include <string>

#include "core/device.h"

namespace octet {

// --autotune on|off into `value` ("off" unless given).
void add_autotune_flag(CLI::App& app, std::string& value);
// Checks `value` against the device the run resolved to and switches autotuning on or off for the
// process. On the CPU there is nothing to tune: "on" throws octet::Error naming the flag and the fix.
void apply_autotune(const std::string& value, const Device& device);

}  // namespace octet
