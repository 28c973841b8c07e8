// One run of `train` inside a test: what it printed, how it failed (a usage
// error told apart from a later failure) and its summary; and its flags parsed.
#pragma once

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tensor/error.h"
#include "train/flag_checks.h"
#include "train/training_run.h"

namespace tessera::train::testing {

struct Outcome {
  std::string log;
  std::string error;         // "" when the run finished
  bool usage_error = false;  // refused before the start (exit status 2)
  TrainSummary summary;
};

inline Outcome run(const TrainConfig& config) {
  Outcome outcome;
  std::ostringstream log;
  try {
    outcome.summary = train(config, log);
  } catch (const UsageError& error) {
    outcome.error = error.what();
    outcome.usage_error = true;
  } catch (const tessera::Error& error) {
    outcome.error = error.what();
  }
  outcome.log = log.str();
  return outcome;
}

// train's flags (`args`, without the program's name) parsed into `config`:
// parse_command_line's exit code (nullopt: go on), its error text in `err`.
inline std::optional<int> parse_flags(std::vector<const char*> args, TrainConfig& config, std::string& err) {
  args.insert(args.begin(), "train");
  std::ostringstream out, errors;
  const std::optional<int> exit_code =
      parse_command_line(static_cast<int>(args.size()), args.data(), config, out, errors);
  err = errors.str();
  return exit_code;
}

inline bool trained_a_step(const Outcome& outcome) { return outcome.log.find("| loss") != std::string::npos; }

}  // namespace tessera::train::testing
