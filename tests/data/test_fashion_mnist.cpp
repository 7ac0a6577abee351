// IDX reading and the Fashion-MNIST dataset: small files written here (gzip'd and raw) read back
// exactly, every kind of damage reported with the file and the fix, and the installed data set
// checked against its published facts when it is present.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "data/fashion_mnist.h"
#include "tests/testing.h"

namespace {

using namespace octet;
using namespace octet::data;
using octet::testing::throws_with;
namespace fs = std::filesystem;

// A fresh folder under the system temp dir, removed with everything in it at the end of the test.
struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("octet-data-" + tag + "-" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

void put_u32_big_endian(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

std::vector<uint8_t> idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims,
                               const std::vector<uint8_t>& data) {
  std::vector<uint8_t> bytes;
  put_u32_big_endian(bytes, magic);
  for (uint32_t d : dims) put_u32_big_endian(bytes, d);
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr) << path;
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
    ASSERT_EQ(gzclose(f), Z_OK);
  } else {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr) << path;
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
  }
}

struct Split {
  int64_t count, rows, cols;
  std::vector<uint8_t> pixels, labels;
};

Split random_split(int64_t count, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  Split s{count, rows, cols, {}, {}};
  for (int64_t i = 0; i < count * rows * cols; ++i) s.pixels.push_back(static_cast<uint8_t>(rng() & 0xFF));
  for (int64_t i = 0; i < count; ++i) s.labels.push_back(static_cast<uint8_t>(rng() % 10));
  return s;
}

// Writes `prefix`-images-idx3-ubyte and -labels-idx1-ubyte (".gz" when gzip) into dir.
void write_split(const TempDir& dir, const std::string& prefix, const Split& s, bool gzip) {
  const std::string ext = gzip ? ".gz" : "";
  write_file(dir.file(prefix + "-images-idx3-ubyte" + ext),
             idx_bytes(2051, {uint32_t(s.count), uint32_t(s.rows), uint32_t(s.cols)}, s.pixels), gzip);
  write_file(dir.file(prefix + "-labels-idx1-ubyte" + ext), idx_bytes(2049, {uint32_t(s.count)}, s.labels), gzip);
}

// The normalisation written differently from the table: (v - 255·mean) / (255·std) in double.
double normalised(uint8_t v) { return (v - 255.0 * 0.2860) / (255.0 * 0.3530); }

void expect_reads_back(const FashionMnist& ds, const Split& s) {
  ASSERT_EQ(ds.size(), s.count);
  EXPECT_EQ(ds.image_shape(), (Shape{1, s.rows, s.cols}));
  EXPECT_EQ(ds.num_classes(), 10);
  EXPECT_DOUBLE_EQ(ds.normalization().mean, 0.2860);
  EXPECT_DOUBLE_EQ(ds.normalization().std, 0.3530);
  const int64_t n = s.rows * s.cols;
  std::vector<float> image(n);
  for (int64_t i = 0; i < s.count; ++i) {
    int64_t label = -1;
    ds.get(i, image.data(), &label);
    ASSERT_EQ(label, s.labels[i]) << "image " << i;
    ASSERT_EQ(ds.label(i), s.labels[i]);
    for (int64_t p = 0; p < n; ++p) {
      const uint8_t raw = s.pixels[i * n + p];
      ASSERT_EQ(ds.pixels(i)[p], raw) << "image " << i << " pixel " << p;
      ASSERT_NEAR(image[p], normalised(raw), 1e-6)
          << "image " << i << " pixel " << p << " (raw " << int(raw) << ")";
    }
  }
}

TEST(FashionMnist, ReadsBackGzipAndRawFiles) {
  for (bool gzip : {true, false}) {
    SCOPED_TRACE(gzip ? "gzip" : "raw");
    TempDir dir(gzip ? "gz" : "raw");
    const Split train = random_split(37, 5, 7, 1), test = random_split(11, 5, 7, 2);
    write_split(dir, "train", train, gzip);
    write_split(dir, "t10k", test, gzip);
    expect_reads_back(*load_fashion_mnist(dir.path.string(), true), train);
    expect_reads_back(*load_fashion_mnist(dir.path.string(), false), test);
  }
}

TEST(FashionMnist, EveryPixelValueNormalisesByTheFormula) {
  TempDir dir("lut");
  Split s{1, 16, 16, {}, {3}};
  for (int v = 0; v < 256; ++v) s.pixels.push_back(static_cast<uint8_t>(255 - v));
  write_split(dir, "train", s, true);
  const Normalization custom{0.5, 0.25};
  auto ds = load_fashion_mnist(dir.path.string(), true, custom);
  std::vector<float> image(256);
  int64_t label;
  ds->get(0, image.data(), &label);
  for (int v = 0; v < 256; ++v)
    EXPECT_NEAR(image[v], ((255 - v) / 255.0 - 0.5) * 4.0, 1e-6) << "pixel value " << 255 - v;
}

