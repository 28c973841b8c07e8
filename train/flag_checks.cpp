// Range and path validators for CLI11, and the usage-error exit status.
#include "train/flag_checks.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>

namespace tessera::train {

CLI::Validator integer_in(int64_t min, int64_t max) {
  return CLI::Validator(
      [min, max](std::string& input) -> std::string {
        int64_t value = 0;
        const char* end = input.data() + input.size();
        const auto [stop, error] = std::from_chars(input.data(), end, value);
        if (input.empty() || stop != end || (error != std::errc() && error != std::errc::result_out_of_range)) {
          return fmt::format("'{}' is not an integer", input);
        }
        if (error == std::errc() && value >= min && value <= max) return {};
        return fmt::format("must be in [{}, {}], got {}", min, max, input);
      },
      fmt::format("in [{}, {}]", min, max));
}

CLI::Validator any_uint64() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        uint64_t value = 0;
        const char* end = input.data() + input.size();
        const auto [stop, error] = std::from_chars(input.data(), end, value);
        if (!input.empty() && stop == end && error == std::errc()) return {};
        return fmt::format("must be an integer in [0, {}], got {}", std::numeric_limits<uint64_t>::max(), input);
      },
      "UINT64");
}

CLI::Validator number_in(double min, double max, bool min_exclusive) {
  const std::string range = fmt::format("{}{:g}, {:g}]", min_exclusive ? "(" : "[", min, max);
  return CLI::Validator(
      [min, max, min_exclusive, range](std::string& input) -> std::string {
        double value = 0.0;
        if (!CLI::detail::lexical_cast(input, value)) return fmt::format("'{}' is not a number", input);
        if (!std::isfinite(value)) return fmt::format("must be a finite number, got {}", input);
        const bool above_min = min_exclusive ? value > min : value >= min;
        if (above_min && value <= max) return {};
        return fmt::format("must be in {}, got {}", range, input);
      },
      fmt::format("in {}", range));
}

CLI::Validator non_empty_path() {
  return CLI::Validator(
      [](std::string& input) -> std::string {
        return input.empty() ? "must name a file or directory, got an empty path (leave the flag out instead)" : "";
      },
      "PATH");
}

int exit_after_parse_error(const CLI::App& app, const CLI::ParseError& error, std::ostream& out, std::ostream& err) {
  const int status = app.exit(error, out, err);
  return status == 0 ? 0 : kUsageExitCode;
}

}  // namespace tessera::train
