// Checks octet's narrow-float conversions bit for bit against the host-side reference
// functions of the CUDA toolkit headers (compiled here as plain host C++).
#include "core/float_formats.h"

#include <gtest/gtest.h>

#if !__has_include(<cuda_fp8.h>)
// The references are the CUDA toolkit's own headers; without the toolkit there is nothing to
// compare against, so say so instead of passing silently.
TEST(FloatFormats, NeedsTheCudaToolkitHeaders) {
  GTEST_SKIP() << "cuda_fp8.h not found: install the CUDA toolkit to compare conversions with it bit for bit";
}
#else

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using namespace octet;

uint32_t fbits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float bitsf(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
uint64_t dbits(double d) { uint64_t u; std::memcpy(&u, &d, 8); return u; }
double bitsd(uint64_t u) { double d; std::memcpy(&d, &u, 8); return d; }

// ---- CUDA references, reduced to raw bits.

uint16_t ref_float_to_bf16(float x) { return __nv_bfloat16_raw(__float2bfloat16_rn(x)).x; }
uint16_t ref_double_to_bf16(double x) { return __nv_bfloat16_raw(__double2bfloat16(x)).x; }
float ref_bf16_to_float(uint16_t b) {
  __nv_bfloat16_raw r; r.x = b;
  return __bfloat162float(__nv_bfloat16(r));
}
uint16_t ref_float_to_f16(float x) { return __half_raw(__float2half_rn(x)).x; }
uint16_t ref_double_to_f16(double x) { return __half_raw(__double2half(x)).x; }
float ref_f16_to_float(uint16_t h) {
  __half_raw r; r.x = h;
  return __half2float(__half(r));
}
__nv_saturation_t sat_mode(bool s) { return s ? __NV_SATFINITE : __NV_NOSAT; }
uint8_t ref_float_to_e4m3(float x, bool s) { return __nv_cvt_float_to_fp8(x, sat_mode(s), __NV_E4M3); }
uint8_t ref_float_to_e5m2(float x, bool s) { return __nv_cvt_float_to_fp8(x, sat_mode(s), __NV_E5M2); }
uint8_t ref_double_to_e4m3(double x, bool s) { return __nv_cvt_double_to_fp8(x, sat_mode(s), __NV_E4M3); }
uint8_t ref_double_to_e5m2(double x, bool s) { return __nv_cvt_double_to_fp8(x, sat_mode(s), __NV_E5M2); }
float ref_e4m3_to_float(uint8_t v) { return __half2float(__half(__nv_cvt_fp8_to_halfraw(v, __NV_E4M3))); }
float ref_e5m2_to_float(uint8_t v) { return __half2float(__half(__nv_cvt_fp8_to_halfraw(v, __NV_E5M2))); }

// ---- Mismatch collection: cheap on success, hex report of the first few failures.

class Mismatches {
 public:
  explicit Mismatches(const char* what) : what_(what) {}
  void add(const std::string& msg) {
    if (count_++ < 16) ADD_FAILURE() << what_ << ": " << msg;
  }
  ~Mismatches() { EXPECT_EQ(count_, 0u) << what_ << ": total mismatches"; }

 private:
  const char* what_;
  size_t count_ = 0;
};

std::string hex(uint64_t v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*" PRIX64, digits, v);
  return buf;
}

// ---- Input sets.

std::vector<float> float_edge_cases() {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {
      0.f, 1.f, 1.5f, 2.f, 3.f, 0.1f, 1.f / 3.f,
      448.f, 464.f, 480.f, 496.f, 512.f, 57344.f, 61440.f, 65504.f, 65520.f, 65536.f,
      FLT_MAX, FLT_MIN, FLT_TRUE_MIN, inf,
      // bf16 ties to even: 1 + half ulp (even -> down) and 1 + 3 half ulps (odd -> up).
      1.f + 0x1p-8f, 1.f + 3 * 0x1p-8f, 0x1p100f * (1.f + 0x1p-8f), 0x1p-120f * (1.f + 0x1p-8f),
      // f16 ties.
      1.f + 0x1p-11f, 1.f + 3 * 0x1p-11f, 1024.f + 0.5f, 1024.f + 1.5f, 0x1p-14f * (1.f + 0x1p-11f),
      // e4m3 ties.
      1.f + 0x1p-4f, 1.f + 3 * 0x1p-4f, 256.f + 16.f, 256.f + 48.f, 0x1p-6f * (1.f + 0x1p-4f),
      // e5m2 ties.
      1.f + 0x1p-3f, 1.f + 3 * 0x1p-3f, 0x1p-14f * (1.f + 0x1p-3f),
      // subnormal boundaries: min subnormal, min subnormal/2, min normal, and halfway
      // between the largest subnormal and the min normal (rounds up to min normal).
      0x1p-9f, 0x1p-10f, 0x1p-6f, 0x1p-6f - 0x1p-10f, 7 * 0x1p-9f, 1.5f * 0x1p-9f, 2.5f * 0x1p-9f,
      0x1p-16f, 0x1p-17f, 0x1p-14f, 0x1p-14f - 0x1p-17f, 3 * 0x1p-16f, 1.5f * 0x1p-16f,
      0x1p-24f, 0x1p-25f, 0x1p-14f - 0x1p-25f, 1.5f * 0x1p-24f, 2.5f * 0x1p-24f,
      0x1p-133f, 0x1p-134f, 0x1p-126f - 0x1p-134f, 1.5f * 0x1p-133f, 2.5f * 0x1p-133f,
  };
  // Neighbours (one float ulp away) of everything above.
  const size_t n = v.size();
  for (size_t i = 0; i < n; ++i) {
    const uint32_t b = fbits(v[i]);
    if (b != 0 && b != 0x7F800000u) v.push_back(bitsf(b - 1));
    if (b < 0x7F800000u) v.push_back(bitsf(b + 1));
  }
  // NaNs with various payloads and both signs.
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0x7FFFFFFFu, 0x7FA00000u, 0x7F900000u,
                       0x7FE00000u, 0x7F800100u, 0x7FD55555u})
    v.push_back(bitsf(nan));
  // Negatives of everything.
  const size_t m = v.size();
  for (size_t i = 0; i < m; ++i) v.push_back(bitsf(fbits(v[i]) ^ 0x80000000u));
  return v;
}