TEST(FashionMnist, DamagedFilesNameTheFileAndTheProblem) {
  TempDir dir("bad");
  const Split s = random_split(6, 4, 3, 3);
  const std::string images = dir.file("train-images-idx3-ubyte"), labels = dir.file("train-labels-idx1-ubyte");
  const std::vector<uint32_t> dims{6, 4, 3};
  auto load = [&] { load_fashion_mnist(dir.path.string(), true); };
  write_file(labels, idx_bytes(2049, {6}, s.labels), false);

  write_file(images, idx_bytes(2049, dims, s.pixels), false);
  EXPECT_TRUE(throws_with(load, {images, "bad magic number 2049", "expected 2051", "images vs labels"}));

  std::vector<uint8_t> short_data(s.pixels.begin(), s.pixels.end() - 1);
  write_file(images, idx_bytes(2051, dims, short_data), false);
  EXPECT_TRUE(throws_with(load, {images, "truncated", "71 bytes", "promises 72", "reinstall"}));

  std::vector<uint8_t> long_data = s.pixels;
  long_data.push_back(7);
  write_file(images, idx_bytes(2051, dims, long_data), true);
  EXPECT_TRUE(throws_with(load, {images, "overlong", "72 bytes", "reinstall"}));

  write_file(images, {0, 0, 8, 3, 0, 0}, false);
  EXPECT_TRUE(throws_with(load, {images, "too short for the 16-byte header"}));

  write_file(images, idx_bytes(2051, {6, 0, 3}, {}), false);
  EXPECT_TRUE(throws_with(load, {images, "dim 1", "is 0"}));

  // A gzip stream cut in the middle: zlib reports it, or the data comes up short.
  write_file(images, idx_bytes(2051, dims, s.pixels), true);
  fs::resize_file(images, fs::file_size(images) - 12);
  EXPECT_TRUE(throws_with(load, {images, "reinstall"}));

  write_file(images, idx_bytes(2051, {5, 4, 3}, std::vector<uint8_t>(s.pixels.begin(), s.pixels.end() - 12)),
             false);
  EXPECT_TRUE(throws_with(load, {images, labels, "5 images", "6 labels", "same split"}));

  write_file(images, idx_bytes(2051, dims, s.pixels), false);
  std::vector<uint8_t> bad_labels = s.labels;
  bad_labels[4] = 10;
  write_file(labels, idx_bytes(2049, {6}, bad_labels), false);
  EXPECT_TRUE(throws_with(load, {labels, "label 10", "index 4", "out of range"}));

  write_file(labels, idx_bytes(2051, {6, 1, 1}, s.labels), false);
  EXPECT_TRUE(throws_with(load, {labels, "bad magic number 2051", "expected 2049"}));
}

TEST(FashionMnist, MissingFolderOrFileSaysHowToInstall) {
  TempDir dir("missing");
  const std::string nowhere = dir.file("no-such-folder");
  EXPECT_TRUE(throws_with([&] { load_fashion_mnist(nowhere, true); },
                          {nowhere, "not found", "sudo apt-get install dataset-fashion-mnist", "tools/setup.sh",
                           "--data-dir", "train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}));
  const Split s = random_split(3, 2, 2, 4);
  write_split(dir, "train", s, true);
  fs::remove(dir.file("train-labels-idx1-ubyte.gz"));
  EXPECT_TRUE(throws_with([&] { load_fashion_mnist(dir.path.string(), true); },
                          {"train-labels-idx1-ubyte", "dataset-fashion-mnist", "--data-dir"}));
  EXPECT_TRUE(throws_with([&] { load_fashion_mnist(dir.path.string(), false); },
                          {"t10k-images-idx3-ubyte", "dataset-fashion-mnist"}));
}

TEST(FashionMnist, InstalledDataSetHasItsPublishedShape) {
  if (!fs::exists(kFashionMnistDefaultDir)) {
    GTEST_SKIP() << kFashionMnistDefaultDir
                 << " is absent: `sudo apt-get install dataset-fashion-mnist` to check it";
  }
  // Published facts: 60000/10000 images of 28x28, balanced classes, the first labels as listed in
  // the data set's README order (ankle boot, t-shirt, ...), and a pixel mean/std of 0.2860/0.3530.
  const std::vector<int64_t> first_train{9, 0, 0, 3, 0, 2, 7, 2, 5, 5}, first_test{9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
  for (bool train : {true, false}) {
    SCOPED_TRACE(train ? "train" : "test");
    auto ds = load_fashion_mnist("", train);
    const int64_t n = train ? 60000 : 10000;
    ASSERT_EQ(ds->size(), n);
    EXPECT_EQ(ds->image_shape(), (Shape{1, 28, 28}));
    std::vector<int64_t> per_class(10, 0);
    std::vector<float> image(784);
    double sum = 0, sum_sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      int64_t label;
      ds->get(i, image.data(), &label);
      ASSERT_GE(label, 0);
      ASSERT_LT(label, 10);
      ++per_class[label];
      if (i < 10) {
        EXPECT_EQ(label, (train ? first_train : first_test)[i]) << "label " << i;
      }
      for (float v : image) {
        sum += v;
        sum_sq += double(v) * v;
      }
    }
    for (int c = 0; c < 10; ++c) EXPECT_EQ(per_class[c], n / 10) << "class " << c;
    if (train) {  // the normalisation constants are the training set's own statistics
      const double mean = sum / (n * 784.0);
      EXPECT_NEAR(mean, 0.0, 1e-3);
      EXPECT_NEAR(std::sqrt(sum_sq / (n * 784.0) - mean * mean), 1.0, 1e-3);
    }
  }
}

}  // namespace
