#include "nn/safetensors.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/random.h"
#include "tests/testing.h"

namespace octet::nn {
namespace {

using octet::testing::slurp;
using octet::testing::spit;

namespace fs = std::filesystem;
using testing::throws_with;

// The 8-byte little-endian length, spelled out byte by byte (independent of the host's layout).
std::string length_prefix(uint64_t n) {
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return bytes;
}

// A file with this header text (unpadded, as other writers may leave it) and data buffer.
std::string make_file(const std::string& header, const std::string& buffer) {
  return length_prefix(header.size()) + header + buffer;
}

// A tensor whose bytes are uniformly random, so every bit pattern (NaN payloads, subnormals,
// negative integers) has to survive the round trip.
Tensor random_bits(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = empty(shape, dtype);
  Generator gen(seed);
  const std::vector<double> u = rand({static_cast<int64_t>(t.nbytes())}, gen, DType::f64).to_vector<double>();
  auto* bytes = static_cast<unsigned char*>(t.data_ptr());
  for (size_t i = 0; i < t.nbytes(); ++i) bytes[i] = static_cast<unsigned char>(u[i] * 256.0);
  return t;
}

std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.data_ptr()), t.nbytes());
}

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("octet_safetensors_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(Safetensors, RoundTripsEveryDtypeBitwise) {
  const std::vector<DType> dtypes = {DType::f64,  DType::f32, DType::bf16, DType::f16, DType::e4m3,
                                     DType::e5m2, DType::i64, DType::i32,  DType::u8};
  StateDict saved;
  uint64_t seed = 1;
  for (DType d : dtypes) {
    saved[std::string("blocks.") + dtype_name(d) + ".weight"] = random_bits({3, 5, 2}, d, seed++);
    saved[std::string("blocks.") + dtype_name(d) + ".bias"] = random_bits({7}, d, seed++);
  }
  saved["scalar"] = random_bits({}, DType::f32, seed++);
  saved["empty"] = empty({0, 4}, DType::bf16);
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "µ-step 3 ✓"}, {"", ""}};
  save_safetensors(path("all.safetensors"), saved, metadata);

  const SafetensorsFile loaded = load_safetensors(path("all.safetensors"));
  EXPECT_EQ(loaded.metadata, metadata);
  ASSERT_EQ(loaded.tensors.size(), saved.size());
  for (const auto& [name, tensor] : saved) {
    ASSERT_TRUE(loaded.tensors.count(name)) << name;
    const Tensor& back = loaded.tensors.at(name);
    EXPECT_EQ(back.dtype(), tensor.dtype()) << name;
    EXPECT_EQ(back.shape(), tensor.shape()) << name;
    EXPECT_TRUE(back.device().is_cpu());
    EXPECT_EQ(bytes_of(back), bytes_of(tensor)) << name;
  }
  // The header is padded so the data buffer starts 8-byte aligned.
  const std::string file = slurp(dir_ / "all.safetensors");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = header_bytes << 8 | static_cast<unsigned char>(file[i]);
  EXPECT_EQ(header_bytes % 8, 0u);
}

TEST_F(Safetensors, EmptyDictionaryRoundTrips) {
  save_safetensors(path("none.safetensors"), {});
  EXPECT_EQ(slurp(dir_ / "none.safetensors"), length_prefix(8) + "{}      ");
  const SafetensorsFile loaded = load_safetensors(path("none.safetensors"));
  EXPECT_TRUE(loaded.tensors.empty());
  EXPECT_TRUE(loaded.metadata.empty());
}

// Worked by hand: f32 1.0 = 0x3F800000, f32 -2.5 = 0xC0200000, i64 -2 = 0xFFFFFFFFFFFFFFFE,
// bf16 1.0 = 0x3F80, bf16 -0.5 = 0xBF00, all little-endian. The JSON is 202 bytes, padded with six
// spaces to 208 = 0xD0.
const std::string kHandHeader =
    R"({"__metadata__":{"format":"pt"},"bias":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
    R"("idx":{"dtype":"I64","shape":[1],"data_offsets":[8,16]},"w":{"dtype":"BF16","shape":[2,1],)"
    R"("data_offsets":[16,20]}})"
    "      ";
const std::string kHandBuffer = std::string("\x00\x00\x80\x3F\x00\x00\x20\xC0", 8) +
                                std::string("\xFE\xFF\xFF\xFF\xFF\xFF\xFF\xFF", 8) +
                                std::string("\x80\x3F\x00\xBF", 4);

