// --gemm-autotune (apps/gemm_flags.h).
#include "apps/gemm_flags.h"

#include "core/error.h"
#include "kernels/gemm_autotune.h"

namespace octet {

void add_gemm_autotune_flag(CLI::App& app, std::string& value) {
  app.add_option("--gemm-autotune", value,
                 "on: time up to 16 of cuBLASLt's algorithms for each GEMM shape on its first run and keep the "
                 "fastest (the first step pays a few milliseconds per shape; results then vary in the last bits "
                 "between runs); off: cuBLASLt's heuristic picks, the same in every run")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

void apply_gemm_autotune(const std::string& value, const Device& device) {
  const bool on = value == "on";
  OCTET_CHECK(!on || device.is_cuda(), "--gemm-autotune on times cuBLASLt's GPU algorithms, but this run is on ",
              device.str(), ", where there is nothing to tune; drop the flag, or run on a GPU (--device cuda)");
  kernels::set_gemm_autotune(on);
}

}  // namespace octet
