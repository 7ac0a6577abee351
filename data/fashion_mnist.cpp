#include "data/fashion_mnist.h"

#include <filesystem>

#include "core/error.h"

namespace octet::data {
namespace {

constexpr const char* kHowToGetIt =
    "install it with `sudo apt-get install dataset-fashion-mnist` (or `bash tools/setup.sh`), or pass "
    "--data-dir DIR where DIR holds train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
    "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz (gzip'd or not)";

// `dir`/`stem`.gz, else `dir`/`stem`, else an error saying how to get the data set.
std::string find_file(const std::string& dir, const std::string& stem) {
  namespace fs = std::filesystem;
  std::error_code ec;
  OCTET_CHECK(fs::is_directory(dir, ec), "Fashion-MNIST: ", dir, fs::exists(dir, ec) ? " is a file, not a folder; " :
              " not found; ", kHowToGetIt);
  for (const std::string& name : {stem + ".gz", stem}) {
    const fs::path path = fs::path(dir) / name;
    if (fs::exists(path, ec)) return path.string();
  }
  OCTET_FAIL("Fashion-MNIST: folder ", dir, " has neither ", stem, ".gz nor ", stem, "; ", kHowToGetIt);
}

}  // namespace

FashionMnist::FashionMnist(IdxImages images, std::vector<uint8_t> labels, Normalization norm)
    : images_(std::move(images)), labels_(std::move(labels)), norm_(norm) {
  OCTET_CHECK(static_cast<int64_t>(labels_.size()) == images_.count, "FashionMnist: ", images_.count,
              " images but ", labels_.size(), " labels; pass the label file of the same split");
  OCTET_CHECK(static_cast<int64_t>(images_.pixels.size()) == images_.count * images_.rows * images_.cols,
              "FashionMnist: ", images_.pixels.size(), " pixels do not make ", images_.count, " images of ",
              images_.rows, "x", images_.cols);
  OCTET_CHECK(norm_.std > 0, "FashionMnist: normalisation std is ", norm_.std, "; it must be positive");
  for (size_t i = 0; i < labels_.size(); ++i) {
    OCTET_CHECK(labels_[i] < kFashionMnistClasses, "FashionMnist: label ", int(labels_[i]), " of image ", i,
                " is not one of the ", kFashionMnistClasses, " classes; the label file is damaged");
  }
  for (int v = 0; v < 256; ++v) table_[v] = static_cast<float>((v / 255.0 - norm_.mean) / norm_.std);
}

void FashionMnist::get(int64_t index, float* image, int64_t* label) const {
  const uint8_t* src = pixels(index);
  const int64_t n = images_.rows * images_.cols;
  for (int64_t i = 0; i < n; ++i) image[i] = table_[src[i]];
  *label = labels_[index];
}

const uint8_t* FashionMnist::pixels(int64_t index) const {
  OCTET_CHECK(index >= 0 && index < size(), "FashionMnist: index ", index, " out of range [0, ", size(), ")");
  return images_.pixels.data() + index * images_.rows * images_.cols;
}

uint8_t FashionMnist::label(int64_t index) const {
  OCTET_CHECK(index >= 0 && index < size(), "FashionMnist: index ", index, " out of range [0, ", size(), ")");
  return labels_[index];
}

std::unique_ptr<FashionMnist> load_fashion_mnist(const std::string& dir_or_empty, bool train, Normalization norm) {
  const std::string dir = dir_or_empty.empty() ? kFashionMnistDefaultDir : dir_or_empty;
  const std::string split = train ? "train" : "t10k";
  const std::string images_path = find_file(dir, split + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, split + "-labels-idx1-ubyte");
  IdxImages images = read_idx_images(images_path);
  std::vector<uint8_t> labels = read_idx_labels(labels_path);

  // The constructor checks these too; here the message can name the files.
  OCTET_CHECK(static_cast<int64_t>(labels.size()) == images.count, "Fashion-MNIST: ", images_path, " holds ",
              images.count, " images but ", labels_path, " holds ", labels.size(),
              " labels; the two files must come from the same split and release (reinstall "
              "dataset-fashion-mnist or download both again)");
  for (size_t i = 0; i < labels.size(); ++i) {
    OCTET_CHECK(labels[i] < kFashionMnistClasses, "Fashion-MNIST: ", labels_path, ": label ", int(labels[i]),
                " at index ", i, " is out of range (", kFashionMnistClasses,
                " classes); the file is damaged: reinstall dataset-fashion-mnist or download it again");
  }
  return std::make_unique<FashionMnist>(std::move(images), std::move(labels), norm);
}

}  // namespace octet::data
