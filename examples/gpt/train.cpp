// `train`: trains a GPT-2 style model with FSDP on --nproc ranks (threads of
// this process, or one process per rank under mpirun with --backend mpi).
// `train --nproc 4` has the tiny preset learn byte-level text from the Debian
// corpus in about a minute. Flags: train --help; the library behind it:
// examples/gpt/trainer.h.
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
