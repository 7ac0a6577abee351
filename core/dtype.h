#pragma once
// Element types. f64 exists for references and gradcheck; bf16/f16/fp8 are storage formats whose
// arithmetic Octet does in f32 (exact emulation: round at tensor boundaries, compute in f32).
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>

namespace octet {

enum class DType : uint8_t { f32, f64, bf16, f16, e4m3, e5m2, i32, i64, u8 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);           // "f32", "bf16", "e4m3", ...
DType dtype_from_name(std::string_view name);  // inverse of dtype_name; throws on unknown names
bool is_floating(DType dtype);                 // every format that holds real numbers
bool is_fp8(DType dtype);
bool is_integral(DType dtype);
std::ostream& operator<<(std::ostream& os, DType dtype);

// The DType of a C++ element type. Only the types Octet hands out raw pointers for: f32, f64,
// i32, i64, u8. Low-precision storage is read through conversion (Tensor::to, to_vector).
template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::u8; }

// Converts n elements between any two dtypes on the host. Floating conversions round to nearest
// even, once; conversion to FP8 saturates to the format's max finite value (core/float_formats.h).
// Floating to integral truncates toward zero, as static_cast does.
void convert_elements(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n);

}  // namespace octet