std::vector<float> float_sweep() {
  std::vector<float> v = float_edge_cases();
  // Every multiple of 2^12 and its two neighbours: this grid contains every exactly
  // representable value and every tie point of all four formats (f16 drops 13 fraction
  // bits, the others more), across the whole 32-bit space.
  for (uint64_t k = 0; k < (uint64_t(1) << 20); ++k) {
    const uint32_t b = static_cast<uint32_t>(k << 12);
    v.push_back(bitsf(b));
    v.push_back(bitsf(b + 1));
    v.push_back(bitsf(b - 1));
  }
  std::mt19937 rng(12345);
  for (int i = 0; i < 2'000'000; ++i) v.push_back(bitsf(static_cast<uint32_t>(rng())));
  return v;
}

std::vector<double> double_edge_cases() {
  std::vector<double> v;
  for (float f : float_edge_cases()) v.push_back(static_cast<double>(f));
  const double inf = std::numeric_limits<double>::infinity();
  const double e = 0x1p-40;  // a perturbation float cannot represent near these values
  for (double base : {448.0, 464.0, 480.0, 57344.0, 61440.0, 65504.0, 65520.0, 0x1p-10, 0x1p-17,
                      0x1p-25, 0x1p-134, 0x1p-6 - 0x1p-10, 0x1p-14 - 0x1p-17,
                      0x1p-14 - 0x1p-25})
    for (double d : {base, base * (1 + e), base * (1 - e), base * (1 + 0x1p-52), base * (1 - 0x1p-53)})
      v.push_back(d);
  // Values where rounding through float first would give the wrong answer: a tie of the
  // target plus a tail below float precision. Correct single rounding goes up.
  for (double t : {0x1p-8, 0x1p-11, 0x1p-4, 0x1p-3})
    for (double scale : {1.0, 0x1p-3, 0x1p5})
      v.push_back(scale * (1.0 + t + 0x1p-40));
  v.push_back(0x1p-25 + 0x1p-60);  // just above half the f16 min subnormal -> min subnormal
  v.push_back(0x1p-10 + 0x1p-60);  // same for e4m3
  v.push_back(0x1p-17 + 0x1p-60);  // same for e5m2
  v.push_back(0x1p-134 + 0x1p-170);  // same for bf16
  v.push_back(static_cast<double>(FLT_MAX) * 1.5);  // beyond float range
  v.push_back(DBL_MAX);
  v.push_back(DBL_MIN);
  v.push_back(bitsd(1));  // smallest double subnormal
  v.push_back(inf);
  for (uint64_t nan : {0x7FF8000000000000ull, 0x7FF0000000000001ull, 0x7FFFFFFFFFFFFFFFull,
                       0x7FF4000000000000ull, 0x7FFC000000000000ull, 0x7FF2000000000000ull,
                       0x7FF0000100000000ull})
    v.push_back(bitsd(nan));
  const size_t m = v.size();
  for (size_t i = 0; i < m; ++i) v.push_back(bitsd(dbits(v[i]) ^ 0x8000000000000000ull));
  return v;
}

