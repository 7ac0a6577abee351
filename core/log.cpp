#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/error.h"

namespace octet::logging {

namespace {
std::shared_ptr<spdlog::logger> make_logger() {
  auto logger = spdlog::stderr_color_mt("octet");
  logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  return logger;
}
}  // namespace

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = make_logger();
  return *instance;
}

void set_rank(int rank, int world) {
  if (world <= 1) {
    logger().set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  } else {
    logger().set_pattern("[%H:%M:%S.%e] [rank " + std::to_string(rank) + "/" + std::to_string(world) +
                         "] [%^%l%$] %v");
  }
}

void set_level(const std::string& level) {
  const auto parsed = spdlog::level::from_str(level);
  OCTET_CHECK(parsed != spdlog::level::off || level == "off", "log::set_level: unknown level '", level,
              "'; use trace, debug, info, warn, error or off");
  logger().set_level(parsed);
}

}  // namespace octet::logging
