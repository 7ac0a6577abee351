#pragma once
// A tensor's extents. Its own type (not a bare std::vector) so that printing and error
// messages find its operator<< and so that shape arithmetic has one home.
#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <string>
#include <vector>

namespace octet {

struct Shape : std::vector<int64_t> {
  using std::vector<int64_t>::vector;
  Shape(std::vector<int64_t> dims) : std::vector<int64_t>(std::move(dims)) {}

  int64_t numel() const;
  int64_t ndim() const { return static_cast<int64_t>(size()); }
  // Index of dim d, where negative d counts from the end; throws naming `op` when out of range.
  int64_t normalize_dim(int64_t d, const char* op) const;
  std::string str() const;  // "[2, 3]"
};

std::ostream& operator<<(std::ostream& os, const Shape& shape);

}  // namespace octet
