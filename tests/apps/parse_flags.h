#pragma once
// The flag tests' parse: a fresh value, its flags added to a CLI::App, the given arguments parsed
// (after a program name). Parse errors (CLI::ValidationError, ...) propagate to the test.
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace octet::testing {

// add(app, value) adds the flags that write `value`, as apps/*_flags.h do.
template <class Value, class Add>
Value parse_flags(const std::vector<std::string>& args, Value value, Add add) {
  CLI::App app;
  add(app, value);
  std::vector<const char*> argv{"prog"};
  for (const std::string& a : args) argv.push_back(a.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
  return value;
}

}  // namespace octet::testing
