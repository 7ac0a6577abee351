#pragma once
// Checks for command-line flags that say what was wanted and how to get it right.
//
// CLI11's own range checks (CLI::PositiveNumber, ...) print the whole range of the type, 1.8e308
// written out in full, take "abc" or "nan" for a number out of range, and call 0 "not in range 0 to
// ..."; these name the value and the fix. A CLI::ValidationError they raise reads "--flag: message".
//
// Output paths are checked when the flags are, before a run trains: a --save-model into a folder
// that does not exist would otherwise fail after the whole run.
#include <CLI/CLI.hpp>

#include <climits>
#include <string>

namespace octet {

// A whole number, at least `min` and at most `max` (pass the option's type's limit, INT_MAX for an
// int: past it CLI11 says only "Could not convert"). A transform, not a check: it hands CLI11 the
// number in decimal, where CLI11 would read "010" as octal 8.
CLI::Validator whole_at_least(long long min, long long max = LLONG_MAX);
// A finite number above `low` (strictly).
CLI::Validator number_above(double low);
// A finite number, at least `low`.
CLI::Validator number_at_least(double low);
// A finite number in [low, high].
CLI::Validator number_between(double low, double high);

// CLI::App::failure_message for train_vit and bench_vit: an unknown flag is named, with the closest
// known one when it is near ("--batchsize: no such flag; did you mean --batch-size?"), a stray value
// is called one, and a flag given twice says so; any other error is CLI11's own line. Each message
// ends by pointing at --help.
std::string explain_parse_error(const CLI::App* app, const CLI::Error& error);

// `path`, the value of `flag`, names a file the run will write: it must not be a folder, and its
// folder must exist and be writable. Nothing is created. An empty path passes.
void check_output_file(const std::string& flag, const std::string& path);

// `path`, the value of `flag`, names a folder the run will write into: it is created (with its
// parents) if missing, and must then be a writable folder. An empty path passes.
void check_output_folder(const std::string& flag, const std::string& path);

}  // namespace octet
