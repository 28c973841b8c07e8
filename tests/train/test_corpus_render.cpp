// The default corpus as a terminal shows it: nroff's backspace overstrikes
// (underline, bold, accents) and bells rendered away, every other byte kept,
// and the real corpus free of both.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "tests/checkpoint/temp_dir.h"
#include "train/corpus.h"

namespace fs = std::filesystem;
using tessera::train::render_overstrikes;
using tessera::checkpoint::testing::TempDir;

TEST_CASE("render_overstrikes: underlines keep their characters") {
  CHECK(render_overstrikes("_\bx") == "x");
  CHECK(render_overstrikes("x\b_") == "x");
  CHECK(render_overstrikes("It runs like _\bx, where _\bx is") == "It runs like x, where x is");
  // A run: the underscores first, back over them, then the word.
  CHECK(render_overstrikes("whiter teeth *___\b\b\band* fresher") == "whiter teeth *and* fresher");
  // fortunes' garbled form: _\b repeated, then the word.
  CHECK(render_overstrikes("squid -- *_\b_\b_\b_\bthat _\b_\b_\bhad") == "squid -- *that had");
}

TEST_CASE("render_overstrikes: bold keeps one character, an accent gives way to its letter") {
  CHECK(render_overstrikes("whether I\bI win") == "whether I win");
  CHECK(render_overstrikes("B\bBO\bOL\bLD\bD") == "BOLD");
  CHECK(render_overstrikes("Poincar'\be") == "Poincare");
  CHECK(render_overstrikes("Tin'\buviel, m^\beme") == "Tinuviel, meme");
  CHECK(render_overstrikes("e\b'") == "e");  // the accent second
  // A UTF-8 character is one column: backed over and underlined whole.
  CHECK(render_overstrikes("caf\xc3\xa9\b_!") == "caf\xc3\xa9!");
  CHECK(render_overstrikes("_\b\xc3\xa9t\xc3\xa9") == "\xc3\xa9t\xc3\xa9");
}

TEST_CASE("render_overstrikes: a lone backspace moves back without erasing, never past the line's start") {
  CHECK(render_overstrikes("\bword") == "word");
  CHECK(render_overstrikes("one\n\btwo\n") == "one\ntwo\n");
  CHECK(render_overstrikes("ab\b") == "ab");
  CHECK(render_overstrikes("ab\b\b\b\bc") == "cb");  // back to column 0, c over a
  CHECK(render_overstrikes("\b\b\b") == "");
}

TEST_CASE("render_overstrikes: bells go, everything else stays as it was") {
  CHECK(render_overstrikes("logout\a") == "logout");
  CHECK(render_overstrikes("\a\a\a\t*** System shutdown") == "\t*** System shutdown");
  const std::string plain = "A fortune.\n\t\t-- Someone\n%\nTabs\tand \xc3\xa9 and \r\n and ~^_ stay.\n";
  CHECK(render_overstrikes(plain) == plain);
  CHECK(render_overstrikes("") == "");
  const std::string all_but_two = [] {
    std::string bytes;
    for (int value = 0; value < 256; ++value) {
      if (value != '\b' && value != '\a') bytes.push_back(static_cast<char>(value));
    }
    return bytes;
  }();
  CHECK(render_overstrikes(all_but_two) == all_but_two);
}

TEST_CASE("default corpus: read through render_overstrikes, which the banner reports") {
  TempDir dir;
  const fs::path fortunes = dir.path / "fortunes";
  fs::create_directories(fortunes);
  std::ofstream(fortunes / "a", std::ios::binary) << "It is *___\b\b\bnot* so.\n%\n";
  std::ofstream(fortunes / "b", std::ios::binary) << "Ring\a.\n%\n";
  const tessera::train::CorpusLocations locations{fortunes, dir.path / "absent"};
  const tessera::train::TokenData corpus = tessera::train::load_default_corpus(locations);
  const std::vector<uint32_t> ids = corpus.tokens.ids();
  CHECK(std::string(ids.begin(), ids.end()) == "It is *not* so.\n%\nRing.\n%\n");
  CHECK(corpus.description.find("2 files, 26 bytes; 7 bytes of backspace overstrikes and bells rendered away") !=
        std::string::npos);
  CHECK(tessera::train::default_corpus_token_count(locations) == corpus.tokens.size());

  // The real default (fortunes, or the licence texts) holds neither byte.
  const tessera::train::TokenData real = tessera::train::load_default_corpus();
  const std::vector<uint32_t> real_ids = real.tokens.ids();
  CHECK(std::count(real_ids.begin(), real_ids.end(), uint32_t{'\b'}) == 0);
  CHECK(std::count(real_ids.begin(), real_ids.end(), uint32_t{'\a'}) == 0);
  CHECK(tessera::train::default_corpus_token_count() == real.tokens.size());
}
