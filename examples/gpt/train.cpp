// `train`: trains a GPT-2 style model on one machine. With no flags, the tiny
// preset learns byte-level text from the Debian corpus in a few minutes.
// Flags: train --help; the library behind it: examples/gpt/trainer.h.
#include <exception>
#include <iostream>

#include "examples/gpt/train_config.h"
#include "examples/gpt/trainer.h"

int main(int argc, char** argv) {
  gpt::TrainConfig config;
  if (auto exit_code = gpt::parse_command_line(argc, argv, config, std::cout, std::cerr)) return *exit_code;
  try {
    gpt::train(config, std::cout);
  } catch (const std::exception& error) {
    std::cerr << "train: error: " << error.what() << '\n';
    return 1;
  }
  return 0;
}