TEST_F(Safetensors, WritesExactlyTheHandComputedBytes) {
  ASSERT_EQ(kHandHeader.size(), 208u);
  StateDict tensors;
  tensors["w"] = from_vector<double>({1.0, -0.5}, {2, 1}, DType::bf16);
  tensors["bias"] = from_vector<float>({1.0f, -2.5f}, {2});
  tensors["idx"] = from_vector<int64_t>({-2}, {1});
  save_safetensors(path("hand.safetensors"), tensors, {{"format", "pt"}});
  EXPECT_EQ(slurp(dir_ / "hand.safetensors"),
            std::string("\xD0\0\0\0\0\0\0\0", 8) + kHandHeader + kHandBuffer);
}

TEST_F(Safetensors, ReadsAHandMadeFile) {
  spit(dir_ / "hand.safetensors", std::string("\xD0\0\0\0\0\0\0\0", 8) + kHandHeader + kHandBuffer);
  const SafetensorsFile f = load_safetensors(path("hand.safetensors"));
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.tensors.at("bias").dtype(), DType::f32);
  EXPECT_EQ(f.tensors.at("bias").to_vector<double>(), (std::vector<double>{1.0, -2.5}));
  EXPECT_EQ(f.tensors.at("idx").dtype(), DType::i64);
  EXPECT_EQ(f.tensors.at("idx").to_vector<int64_t>(), std::vector<int64_t>{-2});
  EXPECT_EQ(f.tensors.at("w").dtype(), DType::bf16);
  EXPECT_EQ(f.tensors.at("w").shape(), (Shape{2, 1}));
  EXPECT_EQ(f.tensors.at("w").to_vector<double>(), (std::vector<double>{1.0, -0.5}));
}

// Other writers lay tensors out in their own order, space their JSON and skip padding.
TEST_F(Safetensors, ReadsAnyBufferOrderAndUnpaddedSpacedJson) {
  const std::string header =
      R"({ "b": {"data_offsets": [0, 2], "shape": [2], "dtype": "U8"},  "a": {"dtype": "F8_E4M3", "shape": [], )"
      R"("data_offsets": [2, 3]}, "c": {"dtype": "I32", "shape": [0, 5], "data_offsets": [3, 3]} })";
  spit(dir_ / "other.safetensors", make_file(header, std::string("\x07\xF0\x38", 3)));
  const SafetensorsFile f = load_safetensors(path("other.safetensors"));
  EXPECT_EQ(f.tensors.at("b").to_vector<int64_t>(), (std::vector<int64_t>{7, 240}));
  EXPECT_EQ(f.tensors.at("a").shape(), Shape{});
  EXPECT_EQ(f.tensors.at("a").to_vector<double>(), std::vector<double>{1.0});  // E4M3 0x38 = 2^0
  EXPECT_EQ(f.tensors.at("c").shape(), (Shape{0, 5}));
  EXPECT_TRUE(f.metadata.empty());
}

// The digest a load reports covers the whole file in file order, whatever order the header lists the
// tensors in ("b" before "a" here, the reverse of their names), and equals what the save reported.
TEST_F(Safetensors, LoadAndSaveReportTheDigestOfTheWholeFile) {
  const std::string header =
      R"({"b": {"data_offsets": [0, 2], "shape": [2], "dtype": "U8"}, "a": {"dtype": "U8", "shape": [1], )"
      R"("data_offsets": [2, 3]}})";
  const std::string bytes = make_file(header, std::string("\x07\xF0\x38", 3));
  spit(dir_ / "other.safetensors", bytes);
  const SafetensorsFile f = load_safetensors(path("other.safetensors"));
  EXPECT_EQ(f.digest, digest_of(bytes));

  StateDict tensors;
  tensors["w"] = random_bits({3, 5}, DType::f32, 4);
  tensors["b"] = random_bits({7}, DType::bf16, 5);
  const FileDigest saved = save_safetensors(path("saved.safetensors"), tensors, {{"format", "pt"}});
  EXPECT_EQ(saved, digest_of(slurp(dir_ / "saved.safetensors")));
  EXPECT_EQ(load_safetensors(path("saved.safetensors")).digest, saved);
}