std::vector<double> double_sweep() {
  std::vector<double> v = double_edge_cases();
  std::mt19937_64 rng(67890);
  auto make = [](uint64_t sign, int unbiased_exp, uint64_t frac) {
    return bitsd((sign << 63) | (static_cast<uint64_t>(unbiased_exp + 1023) << 52) |
                 (frac & 0xFFFFFFFFFFFFFull));
  };
  for (int i = 0; i < 400'000; ++i) {
    const uint64_t r = rng();
    // Where fp8 and f16 live: from well below their subnormals to beyond their overflow.
    const int e_narrow = static_cast<int>(rng() % 52) - 30;    // [-30, 21]
    const int e_wide = static_cast<int>(rng() % 300) - 155;    // [-155, 144], bf16's range
    v.push_back(make(r >> 63, e_narrow, rng()));
    v.push_back(make(r >> 63, e_wide, rng()));
    // Structured fraction: random high bits, then at a random position p exactly the
    // bit patterns 1000..., 1000...01, 0111..., 0000... below it. Sweeping p puts ties
    // and near-ties at every rounding position, including the shifted positions of
    // subnormal results.
    const int p = static_cast<int>(rng() % 53);
    const uint64_t high = p >= 52 ? 0 : (rng() >> p) << p;  // bits at and above p kept
    const uint64_t half = p == 0 ? 0 : uint64_t(1) << (p - 1);
    const uint64_t below = half == 0 ? 0 : half - 1;
    const int e = (r & 1) ? e_narrow : e_wide;
    v.push_back(make(r >> 63, e, high | half));
    v.push_back(make(r >> 63, e, high | half | (below ? 1 : 0)));
    v.push_back(make(r >> 63, e, high | below));
  }
  for (int i = 0; i < 500'000; ++i) v.push_back(bitsd(rng()));  // anything at all
  return v;
}

// Reuse the (fairly large) input sets across tests.
const std::vector<float>& floats() { static const auto v = float_sweep(); return v; }
const std::vector<double>& doubles() { static const auto v = double_sweep(); return v; }

template <typename Mine, typename Ref>
void check_float_encoder(const char* what, int digits, Mine mine, Ref ref) {
  Mismatches mm(what);
  for (float x : floats()) {
    const uint32_t a = mine(x), b = ref(x);
    if (a != b)
      mm.add("input " + hex(fbits(x), 8) + " -> octet " + hex(a, digits) + ", cuda " + hex(b, digits));
  }
}

template <typename Mine, typename Ref>
void check_double_encoder(const char* what, int digits, Mine mine, Ref ref) {
  Mismatches mm(what);
  for (double x : doubles()) {
    const uint32_t a = mine(x), b = ref(x);
    if (a != b)
      mm.add("input " + hex(dbits(x), 16) + " -> octet " + hex(a, digits) + ", cuda " + hex(b, digits));
  }
}

template <typename Mine, typename Ref>
void check_decoder(const char* what, uint32_t ncodes, int digits, Mine mine, Ref ref) {
  Mismatches mm(what);
  for (uint32_t c = 0; c < ncodes; ++c) {
    const float a = mine(c), b = ref(c);
    // Exact bits, NaNs included: CUDA defines the NaN it returns, so must we.
    if (fbits(a) != fbits(b))
      mm.add("code " + hex(c, digits) + " -> octet " + hex(fbits(a), 8) + ", cuda " + hex(fbits(b), 8));
  }
}

// ---------------------------------------------------------------- decoding

TEST(FloatFormats, DecodeE4M3AllCodes) {
  check_decoder("e4m3_to_float", 256, 2, [](uint32_t c) { return e4m3_to_float(uint8_t(c)); },
                [](uint32_t c) { return ref_e4m3_to_float(uint8_t(c)); });
  EXPECT_EQ(e4m3_to_float(0x7E), kE4M3Max);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_TRUE(e4m3_to_float(0xFF) != e4m3_to_float(0xFF));
}

TEST(FloatFormats, DecodeE5M2AllCodes) {
  check_decoder("e5m2_to_float", 256, 2, [](uint32_t c) { return e5m2_to_float(uint8_t(c)); },
                [](uint32_t c) { return ref_e5m2_to_float(uint8_t(c)); });
  EXPECT_EQ(e5m2_to_float(0x7B), kE5M2Max);
  EXPECT_EQ(e5m2_to_float(0x01), 0x1p-16f);
  EXPECT_EQ(e5m2_to_float(0xFC), -std::numeric_limits<float>::infinity());
}

TEST(FloatFormats, DecodeBf16AllCodes) {
  check_decoder("bf16_bits_to_float", 65536, 4,
                [](uint32_t c) { return bf16_bits_to_float(uint16_t(c)); },
                [](uint32_t c) { return ref_bf16_to_float(uint16_t(c)); });
}

TEST(FloatFormats, DecodeF16AllCodes) {
  check_decoder("f16_bits_to_float", 65536, 4,
                [](uint32_t c) { return f16_bits_to_float(uint16_t(c)); },
                [](uint32_t c) { return ref_f16_to_float(uint16_t(c)); });
}

// ---------------------------------------------------------------- encoding from float

TEST(FloatFormats, EncodeFloatToBf16) {
  check_float_encoder("float_to_bf16_bits", 4, [](float x) { return float_to_bf16_bits(x); },
                      ref_float_to_bf16);
}

TEST(FloatFormats, EncodeFloatToF16) {
  check_float_encoder("float_to_f16_bits", 4, [](float x) { return float_to_f16_bits(x); },
                      ref_float_to_f16);
}

TEST(FloatFormats, EncodeFloatToE4M3) {
  for (bool sat : {true, false})
    check_float_encoder(sat ? "float_to_e4m3 satfinite" : "float_to_e4m3 nosat", 2,
                        [sat](float x) { return float_to_e4m3(x, sat); },
                        [sat](float x) { return ref_float_to_e4m3(x, sat); });
}

TEST(FloatFormats, EncodeFloatToE5M2) {
  for (bool sat : {true, false})
    check_float_encoder(sat ? "float_to_e5m2 satfinite" : "float_to_e5m2 nosat", 2,
                        [sat](float x) { return float_to_e5m2(x, sat); },
                        [sat](float x) { return ref_float_to_e5m2(x, sat); });
}

// ---------------------------------------------------------------- encoding from double

TEST(FloatFormats, EncodeDoubleToBf16) {
  check_double_encoder("double_to_bf16_bits", 4, [](double x) { return double_to_bf16_bits(x); },
                       ref_double_to_bf16);
}

TEST(FloatFormats, EncodeDoubleToF16) {
  check_double_encoder("double_to_f16_bits", 4, [](double x) { return double_to_f16_bits(x); },
                       ref_double_to_f16);
}

TEST(FloatFormats, EncodeDoubleToE4M3) {
  for (bool sat : {true, false})
    check_double_encoder(sat ? "double_to_e4m3 satfinite" : "double_to_e4m3 nosat", 2,
                         [sat](double x) { return double_to_e4m3(x, sat); },
                         [sat](double x) { return ref_double_to_e4m3(x, sat); });
}

TEST(FloatFormats, EncodeDoubleToE5M2) {
  for (bool sat : {true, false})
    check_double_encoder(sat ? "double_to_e5m2 satfinite" : "double_to_e5m2 nosat", 2,
                         [sat](double x) { return double_to_e5m2(x, sat); },
                         [sat](double x) { return ref_double_to_e5m2(x, sat); });
}

// Spot checks of the documented special-value policy, readable without the sweep.
TEST(FloatFormats, SpecialValuePolicy) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(float_to_e4m3(inf, true), 0x7E);
  EXPECT_EQ(float_to_e4m3(-inf, true), 0xFE);
  EXPECT_EQ(float_to_e4m3(-inf, false), 0xFF);
  EXPECT_EQ(float_to_e4m3(464.f, false), 0x7E);  // tie goes to the even 448
  EXPECT_EQ(float_to_e4m3(bitsf(fbits(464.f) + 1), false), 0x7F);
  EXPECT_EQ(float_to_e5m2(inf, true), 0x7B);
  EXPECT_EQ(float_to_e5m2(-inf, false), 0xFC);
  EXPECT_EQ(float_to_e5m2(61440.f, true), 0x7B);   // tie goes to the even "inf" code -> saturated
  EXPECT_EQ(float_to_e5m2(61440.f, false), 0x7C);
  EXPECT_EQ(float_to_e4m3(-nan, true), 0x7F);  // float NaN sign is dropped
  EXPECT_EQ(double_to_e4m3(-static_cast<double>(nan), true), 0xFF);  // double NaN keeps it
  EXPECT_EQ(float_to_e4m3(-0x1p-11f, true), 0x80);  // underflow keeps the sign
  EXPECT_EQ(float_to_f16_bits(65520.f), 0x7C00);
  EXPECT_EQ(float_to_f16_bits(-nan), 0x7FFF);
  EXPECT_EQ(float_to_bf16_bits(FLT_MAX), 0x7F80);
}

