// --autotune (apps/autotune_flag.h).
#include "apps/autotune_flag.h"

#include "core/error.h"
#include "kernels/autotune.h"

namespace octet {

void add_autotune_flag(CLI::App& app, std::string& value) {
  app.add_option("--autotune", value,
                 "on: time up to 16 of cuBLASLt's algorithms for each GEMM shape, and cuDNN's engine "
                 "configurations for each attention shape, on their first run, and keep the fastest (the first "
                 "step pays tens of milliseconds per large shape; results then vary in the last bits between runs); "
                 "off: "
                 "the libraries' heuristics pick, the same in every run")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

void apply_autotune(const std::string& value, const Device& device) {
  const bool on = value == "on";
  OCTET_CHECK(!on || device.is_cuda(), "--autotune on times cuBLASLt's and cuDNN's GPU algorithms, but this run is "
              "on ", device.str(), ", where there is nothing to tune; drop the flag, or run on a GPU (--device cuda)");
  kernels::set_autotune(on);
}

}  // namespace octet
