// bench/tokenizer: the speed of tessera's byte-level BPE tokenizer
// (train/tokenizer) on one thread, in MB of text per second: encode
// with a fresh tokenizer (the word cache empty), encode again (the cache
// warm), encode the text cut into pieces of about 4 KB (at the first newline
// 4096 bytes or more into each), and decode the whole and the pieces.
// bench/tokenizer_speed.py times Hugging Face's `tokenizers` the same way on
// the same text and tokenizer; its `prepare` writes both (docs/tokenizer.md).
// Times are the process's CPU time (one thread: the machine's other load does
// not count), best of --repeat; the wall time of the same runs beside them.
#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <functional>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "bench/machine_context.h"
#include "checkpoint/file_io.h"
#include "train/tokenizer/tokenizer.h"

namespace {

struct Seconds {
  double cpu = 0.0;
  double wall = 0.0;
};

double cpu_now() {
  timespec cpu{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
  return static_cast<double>(cpu.tv_sec) + static_cast<double>(cpu.tv_nsec) * 1e-9;
}

double wall_now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

Seconds time_once(const std::function<void()>& work) {
  const double cpu = cpu_now(), wall = wall_now();
  work();
  return {cpu_now() - cpu, wall_now() - wall};
}

// The fastest of `repeat` runs (by CPU time).
Seconds best_of(int repeat, const std::function<void()>& work) {
  Seconds best{1e300, 1e300};
  for (int i = 0; i < repeat; ++i) {
    const Seconds run = time_once(work);
    if (run.cpu < best.cpu) best = run;
  }
  return best;
}

// The text cut at the first newline `size` bytes or more into each piece.
std::vector<std::string_view> pieces_of(std::string_view text, size_t size = 4096) {
  std::vector<std::string_view> pieces;
  for (size_t start = 0; start < text.size();) {
    const size_t newline = text.find('\n', start + size);
    const size_t end = newline == std::string_view::npos ? text.size() : newline + 1;
    pieces.push_back(text.substr(start, end - start));
    start = end;
  }
  return pieces;
}

void print_rate(const char* what, size_t bytes, Seconds seconds) {
  const double mb = static_cast<double>(bytes) / 1e6;
  fmt::print("{:<22} {:8.2f} MB/s  ({:.3f} s CPU; wall {:.3f} s, {:.2f} MB/s)\n", what, mb / seconds.cpu, seconds.cpu,
             seconds.wall, mb / seconds.wall);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Encode and decode speed of tessera's BPE tokenizer, one thread", "tokenizer"};
  std::string tokenizer_path, text_path;
  int repeat = 5;
  app.add_option("--tokenizer", tokenizer_path, "tokenizer.json, or GPT-2's vocab.json/encoder.json + merges.txt")
      ->required();
  app.add_option("--text", text_path, "The text to encode (any bytes)")->required();
  app.add_option("--repeat", repeat, "Timed runs of the warm encode and of decode (the best is printed)")
      ->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);

  try {
    const std::string text = tessera::checkpoint::read_file_text(text_path);
    fmt::print("machine: {}, vector ISA {}, {} hardware threads, load {}; the tokenizer runs on one thread\n",
               bench::cpu_model(), bench::vector_isa(), std::thread::hardware_concurrency(), bench::load_average());
    std::vector<uint32_t> ids;
    std::optional<tessera::train::Tokenizer> tokenizer;
    const Seconds load = time_once([&] { tokenizer.emplace(tessera::train::Tokenizer::load(tokenizer_path)); });
    fmt::print("tokenizer: {} (loaded in {:.3f} s)\n", tokenizer->describe(), load.wall);
    const Seconds cold = time_once([&] { ids = tokenizer->encode(text); });
    fmt::print("text: {}, {} bytes -> {} tokens ({:.2f} bytes a token), {} distinct words cached\n", text_path,
               text.size(), ids.size(), static_cast<double>(text.size()) / static_cast<double>(ids.size()),
               tokenizer->cached_words());
    print_rate("encode (cache empty)", text.size(), cold);
    print_rate("encode (cache warm)", text.size(), best_of(repeat, [&] { ids = tokenizer->encode(text); }));
    const std::vector<std::string_view> pieces = pieces_of(text);
    std::vector<std::vector<uint32_t>> piece_ids(pieces.size());
    print_rate(fmt::format("encode {} pieces", pieces.size()).c_str(), text.size(), best_of(repeat, [&] {
                 for (size_t i = 0; i < pieces.size(); ++i) piece_ids[i] = tokenizer->encode(pieces[i]);
               }));
    std::string decoded;
    print_rate("decode", text.size(), best_of(repeat, [&] { decoded = tokenizer->decode(ids); }));
    std::vector<std::string> piece_bytes(pieces.size());
    print_rate(fmt::format("decode {} pieces", pieces.size()).c_str(), text.size(), best_of(repeat, [&] {
                 for (size_t i = 0; i < pieces.size(); ++i) piece_bytes[i] = tokenizer->decode(piece_ids[i]);
               }));
    fmt::print("round trip: {}\n", decoded == text ? "decode(encode(text)) == text" : "DIFFERS");
    return decoded == text ? 0 : 1;
  } catch (const std::exception& error) {
    fmt::print(stderr, "tokenizer: error: {}\n", error.what());
    return 1;
  }
}