// ---------------------------------------------------------------- round trips

template <typename Decode, typename Encode>
void check_round_trip(const char* what, uint32_t ncodes, int digits, Decode dec, Encode enc,
                      bool (*finite)(uint32_t)) {
  Mismatches mm(what);
  for (uint32_t c = 0; c < ncodes; ++c) {
    if (!finite(c)) continue;
    const uint32_t back = enc(dec(c));
    if (back != c) mm.add("code " + hex(c, digits) + " came back as " + hex(back, digits));
  }
}

bool e4m3_finite(uint32_t c) { return (c & 0x7F) != 0x7F; }
bool e5m2_finite(uint32_t c) { return (c & 0x7C) != 0x7C; }
bool f16_finite(uint32_t c) { return (c & 0x7C00) != 0x7C00; }
bool bf16_finite(uint32_t c) { return (c & 0x7F80) != 0x7F80; }

TEST(FloatFormats, RoundTripEveryFiniteCode) {
  for (bool sat : {true, false}) {
    check_round_trip("e4m3 via float", 256, 2, e4m3_to_float,
                     [sat](float f) { return float_to_e4m3(f, sat); }, e4m3_finite);
    check_round_trip("e4m3 via double", 256, 2, e4m3_to_float,
                     [sat](float f) { return double_to_e4m3(f, sat); }, e4m3_finite);
    check_round_trip("e5m2 via float", 256, 2, e5m2_to_float,
                     [sat](float f) { return float_to_e5m2(f, sat); }, e5m2_finite);
    check_round_trip("e5m2 via double", 256, 2, e5m2_to_float,
                     [sat](float f) { return double_to_e5m2(f, sat); }, e5m2_finite);
  }
  check_round_trip("f16 via float", 65536, 4, f16_bits_to_float,
                   [](float f) { return float_to_f16_bits(f); }, f16_finite);
  check_round_trip("f16 via double", 65536, 4, f16_bits_to_float,
                   [](float f) { return double_to_f16_bits(f); }, f16_finite);
  check_round_trip("bf16 via float", 65536, 4, bf16_bits_to_float,
                   [](float f) { return float_to_bf16_bits(f); }, bf16_finite);
  check_round_trip("bf16 via double", 65536, 4, bf16_bits_to_float,
                   [](float f) { return double_to_bf16_bits(f); }, bf16_finite);
}

