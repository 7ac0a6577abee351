// Tensor metadata, views, factories, conversions and printing.
#include <gtest/gtest.h>

#include <cmath>

#include <sstream>

#include "core/float_formats.h"
#include "core/grad_mode.h"
#include "core/tensor.h"

namespace octet {
namespace {

TEST(DType, SizesNamesAndRoundTrip) {
  const std::vector<std::pair<DType, size_t>> sizes = {{DType::f32, 4}, {DType::f64, 8}, {DType::bf16, 2},
                                                       {DType::f16, 2}, {DType::e4m3, 1}, {DType::e5m2, 1},
                                                       {DType::i32, 4}, {DType::i64, 8}, {DType::u8, 1}};
  for (auto [d, size] : sizes) {
    EXPECT_EQ(dtype_size(d), size) << dtype_name(d);
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
  }
  EXPECT_TRUE(is_fp8(DType::e5m2));
  EXPECT_FALSE(is_floating(DType::i64));
  EXPECT_THROW(dtype_from_name("float8"), Error);
}

TEST(Device, ParsesAndPrints) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3"), Device::cuda(3));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  for (const char* bad : {"gpu", "cuda:", "cuda:-1", "cuda:1x"}) EXPECT_THROW(Device::parse(bad), Error) << bad;
}

TEST(Tensor, FactoriesFillValues) {
  EXPECT_EQ(zeros({2, 3}).to_vector<float>(), std::vector<float>(6, 0.f));
  EXPECT_EQ(ones({4}, DType::i32).to_vector<int32_t>(), std::vector<int32_t>(4, 1));
  EXPECT_EQ(full({3}, -2.5, DType::f64).to_vector<double>(), std::vector<double>(3, -2.5));
  EXPECT_EQ(arange(5).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(1.0, 2.0, 0.25, DType::f32).to_vector<float>(), (std::vector<float>{1, 1.25, 1.5, 1.75}));
  const Tensor t = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}, DType::f32);
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_THROW(from_vector<float>({1, 2, 3}, {2, 2}), Error);
  EXPECT_THROW(empty({2, -1}), Error);
}

TEST(Tensor, HostMemoryIs64ByteAligned) {
  for (int64_t n : {1, 3, 17, 1000}) {
    const Tensor t = empty({n}, DType::u8);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u) << n;
  }
}

TEST(Tensor, ViewsShareStorageAtAnOffset) {
  Tensor t = arange(0.0, 12.0, 1.0, DType::f32).reshape({4, 3});
  Tensor rows = t.narrow(1, 2);  // rows 1 and 2
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  EXPECT_EQ(rows.storage_offset(), 3 * sizeof(float));
  EXPECT_EQ(rows.storage(), t.storage());
  EXPECT_EQ(rows.to_vector<float>(), (std::vector<float>{3, 4, 5, 6, 7, 8}));
  rows.data<float>()[0] = 100.f;  // writes through to the base
  EXPECT_EQ(t.to_vector<float>()[3], 100.f);
  EXPECT_EQ(t.select(3).to_vector<float>(), (std::vector<float>{9, 10, 11}));
  EXPECT_EQ(t.select(3).shape(), (Shape{3}));
  EXPECT_EQ(t.reshape({-1}).shape(), (Shape{12}));
  EXPECT_EQ(t.reshape({2, -1, 3}).shape(), (Shape{2, 2, 3}));
  EXPECT_THROW(t.reshape({5, -1}), Error);
  EXPECT_THROW(t.reshape({-1, -1}), Error);
  EXPECT_THROW(t.narrow(3, 2), Error);
}

TEST(Tensor, ViewsOfOneFlatBufferAsFsdpUsesThem) {
  // Two "parameters" laid over one flat buffer, as FSDP's flat parameter does.
  Tensor flat = zeros({10});
  Tensor w = flat.narrow(0, 6).reshape({2, 3});
  Tensor b = flat.narrow(6, 4);
  w.fill_(1.0);
  b.fill_(2.0);
  EXPECT_EQ(flat.to_vector<float>(), (std::vector<float>{1, 1, 1, 1, 1, 1, 2, 2, 2, 2}));
  // A view built straight from storage and an offset, and bounds checking on it.
  Tensor again(flat.storage(), 6 * sizeof(float), Shape{4}, DType::f32);
  EXPECT_EQ(again.to_vector<float>(), std::vector<float>(4, 2.f));
  EXPECT_THROW(Tensor(flat.storage(), 8 * sizeof(float), Shape{4}, DType::f32), Error);
}

