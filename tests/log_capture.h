#pragma once
// CapturedLog: what the "octet" logger writes while a test runs, for tests that check a message.
// Apart from tests/testing.h because spdlog's headers are host-only: the .cu tests include that one.
#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <string>

#include "core/log.h"

namespace octet::testing {

// Collects what the "octet" logger writes at info level and above while it lives, then puts the
// logger's sinks and level back.
class CapturedLog {
 public:
  CapturedLog() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(text_)), level_(logging::logger().level()) {
    logging::logger().sinks().push_back(sink_);
    logging::logger().set_level(spdlog::level::info);
  }
  ~CapturedLog() {
    auto& sinks = logging::logger().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
    logging::logger().set_level(level_);
  }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;
  std::string text() const {
    logging::logger().flush();
    return text_.str();
  }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  spdlog::level::level_enum level_;
};

}  // namespace octet::testing
