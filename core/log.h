#pragma once
// Logging through spdlog. One logger named "octet"; its lines carry a rank prefix once the
// distributed layer calls set_rank, so interleaved output from mpirun stays readable.
//
//   octet::logging::info("step {} loss {:.4f}", step, loss);
#include <spdlog/spdlog.h>

namespace octet::logging {

spdlog::logger& logger();
// Sets the "[rank r/w]" prefix; world == 1 removes it.
void set_rank(int rank, int world);
// "trace", "debug", "info", "warn", "error", "off".
void set_level(const std::string& level);

template <class... Args> void debug(spdlog::format_string_t<Args...> fmt, Args&&... args) { logger().debug(fmt, std::forward<Args>(args)...); }
template <class... Args> void info(spdlog::format_string_t<Args...> fmt, Args&&... args) { logger().info(fmt, std::forward<Args>(args)...); }
template <class... Args> void warn(spdlog::format_string_t<Args...> fmt, Args&&... args) { logger().warn(fmt, std::forward<Args>(args)...); }
template <class... Args> void error(spdlog::format_string_t<Args...> fmt, Args&&... args) { logger().error(fmt, std::forward<Args>(args)...); }

}  // namespace octet::logging
