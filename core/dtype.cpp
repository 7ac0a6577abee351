#include "core/dtype.h"

#include <algorithm>

#include <ostream>

#include "core/error.h"
#include "core/float_formats.h"

namespace octet {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::e4m3: return 1;
    case DType::e5m2: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  OCTET_FAIL("dtype_size: unknown dtype ", static_cast<int>(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "?";
}

DType dtype_from_name(std::string_view name) {
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::e4m3, DType::e5m2, DType::i32,
                  DType::i64, DType::u8}) {
    if (name == dtype_name(d)) return d;
  }
  OCTET_FAIL("dtype_from_name: unknown dtype '", name,
             "'; expected one of f32, f64, bf16, f16, e4m3, e5m2, i32, i64, u8");
}

bool is_floating(DType d) { return !is_integral(d); }
bool is_fp8(DType d) { return d == DType::e4m3 || d == DType::e5m2; }
bool is_integral(DType d) { return d == DType::i32 || d == DType::i64 || d == DType::u8; }

std::ostream& operator<<(std::ostream& os, DType dtype) { return os << dtype_name(dtype); }

namespace {

// Reads element i as double (exact for every dtype but i64 beyond 2^53).
double load_double(const void* p, DType d, int64_t i) {
  switch (d) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::bf16: return bf16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::f16: return f16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
    case DType::e4m3: return e4m3_to_float(static_cast<const uint8_t*>(p)[i]);
    case DType::e5m2: return e5m2_to_float(static_cast<const uint8_t*>(p)[i]);
    case DType::i32: return static_cast<const int32_t*>(p)[i];
    case DType::i64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DType::u8: return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

// Writes a double, rounding once to the destination format.
void store_double(void* p, DType d, int64_t i, double v) {
  switch (d) {
    case DType::f32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DType::f64: static_cast<double*>(p)[i] = v; return;
    case DType::bf16: static_cast<uint16_t*>(p)[i] = double_to_bf16_bits(v); return;
    case DType::f16: static_cast<uint16_t*>(p)[i] = double_to_f16_bits(v); return;
    case DType::e4m3: static_cast<uint8_t*>(p)[i] = double_to_e4m3(v, /*saturate=*/true); return;
    case DType::e5m2: static_cast<uint8_t*>(p)[i] = double_to_e5m2(v, /*saturate=*/true); return;
    case DType::i32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case DType::i64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); return;
    case DType::u8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v); return;
  }
}

// The hot conversions (f32 <-> low precision) get loops the compiler can vectorise.
template <class Encode>
void from_f32(const float* src, void* dst, int64_t n, Encode encode) {
  using Bits = decltype(encode(0.f));
  Bits* out = static_cast<Bits*>(dst);
#pragma omp parallel for if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) out[i] = encode(src[i]);
}
template <class Bits, class Decode>
void to_f32(const void* src, float* dst, int64_t n, Decode decode) {
  const Bits* in = static_cast<const Bits*>(src);
#pragma omp parallel for if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) dst[i] = decode(in[i]);
}

// FP8 has 256 codes, so decoding one is a table lookup. The tables hold the bits of
// e4m3_to_float / e5m2_to_float for every code (the same results by construction) and replace a
// branchy function per element, which made decoding the operands a tenth of an FP8 GEMM on the CPU.
struct Fp8DecodeTables {
  uint32_t e4m3[256];
  uint32_t e5m2[256];
};

const Fp8DecodeTables& fp8_decode_tables() {
  static const Fp8DecodeTables tables = [] {
    Fp8DecodeTables t{};
    for (uint32_t code = 0; code < 256; ++code) {
      t.e4m3[code] = detail::float_bits(e4m3_to_float(static_cast<uint8_t>(code)));
      t.e5m2[code] = detail::float_bits(e5m2_to_float(static_cast<uint8_t>(code)));
    }
    return t;
  }();
  return tables;
}

}  // namespace

void convert_elements(const void* src, DType sd, void* dst, DType dd, int64_t n) {
  if (sd == DType::i64 && dd == DType::i64) {
    std::copy_n(static_cast<const int64_t*>(src), n, static_cast<int64_t*>(dst));
    return;
  }
  if (sd == DType::f32) {
    const float* s = static_cast<const float*>(src);
    switch (dd) {
      case DType::bf16: return from_f32(s, dst, n, [](float x) { return float_to_bf16_bits(x); });
      case DType::f16: return from_f32(s, dst, n, [](float x) { return float_to_f16_bits(x); });
      case DType::e4m3: return from_f32(s, dst, n, [](float x) { return float_to_e4m3(x, true); });
      case DType::e5m2: return from_f32(s, dst, n, [](float x) { return float_to_e5m2(x, true); });
      default: break;
    }
  }
  if (dd == DType::f32) {
    float* d = static_cast<float*>(dst);
    switch (sd) {
      case DType::bf16: return to_f32<uint16_t>(src, d, n, [](uint16_t b) { return bf16_bits_to_float(b); });
      case DType::f16: return to_f32<uint16_t>(src, d, n, [](uint16_t b) { return f16_bits_to_float(b); });
      case DType::e4m3: {
        const uint32_t* table = fp8_decode_tables().e4m3;
        return to_f32<uint8_t>(src, d, n, [table](uint8_t b) { return detail::bits_float(table[b]); });
      }
      case DType::e5m2: {
        const uint32_t* table = fp8_decode_tables().e5m2;
        return to_f32<uint8_t>(src, d, n, [table](uint8_t b) { return detail::bits_float(table[b]); });
      }
      default: break;
    }
  }
#pragma omp parallel for if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) store_double(dst, dd, i, load_double(src, sd, i));
}

}  // namespace octet