// Each corrupt header below names the file, what is wrong, and the fix.
TEST_F(Safetensors, EveryCorruptionIsNamed) {
  const std::string file = path("bad.safetensors");
  auto expect_error = [&](const std::string& bytes, std::initializer_list<std::string> parts,
                          bool corrupt = true) {
    spit(file, bytes);
    std::vector<std::string> all(parts);
    all.push_back(file);
    if (corrupt) all.push_back("corrupt or truncated: save it again, or pass another file");
    bool ok = false;
    try {
      load_safetensors(file);
    } catch (const Error& e) {
      ok = true;
      for (const std::string& p : all)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << p << " in " << e.what();
    }
    EXPECT_TRUE(ok) << "no octet::Error for " << *parts.begin();
  };
  const std::string f32x2 = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
  const std::string eight(8, '\x11');

  expect_error("abc", {"3 bytes long, too short"});
  expect_error(length_prefix(200'000'000) + "{}", {"header length 200000000 is absurd"});
  expect_error(length_prefix(100) + "{}        ", {"header length is 100 bytes but only 10 bytes follow"});
  expect_error(make_file(R"({"a": )", ""), {"not valid JSON"});
  expect_error(make_file("[1, 2]", ""), {"header is array, not a JSON object"});
  expect_error(make_file(R"({"a": 5})", ""), {"entry of tensor 'a' is 5, not a JSON object"});
  expect_error(make_file(R"({"a": {"shape":[2],"data_offsets":[0,8]}})", eight),
               {"tensor 'a' has no \"dtype\""});
  expect_error(make_file(R"({"a": {"dtype":"F32","data_offsets":[0,8]}})", eight),
               {"tensor 'a' has no \"shape\""});
  expect_error(make_file(R"({"a": {"dtype":"F32","shape":[2]}})", eight),
               {"tensor 'a' has no \"data_offsets\""});
  expect_error(make_file(R"({"a": {"dtype":7,"shape":[2],"data_offsets":[0,8]}})", eight),
               {"\"dtype\": 7, not a string"});
  expect_error(make_file(R"({"a": {"dtype":"F32","shape":"2","data_offsets":[0,8]}})", eight),
               {"\"shape\": \"2\", not an array"});
  expect_error(make_file(R"({"a": {"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", eight),
               {"not a list of integers"});
  expect_error(make_file(R"({"a": {"dtype":"F32","shape":[2],"data_offsets":[0]}})", eight),
               {"\"data_offsets\": [0], not two"});
  expect_error(make_file(R"({"a": {"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", eight),
               {"begin <= end"});
  expect_error(make_file(R"({"a": {"dtype":"F32","shape":[2],"data_offsets":["0","8"]}})", eight),
               {"not two non-negative"});
  expect_error(make_file(R"({"a": {"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", eight),
               {"tensor 'a' has unknown dtype 'F33'", "F8_E4M3"});
  expect_error(make_file(R"({"a": {"dtype":"BOOL","shape":[8],"data_offsets":[0,8]}})", eight),
               {"tensor 'a' has dtype BOOL, which Octet does not support", "convert that tensor"}, false);
  expect_error(make_file(R"({"a": {"dtype":"F32","shape":[-1,2],"data_offsets":[0,8]}})", eight),
               {"negative dimension -1"});
  expect_error(
      make_file(R"({"a": {"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}})", eight),
      {"too large"});
  expect_error(make_file(R"({"a": {"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
               {"takes 12 bytes", "span 8"});
  expect_error(make_file("{\"a\": {" + f32x2 + "}}", "1234"),
               {"tensor 'a' has data_offsets [0, 8], past the end of the 4-byte"});
  expect_error(
      make_file(
          R"({"a": {"dtype":"F32","shape":[2],"data_offsets":[0,8]}, "b": {"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          eight + "1234"),
      {"tensor 'b' at bytes [4, 12) overlaps tensor 'a' at [0, 8)"});
  expect_error(
      make_file(
          R"({"a": {"dtype":"F32","shape":[1],"data_offsets":[0,4]}, "b": {"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
          eight + "1234"),
      {"bytes [4, 8) of the data buffer, before tensor 'b', belong to no tensor"});
  expect_error(make_file(R"({"a": {"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight),
               {"bytes [0, 4)", "belong to no tensor"});
  expect_error(make_file("{\"a\": {" + f32x2 + "}, \"a\": {" + f32x2 + "}}", eight),
               {"lists tensor 'a' twice"});
  expect_error(make_file(R"({"a": {"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", eight),
               {"repeats the key 'dtype'"});
  expect_error(make_file("{\"a\": {" + f32x2 + "}}", eight + "xyz"),
               {"3 trailing bytes follow the last tensor"});
  expect_error(make_file(R"({"__metadata__": {"epoch": 3}})", ""), {"metadata 'epoch' is 3, not a string"});
  expect_error(make_file(R"({"__metadata__": ["x"]})", ""), {"\"__metadata__\" is [\"x\"], not an object"});
  expect_error(make_file("{\"a\": " + std::string(5000, '[') + std::string(5000, ']') + "}", ""), {"nests"});
  expect_error(make_file(R"({"a": "\u00ff)" + std::string("\xFF\xFE\"}"), ""),
               {"not valid JSON"});  // not UTF-8
}

TEST_F(Safetensors, MissingFileOrDirectoryIsNamed) {
  EXPECT_TRUE(throws_with(
      [&] { load_safetensors(path("absent.safetensors")); },
      {"cannot open", path("absent.safetensors"), "No such file or directory", "pass another file"}));
  EXPECT_TRUE(throws_with([&] { load_safetensors(dir_.string()); }, {dir_.string(), "not a regular file"}));
}

std::string small_valid_file(const fs::path& dir) {
  StateDict tensors;
  tensors["head.weight"] = random_bits({2, 3}, DType::f32, 5);
  tensors["head.bias"] = random_bits({3}, DType::bf16, 6);
  tensors["steps"] = random_bits({1}, DType::i64, 7);
  save_safetensors((dir / "valid.safetensors").string(), tensors, {{"epoch", "2"}});
  return slurp(dir / "valid.safetensors");
}

// Every prefix of a valid file is an error with a message, never a crash or an over-read (the
// ASan build runs this too).
TEST_F(Safetensors, EveryTruncationIsAnError) {
  const std::string whole = small_valid_file(dir_);
  ASSERT_NO_THROW(load_safetensors(path("valid.safetensors")));
  for (size_t length = 0; length < whole.size(); ++length) {
    spit(dir_ / "cut.safetensors", whole.substr(0, length));
    EXPECT_TRUE(throws_with([&] { load_safetensors(path("cut.safetensors")); },
                            {path("cut.safetensors"), "corrupt or truncated"}))
        << "prefix of " << length << " of " << whole.size() << " bytes";
  }
}

// Flipped bits anywhere load or fail with an octet::Error; no other exception escapes.
TEST_F(Safetensors, FlippedBitsNeverEscapeAsOtherErrors) {
  const std::string whole = small_valid_file(dir_);
  int rejected = 0;
  for (size_t i = 0; i < whole.size(); ++i) {
    for (unsigned char mask : {0x01, 0x04, 0x20, 0x80}) {
      std::string damaged = whole;
      damaged[i] = static_cast<char>(damaged[i] ^ mask);
      spit(dir_ / "flipped.safetensors", damaged);
      try {
        load_safetensors(path("flipped.safetensors"));
      } catch (const Error&) {
        ++rejected;
      } catch (const std::exception& e) {
        ADD_FAILURE() << "byte " << i << " ^ " << int(mask) << " escaped as " << e.what();
      }
    }
  }
  EXPECT_GT(rejected, 0);
}

TEST_F(Safetensors, SaveRefusesWhatTheFormatCannotHold) {
  EXPECT_TRUE(throws_with(
      [&] {
        save_safetensors(path("x.safetensors"), {{"__metadata__", ones({1})}});
      },
      {"save_safetensors", "__metadata__", "rename the tensor"}));
  EXPECT_TRUE(throws_with(
      [&] {
        save_safetensors(path("x.safetensors"), {{"w", Tensor()}});
      },
      {"save_safetensors", "tensor 'w' is undefined"}));
  EXPECT_TRUE(throws_with(
      [&] {
        save_safetensors(path("no_dir/x.safetensors"), {{"w", ones({1})}});
      },
      {"write_file_atomic", path("no_dir/x.safetensors")}));
  EXPECT_FALSE(fs::exists(dir_ / "x.safetensors"));
}

TEST_F(Safetensors, SavesDeviceTensorsThroughTheHost) {
  if (!cuda::is_available())
    GTEST_SKIP() << "no CUDA device: the device copy path is exercised on GPU machines";
  const Tensor host = random_bits({4, 3}, DType::bf16, 8);
  save_safetensors(path("gpu.safetensors"), {{"w", host.to(Device::cuda())}});
  EXPECT_EQ(bytes_of(load_safetensors(path("gpu.safetensors")).tensors.at("w")), bytes_of(host));
}

}  // namespace
}  // namespace octet::nn
