// The precompiled header of libtessera and the train library (meson's
// cpp_pch; -Db_pch=false builds without it): the standard library, fmt and
// nlohmann-json that nearly every unit includes, parsed once per library
// instead of once per unit (about 1 s of a unit's 4-5 s at -O3). Only
// headers from outside tessera, and none whose meaning depends on macros a
// unit defines first (Eigen, MPI, the CUDA toolkit's stay out). A unit still
// includes what it uses; this is a cache, not a substitute.

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>
