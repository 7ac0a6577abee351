#include "apps/flag_checks.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace octet {
namespace fs = std::filesystem;

namespace {

// The whole of `text` as a number, or nothing (strtod takes "inf" and "nan": they are numbers, not
// finite ones, and are turned away below with their own words).
std::optional<double> number_of(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);  // out of range: ±inf, which the callers refuse
  if (end != text.c_str() + text.size()) return std::nullopt;
  return v;
}

// What is wrong with `text` as a finite number, or "" when nothing is; `wanted` ends the message.
std::string not_a_finite_number(const std::string& text, const std::string& wanted) {
  const std::optional<double> v = number_of(text);
  if (!v) return fmt::format("'{}' is not a number; pass {}", text, wanted);
  if (!std::isfinite(*v)) return fmt::format("{} is not a finite number; pass {}", text, wanted);
  return "";
}

std::string trimmed(double v) { return fmt::format("{:g}", v); }

// Edits (insertions, deletions, substitutions) between a and b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The app's long flag nearest to `word` (without its dashes), if within two edits or a third of its
// length (a swapped pair of letters is two).
std::string nearest_flag(const CLI::App* app, const std::string& word) {
  std::string best;
  size_t best_distance = std::max<size_t>(2, word.size() / 3) + 1;
  for (const CLI::Option* option : app->get_options()) {
    for (const std::string& name : option->get_lnames()) {
      const size_t d = edit_distance(word, name);
      if (d < best_distance) best_distance = d, best = "--" + name;
    }
  }
  return best;
}

}  // namespace

std::string explain_parse_error(const CLI::App* app, const CLI::Error& error) {
  const std::string help = "Run with --help for the flags and their values.\n";
  if (dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr) {
    std::string out;
    for (const std::string& arg : app->remaining()) {
      // A flag starts with a dash and a letter; "-", "--" and "-5" are stray values.
      const size_t name_at = arg.find_first_not_of('-');
      const bool flag = arg.starts_with("-") && name_at != std::string::npos &&
                        std::isalpha(static_cast<unsigned char>(arg[name_at]));
      if (flag) {
        const std::string word = arg.substr(name_at);
        const std::string near = nearest_flag(app, word.substr(0, word.find('=')));
        out += fmt::format("{}: no such flag{}\n", arg, near.empty() ? "" : "; did you mean " + near + "?");
      } else {
        out += fmt::format("'{}' is a value no flag takes (the flag before it takes none, or is misspelled)\n", arg);
      }
    }
    return (out.empty() ? std::string(error.what()) + "\n" : out) + help;
  }
  const std::string what = error.what();
  const std::string at_most = ": At Most 1 required but received ";
  if (const size_t at = what.find(at_most); at != std::string::npos) {
    return fmt::format("{} is given {} times; pass it once\n", what.substr(0, at), what.substr(at + at_most.size())) +
           help;
  }
  return what + "\n" + help;
}

CLI::Validator whole_at_least(long long min, long long max) {
  const std::string wanted = fmt::format("a whole number of at least {}", min);
  return CLI::Validator(
      [min, max, wanted](std::string& text) -> std::string {
        long long v = 0;
        const char* first = text.data();
        const char* const last = first + text.size();
        if (first != last && *first == '+') ++first;
        const auto [end, error] = std::from_chars(first, last, v);
        if (error == std::errc::result_out_of_range || (error == std::errc() && end == last && v > max)) {
          return max == LLONG_MAX ? fmt::format("{} is too large; pass {}", text, wanted)
                                  : fmt::format("{} is too large; pass {} and at most {}", text, wanted, max);
        }
        if (error != std::errc() || end != last) {
          return fmt::format("'{}' is not a whole number; pass {}", text, wanted);
        }
        if (v < min) return fmt::format("{} is less than {}; pass {}", text, min, wanted);
        // CLI11 converts with strtoll's base 0, which reads "010" as octal 8: hand it the decimal.
        text = std::to_string(v);
        return "";
      },
      min == 0 ? "NONNEGATIVE" : min == 1 ? "POSITIVE" : fmt::format(">= {}", min));
}

