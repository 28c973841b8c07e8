#include "tensor/cuda/sim/code_site.h"

#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#if TESSERA_HAVE_LIBBACKTRACE
#include <backtrace.h>
#endif

namespace tessera::cuda::sim {

namespace {

struct Line {
  std::string file;
  int line = 0;
  std::string function;
};

// The source line of a return address: the call instruction ends just
// before it. Innermost first when the compiler inlined the access.
std::vector<Line> lines_of(const void* code) {
  std::vector<Line> lines;
#if TESSERA_HAVE_LIBBACKTRACE
  static backtrace_state* state = backtrace_create_state(nullptr, /*threaded=*/1, nullptr, nullptr);
  static std::mutex mutex;  // libbacktrace's threaded mode is safe, but keep message building serial
  std::lock_guard lock(mutex);
  if (state == nullptr) return lines;
  backtrace_pcinfo(
      state, reinterpret_cast<uintptr_t>(code) - 1,
      [](void* data, uintptr_t, const char* file, int line, const char* function) {
        if (file != nullptr && line > 0) {
          static_cast<std::vector<Line>*>(data)->push_back(Line{file, line, function != nullptr ? function : ""});
        }
        return 0;
      },
      [](void*, const char*, int) {}, &lines);
#else
  (void)code;
#endif
  return lines;
}

constexpr const char* kSourceRoots[] = {"tensor/", "tests/", "bench/", "examples/"};

bool is_project_source(const std::string& relative) {
  for (const char* root : kSourceRoots) {
    if (relative.starts_with(root)) return true;
  }
  return false;
}

}  // namespace

std::string relative_source_path(const std::string& file) {
  if (is_project_source(file)) return file;
  for (const char* root : kSourceRoots) {
    const size_t at = file.rfind(std::string("/") + root);
    if (at != std::string::npos) return file.substr(at + 1);
  }
  return file;
}

std::string describe(const CodeSite& site) {
  if (site.source.line() != 0) {
    return fmt::format("{}:{}", relative_source_path(site.source.file_name()), site.source.line());
  }
  if (site.code == nullptr) return "an unknown site";
  const std::vector<Line> lines = lines_of(site.code);
  if (lines.empty()) {
    Dl_info info{};
    if (dladdr(site.code, &info) != 0 && info.dli_sname != nullptr) {
      return fmt::format("{}+0x{:x} (no line tables)", info.dli_sname,
                         reinterpret_cast<uintptr_t>(site.code) - reinterpret_cast<uintptr_t>(info.dli_saddr));
    }
    return fmt::format("code address {} (no line tables)", site.code);
  }
  // The innermost line, and the kernel's own line when that one is in a header
  // (a toolkit intrinsic, a tessera helper inlined into the kernel).
  const auto in_project = [](const Line& line) { return is_project_source(relative_source_path(line.file)); };
  std::string text = fmt::format("{}:{}", relative_source_path(lines.front().file), lines.front().line);
  for (size_t outer = 1; outer < lines.size(); ++outer) {
    if (!in_project(lines[outer]) || lines[outer].file == lines.front().file) continue;
    text += fmt::format(" (inlined at {}:{})", relative_source_path(lines[outer].file), lines[outer].line);
    break;
  }
  return text;
}

std::string site_name(const std::source_location& site) {
  return fmt::format("{}:{}", site.file_name(), site.line());
}

bool same_site(const std::source_location& a, const std::source_location& b) {
  return a.line() == b.line() && a.column() == b.column() &&
         (a.file_name() == b.file_name() || std::strcmp(a.file_name(), b.file_name()) == 0);
}

}  // namespace tessera::cuda::sim
