#pragma once
// The headers nearly every test program includes and that never change with Octet: GoogleTest and
// the standard library. tests/CMakeLists.txt compiles them once, as a precompiled header that every
// test source is given ahead of its own includes (each source still includes what it uses). JSON and
// spdlog stay out: a few tests use them, and a larger header costs every source more to load than
// they save (measured).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>