// ---------------------------------------------------------------- value types

static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2);
static_assert(sizeof(float8_e4m3) == 1 && sizeof(float8_e5m2) == 1);
static_assert(std::is_trivially_copyable_v<bfloat16> && std::is_standard_layout_v<bfloat16>);
static_assert(std::is_trivially_copyable_v<float16> && std::is_standard_layout_v<float16>);
static_assert(std::is_trivially_copyable_v<float8_e4m3> && std::is_standard_layout_v<float8_e4m3>);
static_assert(std::is_trivially_copyable_v<float8_e5m2> && std::is_standard_layout_v<float8_e5m2>);
static_assert(std::is_trivially_default_constructible_v<bfloat16>);
static_assert(!std::is_convertible_v<float, bfloat16>, "construction from float must be explicit");
static_assert(!std::is_convertible_v<float, float8_e4m3>, "construction from float must be explicit");
static_assert(bfloat16::from_bits(0x3F80).bits == 0x3F80);

TEST(FloatFormats, ValueTypes) {
  EXPECT_EQ(bfloat16(1.f + 0x1p-8f).bits, 0x3F80);  // tie to even
  EXPECT_EQ(float(bfloat16::from_bits(0x4049)), 3.140625f);
  EXPECT_EQ(float16(65520.f).bits, 0x7C00);
  EXPECT_EQ(float(float16::from_bits(0x3C00)), 1.f);
  EXPECT_EQ(float8_e4m3(1000.f).bits, 0x7E);  // saturates by default
  EXPECT_EQ(float8_e4m3(-std::numeric_limits<float>::infinity()).bits, 0xFE);
  EXPECT_EQ(float(float8_e4m3::from_bits(0x7E)), kE4M3Max);
  EXPECT_EQ(float8_e5m2(1e9f).bits, 0x7B);
  EXPECT_EQ(float(float8_e5m2::from_bits(0xBC)), -1.f);
  const float sum = float16(1.5f) + bfloat16(2.f);  // implicit widening participates in arithmetic
  EXPECT_EQ(sum, 3.5f);
}

}  // namespace

#endif  // __has_include(<cuda_fp8.h>)
