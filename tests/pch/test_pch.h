// The precompiled header of the doctest suites (meson's cpp_pch; -Db_pch=false
// builds without it): the external headers that most test files include,
// parsed once per test program instead of once per file. A test file's
// preprocessed text is about 120k lines, 97% of them libstdc++, nlohmann-json,
// fmt, CLI11 and doctest; the header saves about 1 s of the 4-9 s a test
// file takes at -O1 (most of the rest is the test's own code).
// Only headers from outside tessera: a change to tessera's own headers
// rebuilds what includes them either way. A file still includes what it
// uses; this is a cache, not a substitute.

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
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
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>
