// Philox4x32-10 against the published known-answer vectors of its authors (Random123), and the
// statistical shape of rand/randn drawn from it.
#include <gtest/gtest.h>

#include <cmath>

#include "core/philox.h"
#include "core/random.h"
#include "core/tensor.h"

namespace octet {
namespace {

void expect_words(philox::Words got, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  EXPECT_EQ(got.w[0], w0);
  EXPECT_EQ(got.w[1], w1);
  EXPECT_EQ(got.w[2], w2);
  EXPECT_EQ(got.w[3], w3);
}

TEST(Philox, KnownAnswerVectors) {
  expect_words(philox::philox4x32_10({{0, 0, 0, 0}}, 0, 0), 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8);
  expect_words(philox::philox4x32_10({{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, 0xffffffff, 0xffffffff),
               0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd);
  expect_words(philox::philox4x32_10({{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, 0xa4093822, 0x299f31d0),
               0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1);
}

TEST(Philox, BlockWordsUsesSeedAsKeyAndBlockAsCounter) {
  const uint64_t seed = 0x299f31d0a4093822ull, block = 0x85a308d3243f6a88ull;
  const philox::Words w = philox::block_words(seed, block);
  const philox::Words direct = philox::philox4x32_10({{0x243f6a88, 0x85a308d3, 0, 0}}, 0xa4093822, 0x299f31d0);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(w.w[k], direct.w[k]);
}

TEST(Philox, UniformMapsWordsIntoUnitInterval) {
  EXPECT_EQ(philox::uniform(0), 0.0f);
  EXPECT_LT(philox::uniform(0xffffffffu), 1.0f);
  EXPECT_GT(philox::uniform_open_zero(0), 0.0f);
  EXPECT_EQ(philox::uniform_open_zero(0xffffffffu), 1.0f);
}

TEST(Generator, SameSeedSameStreamAndOffsetsAdvance) {
  Generator a(42), b(42), c(43);
  const auto x = rand({1000}, a).to_vector<float>();
  const auto y = rand({1000}, b).to_vector<float>();
  const auto z = rand({1000}, c).to_vector<float>();
  EXPECT_EQ(x, y);
  EXPECT_NE(x, z);
  EXPECT_EQ(a.offset(), 250u);  // four values per block
  const auto next = rand({1000}, a).to_vector<float>();
  EXPECT_NE(x, next);
  // Element i comes from block offset + i/4, word i%4, whatever the call's size.
  Generator d(42);
  d.set_state(42, 250);
  const auto replay = rand({7}, d).to_vector<float>();
  for (int i = 0; i < 7; ++i) EXPECT_EQ(replay[i], next[i]);
}

TEST(Generator, RandIsUniformAndRandnIsStandardNormal) {
  Generator gen(7);
  const auto u = rand({200000}, gen, DType::f64).to_vector<double>();
  double mean = 0;
  for (double v : u) {
    ASSERT_GE(v, 0.0);
    ASSERT_LT(v, 1.0);
    mean += v;
  }
  mean /= u.size();
  EXPECT_NEAR(mean, 0.5, 0.005);  // ~7 standard errors of 0.29/sqrt(2e5)

  const auto n = randn({200000}, gen, DType::f64).to_vector<double>();
  double m1 = 0, m2 = 0, m4 = 0;
  for (double v : n) m1 += v;
  m1 /= n.size();
  for (double v : n) {
    m2 += (v - m1) * (v - m1);
    m4 += std::pow(v - m1, 4);
  }
  m2 /= n.size();
  m4 /= n.size();
  EXPECT_NEAR(m1, 0.0, 0.015);
  EXPECT_NEAR(m2, 1.0, 0.02);
  EXPECT_NEAR(m4 / (m2 * m2), 3.0, 0.1);  // kurtosis of a normal
}

TEST(Generator, ManualSeedResetsTheDefaultGenerator) {
  manual_seed(5);
  const auto a = randn({16}).to_vector<float>();
  manual_seed(5);
  const auto b = randn({16}).to_vector<float>();
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace octet