CLI::Validator number_above(double low) {
  const std::string wanted = fmt::format("a number greater than {}", trimmed(low));
  return CLI::Validator(
      [low, wanted](std::string& text) -> std::string {
        const std::string wrong = not_a_finite_number(text, wanted);
        if (!wrong.empty()) return wrong;
        if (!(*number_of(text) > low)) {
          return fmt::format("{} is not greater than {}; pass {}", text, trimmed(low), wanted);
        }
        return "";
      },
      low == 0 ? "POSITIVE" : fmt::format("> {}", trimmed(low)));
}

CLI::Validator number_at_least(double low) {
  const std::string wanted = fmt::format("a number of at least {}", trimmed(low));
  return CLI::Validator(
      [low, wanted](std::string& text) -> std::string {
        const std::string wrong = not_a_finite_number(text, wanted);
        if (!wrong.empty()) return wrong;
        if (*number_of(text) < low) return fmt::format("{} is less than {}; pass {}", text, trimmed(low), wanted);
        return "";
      },
      low == 0 ? "NONNEGATIVE" : fmt::format(">= {}", trimmed(low)));
}

CLI::Validator number_between(double low, double high) {
  const std::string wanted = fmt::format("a number from {} to {}", trimmed(low), trimmed(high));
  return CLI::Validator(
      [low, high, wanted](std::string& text) -> std::string {
        const std::string wrong = not_a_finite_number(text, wanted);
        if (!wrong.empty()) return wrong;
        const double v = *number_of(text);
        if (v < low || v > high) {
          return fmt::format("{} is outside {} to {}; pass {}", text, trimmed(low), trimmed(high), wanted);
        }
        return "";
      },
      fmt::format("in [{} - {}]", trimmed(low), trimmed(high)));
}

// Why `path` cannot be written into (a folder: W_OK | X_OK) or over (a file: W_OK); "" if it can.
static std::string cannot_write(const fs::path& path, int mode) {
  if (::access(path.c_str(), mode) == 0) return "";
  const int error = errno;  // before anything else can set it
  return std::strerror(error);
}

void check_output_file(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  OCTET_CHECK(!fs::is_directory(path, ec), flag, " ", path, " is a folder; pass the path of a file to write (such as ",
              (fs::path(path) / "out").string(), ")");
  const fs::path folder = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  const bool exists = fs::exists(folder, ec);
  OCTET_CHECK(exists || ec, flag, " ", path, ": the folder ", folder.string(),
              " does not exist; create it first, or pass a path in an existing folder");
  OCTET_CHECK(!ec, flag, " ", path, ": cannot look at the folder ", folder.string(), " (", ec.message(),
              "); pass a path in a folder you can write");
  OCTET_CHECK(fs::is_directory(folder, ec), flag, " ", path, ": ", folder.string(),
              " is a file, not a folder; pass a path in a folder");
  const std::string folder_error = cannot_write(folder, W_OK | X_OK);
  OCTET_CHECK(folder_error.empty(), flag, " ", path, ": the folder ", folder.string(), " is not writable (",
              folder_error, "); pass a path in a folder you can write");
  if (fs::exists(path, ec)) {
    const std::string file_error = cannot_write(path, W_OK);
    OCTET_CHECK(file_error.empty(), flag, " ", path, " exists and cannot be written (", file_error,
                "); pass another path, or make it writable");
  }
}

void check_output_folder(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code made, probe;
  if (!fs::exists(path, probe)) fs::create_directories(path, made);  // a rank that lost the race sees it made
  if (!fs::is_directory(path, probe)) {
    const std::string why =
        fs::exists(path, probe) ? "a file of that name is in the way" : "cannot create it (" + made.message() + ")";
    OCTET_FAIL(flag, " ", path, ": ", why, "; pass a folder you can write");
  }
  const std::string error = cannot_write(path, W_OK | X_OK);
  OCTET_CHECK(error.empty(), flag, " ", path, " is not writable (", error, "); pass a folder you can write");
}

}  // namespace octet
