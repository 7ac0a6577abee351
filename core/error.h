#pragma once
// Errors. Every failed check throws octet::Error whose message starts with the operation,
// names the shapes, dtypes and devices involved, and, where there is one, says the fix.
//
//   OCTET_CHECK(a.shape() == b.shape(), "add: shapes ", a.shape(), " and ", b.shape(), " differ");
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace octet {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
}  // namespace detail

}  // namespace octet

#define OCTET_CHECK(cond, ...)                                                                  \
  do {                                                                                          \
    if (!(cond)) [[unlikely]]                                                                   \
      ::octet::detail::throw_error(__FILE__, __LINE__, ::octet::detail::concat(__VA_ARGS__));  \
  } while (0)

#define OCTET_FAIL(...) ::octet::detail::throw_error(__FILE__, __LINE__, ::octet::detail::concat(__VA_ARGS__))