TEST(Tensor, ConversionsRoundToTheFormat) {
  const Tensor x = from_vector<float>({1.0f, 1.00390625f, 1.01171875f, 500.f, -1e-9f, 3.14159f}, {6});
  const std::vector<float> bf16 = x.to(DType::bf16).to_vector<float>();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(bf16[i], bf16_bits_to_float(float_to_bf16_bits(x.to_vector<float>()[i])));
  EXPECT_EQ(bf16[1], 1.0f);  // the tie rounds to even
  const std::vector<float> e4m3 = x.to(DType::e4m3).to_vector<float>();
  EXPECT_EQ(e4m3[3], 448.f);  // saturates instead of becoming NaN
  EXPECT_EQ(e4m3[5], 3.25f);
  // Integral conversions truncate toward zero.
  EXPECT_EQ(from_vector<double>({-1.7, 2.9}, {2}).to(DType::i64).to_vector<int64_t>(), (std::vector<int64_t>{-1, 2}));
  // to() with the same dtype is the same tensor; a different dtype is a copy.
  EXPECT_TRUE(x.to(DType::f32).is_same(x));
  EXPECT_NE(x.to(DType::f64).storage(), x.storage());
}

TEST(Tensor, CopyCloneFillItem) {
  Tensor a = from_vector<float>({1, 2, 3, 4}, {2, 2});
  Tensor c = a.clone();
  c.fill_(7);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  Tensor d = zeros({4}, DType::f64);
  d.copy_(a);  // same numel, converts dtype
  EXPECT_EQ(d.to_vector<double>(), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_THROW(d.copy_(zeros({3})), Error);
  EXPECT_EQ(full({1}, 2.5, DType::bf16).item(), 2.5);
  EXPECT_EQ(full({}, 3, DType::i32).item<int>(), 3);
  EXPECT_THROW(a.item(), Error);
}

TEST(Tensor, FillWritesEveryElementOfEveryDtypeAndOnlyTheView) {
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::e4m3, DType::e5m2, DType::i32,
                      DType::i64, DType::u8}) {
    for (double value : {0.0, 3.0, -1.5}) {
      if (value < 0 && dtype == DType::u8) continue;
      const double expected = is_integral(dtype) ? std::trunc(value) : value;  // all exact in every format
      Tensor t = full({5, 3}, 6.0, dtype);
      t.narrow(1, 3).fill_(value);  // rows 1..3 only, at a byte offset
      const std::vector<double> got = t.to_vector<double>();
      for (size_t i = 0; i < got.size(); ++i) {
        const bool inside = i >= 3 && i < 12;
        EXPECT_EQ(got[i], inside ? expected : 6.0) << dtype_name(dtype) << " value " << value << " element " << i;
      }
    }
  }
}

TEST(Tensor, PrintsShapeDtypeAndValues) {
  std::ostringstream os;
  os << from_vector<float>({1.5f, -2.f, 3.f, 4.f}, {2, 2});
  const std::string s = os.str();
  EXPECT_NE(s.find("f32[2, 2] on cpu"), std::string::npos) << s;
  EXPECT_NE(s.find("1.5"), std::string::npos) << s;
  EXPECT_NE(s.find("-2"), std::string::npos) << s;
  std::ostringstream big;
  big << arange(0.0, 100.0, 1.0, DType::f32);
  EXPECT_NE(big.str().find("..."), std::string::npos) << big.str();
  EXPECT_NE(big.str().find("99"), std::string::npos) << big.str();
}

TEST(Tensor, UndefinedTensorsExplainThemselves) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  try {
    (void)t.dtype();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("undefined"), std::string::npos);
  }
}

TEST(Errors, NameTheOperationShapesDtypesAndDevices) {
  const Tensor x = zeros({2, 3});
  try {
    (void)x.data<double>();
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("data<f64>"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32[2, 3] on cpu"), std::string::npos) << msg;
    EXPECT_NE(msg.find(".to(f64)"), std::string::npos) << msg;  // the fix
  }
  try {
    (void)x.reshape({4, 2});
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("reshape"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4, 2]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("core/tensor.cpp"), std::string::npos) << msg;  // where it was raised
  }
}

TEST(Errors, CoreViewsRefuseToDropAGraph) {
  Tensor p = zeros({2, 3});
  p.requires_grad_();
  EXPECT_THROW((void)p.reshape({6}), Error);
  EXPECT_THROW((void)p.to(DType::bf16), Error);
  NoGradGuard no_grad;
  EXPECT_EQ(p.reshape({6}).shape(), (Shape{6}));  // fine when nothing is recorded
}

TEST(Cuda, WithoutADeviceTheErrorSaysSo) {
  if (cuda::is_available()) GTEST_SKIP() << "a CUDA device is present; this checks the no-device error";
  try {
    (void)zeros({2}, DType::f32, Device::cuda(0));
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("CUDA") != std::string::npos || msg.find("cuda") != std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace octet
