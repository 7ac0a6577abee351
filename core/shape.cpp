#include "core/shape.h"

#include <ostream>

#include "core/error.h"

namespace octet {

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : *this) n *= d;
  return n;
}

int64_t Shape::normalize_dim(int64_t d, const char* op) const {
  const int64_t n = ndim();
  OCTET_CHECK(d >= -n && d < n, op, ": dim ", d, " is out of range for a tensor of shape ", *this);
  return d < 0 ? d + n : d;
}

std::string Shape::str() const {
  std::string s = "[";
  for (size_t i = 0; i < size(); ++i) s += (i ? ", " : "") + std::to_string((*this)[i]);
  return s + "]";
}

std::ostream& operator<<(std::ostream& os, const Shape& shape) { return os << shape.str(); }

}  // namespace octet
