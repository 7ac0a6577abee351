#include "core/error.h"

#include <cstring>

namespace octet::detail {

void throw_error(const char* file, int line, const std::string& message) {
  // Keep the path short: "core/tensor.cpp" reads better than an absolute build path.
  const char* short_file = file;
  for (const char* folder : {"/core/", "/kernels/", "/autograd/", "/nn/", "/optim/", "/distributed/",
                             "/models/", "/data/", "/apps/", "/tests/"}) {
    if (const char* p = std::strstr(file, folder)) {
      short_file = p + 1;
      break;
    }
  }
  throw Error(message + " (at " + short_file + ":" + std::to_string(line) + ")");
}

}  // namespace octet::detail
