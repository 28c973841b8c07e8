// The byte-level BPE tokenizer (train/tokenizer) against Hugging
// Face's `tokenizers`: the golden ids of tests/oracle/tokenizer_oracle.py for
// a GPT-2 style and a Llama 3 style BPE (tokenizer.json with both forms of
// merges, and GPT-2's vocab.json + merges.txt), id for id; decode as the exact
// inverse of encode on random bytes; the heap's merges against a naive
// reference; the scanners, the UTF-8 decoder and the Unicode tables on cases
// of their own; and every refusal naming what was wrong.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/file_io.h"
#include "tensor/error.h"
#include "train/tokenizer/byte_alphabet.h"
#include "train/tokenizer/gpt2_vocab_files.h"
#include "train/tokenizer/split_pattern.h"
#include "train/tokenizer/tokenizer.h"
#include "train/tokenizer/tokenizer_json.h"
#include "train/tokenizer/unicode_class.h"
#include "train/tokenizer/utf8_decoder.h"

namespace fs = std::filesystem;
using tessera::train::Tokenizer;

namespace {

const fs::path kTokenizerGolden = TESSERA_TOKENIZER_GOLDEN_DIR;

std::string read_text(const fs::path& path) { return tessera::checkpoint::read_file_text(path.string()); }

std::string from_hex(const std::string& hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return bytes;
}

struct GoldenCase {
  std::string bytes;
  std::vector<uint32_t> ids;
  std::vector<uint32_t> pair_ids;  // vocab.json + merges.txt (gpt2 only)
};

// One JSON object a line: the header, then the cases.
std::vector<GoldenCase> read_cases(const std::string& name) {
  std::ifstream file(kTokenizerGolden / name);
  REQUIRE(file);
  std::vector<GoldenCase> cases;
  std::string line;
  std::getline(file, line);  // the header
  while (std::getline(file, line)) {
    const nlohmann::json record = nlohmann::json::parse(line);
    GoldenCase golden;
    golden.bytes = record.contains("hex") ? from_hex(record["hex"]) : record["text"].get<std::string>();
    golden.ids = record["ids"].get<std::vector<uint32_t>>();
    golden.pair_ids = record.contains("pair_ids") ? record["pair_ids"].get<std::vector<uint32_t>>() : golden.ids;
    cases.push_back(std::move(golden));
  }
  return cases;
}

// Every case encodes to its ids and decodes back to its bytes; returns how many did.
size_t check_golden(Tokenizer& tokenizer, const std::vector<GoldenCase>& cases, bool pair) {
  size_t matched = 0;
  for (const GoldenCase& golden : cases) {
    const std::vector<uint32_t> expected = pair ? golden.pair_ids : golden.ids;
    const std::vector<uint32_t> ids = tokenizer.encode(golden.bytes);
    CHECK_MESSAGE(ids == expected, "bytes '" << tessera::train::bytes_to_alphabet_text(golden.bytes) << "'");
    CHECK(tokenizer.decode(ids) == golden.bytes);
    matched += ids == expected ? 1 : 0;
  }
  return matched;
}

// The GPT-2 style tokenizer.json, for variations.
nlohmann::json gpt2_json() { return nlohmann::json::parse(read_text(kTokenizerGolden / "gpt2" / "tokenizer.json")); }

// The message read_tokenizer_json throws for `json` ("" if none).
std::string refusal(const nlohmann::json& json) {
  try {
    Tokenizer tokenizer(tessera::train::read_tokenizer_json(json.dump(), "t.json"));
  } catch (const tessera::Error& error) {
    return error.what();
  }
  return "";
}

// Random bytes that are often UTF-8, often not: ASCII, well-formed
// sequences of 2 to 4 bytes, and stray or truncated ones.
std::string random_bytes(std::mt19937& rng, size_t length) {
  std::string bytes;
  std::uniform_int_distribution<int> kind(0, 9), byte(0, 255), ascii(0, 127);
  while (bytes.size() < length) {
    switch (kind(rng)) {
      case 0:
        bytes += "\xC3\xA9";
        break;  // é
      case 1:
        bytes += "\xE6\x97\xA5";
        break;  // 日
      case 2:
        bytes += "\xF0\x9F\x98\x80";
        break;  // 😀
      case 3:
        bytes += "\xF0\x9F\x98";
        break;  // truncated
      case 4:
        bytes.push_back(static_cast<char>(byte(rng)));
        break;
      case 5:
        bytes += " ";
        break;
      case 6:
        bytes += "'s";
        break;
      default:
        bytes.push_back(static_cast<char>(ascii(rng)));
    }
  }
  return bytes;
}

// The textbook BPE: merge the adjacent pair of lowest rank (leftmost of
// equal ones), one merge at a time, rescanning the word each time: O(n^2).
std::vector<uint32_t> naive_bpe(const tessera::train::BpeSpec& spec, std::string_view word) {
  std::map<std::pair<std::string, std::string>, size_t> rank;
  for (size_t r = 0; r < spec.merges.size(); ++r) rank.emplace(spec.merges[r], r);
  std::map<std::string, uint32_t> id_of(spec.vocab.begin(), spec.vocab.end());
  std::vector<std::string> symbols;
  for (const char byte : word) symbols.push_back(tessera::train::bytes_to_alphabet_text(std::string(1, byte)));
  while (symbols.size() > 1) {
    size_t best = SIZE_MAX, at = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto found = rank.find({symbols[i], symbols[i + 1]});
      if (found != rank.end() && found->second < best) best = found->second, at = i;
    }
    if (best == SIZE_MAX) break;
    symbols[at] += symbols[at + 1];
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  std::vector<uint32_t> ids;
  for (const std::string& symbol : symbols) ids.push_back(id_of.at(symbol));
  return ids;
}

std::vector<std::string> pieces(std::string_view text, tessera::train::SplitPattern pattern) {
  std::vector<std::string> out;
  size_t begin = 0;
  for (const size_t end : tessera::train::split_words(text, pattern)) {
    out.emplace_back(text.substr(begin, end - begin));
    begin = end;
  }
  return out;
}

}  // namespace

TEST_CASE("tokenizer: GPT-2 style tokenizer.json (\"a b\" merges) matches tokenizers id for id") {
  Tokenizer tokenizer = Tokenizer::load(kTokenizerGolden / "gpt2" / "tokenizer.json");
  const std::vector<GoldenCase> cases = read_cases("gpt2_cases.json");
  CHECK(cases.size() > 300);
  CHECK(tokenizer.vocab_size() == 659);
  CHECK(check_golden(tokenizer, cases, false) == cases.size());
}

TEST_CASE("tokenizer: GPT-2's vocab.json + merges.txt match tokenizers' BPE.from_file") {
  const std::vector<GoldenCase> cases = read_cases("gpt2_cases.json");
  Tokenizer from_directory = Tokenizer::load(kTokenizerGolden / "gpt2");  // tokenizer.json wins in a directory
  CHECK(from_directory.source().ends_with("tokenizer.json"));
  Tokenizer pair = Tokenizer::load(kTokenizerGolden / "gpt2" / "vocab.json");
  CHECK(pair.source().ends_with("merges.txt"));
  CHECK(check_golden(pair, cases, true) == cases.size());
}

TEST_CASE("tokenizer: the same model with [a, b] merges gives the same ids") {
  nlohmann::json json = gpt2_json();
  for (nlohmann::json& merge : json["model"]["merges"]) {
    const auto pair = tessera::train::split_merge(merge.get<std::string>());
    REQUIRE(pair);
    merge = nlohmann::json::array({pair->first, pair->second});
  }
  Tokenizer tokenizer(tessera::train::read_tokenizer_json(json.dump(), "pairs.json"));
  const std::vector<GoldenCase> cases = read_cases("gpt2_cases.json");
  CHECK(check_golden(tokenizer, cases, false) == cases.size());
}

TEST_CASE("tokenizer: Llama 3 style tokenizer.json (its regex, ignore_merges, special tokens) matches tokenizers") {
  Tokenizer tokenizer = Tokenizer::load(kTokenizerGolden / "llama3" / "tokenizer.json");
  REQUIRE(tokenizer.splits() == std::vector<tessera::train::SplitPattern>{tessera::train::SplitPattern::llama3});
  const std::vector<GoldenCase> cases = read_cases("llama3_cases.json");
  CHECK(cases.size() > 300);
  CHECK(check_golden(tokenizer, cases, false) == cases.size());
  CHECK(tokenizer.encode("Tesseract").size() == 1);  // in the vocab, with no merges to make it
}

TEST_CASE("tokenizer: decode is the exact inverse of encode on random bytes") {
  std::mt19937 rng(7);
  Tokenizer gpt2 = Tokenizer::load(kTokenizerGolden / "gpt2" / "tokenizer.json");
  Tokenizer llama3 = Tokenizer::load(kTokenizerGolden / "llama3" / "tokenizer.json");
  for (int trial = 0; trial < 2000; ++trial) {
    const std::string bytes = random_bytes(rng, std::uniform_int_distribution<size_t>(0, 120)(rng));
    REQUIRE(gpt2.decode(gpt2.encode(bytes)) == bytes);
    REQUIRE(llama3.decode(llama3.encode(bytes)) == bytes);
  }
  std::string all_bytes;
  for (int byte = 0; byte < 256; ++byte) all_bytes.push_back(static_cast<char>(byte));
  CHECK(gpt2.decode(gpt2.encode(all_bytes)) == all_bytes);
  const std::string long_text = random_bytes(rng, 1 << 20);
  CHECK(llama3.decode(llama3.encode(long_text)) == long_text);
  CHECK(llama3.cached_words() > 0);
}

TEST_CASE("tokenizer: the heap's merges equal the naive O(n^2) BPE's") {
  const tessera::train::TokenizerSpec spec = tessera::train::read_tokenizer_json(read_text(kTokenizerGolden / "gpt2" / "tokenizer.json"), "t.json");
  const tessera::train::BpeModel model(spec.bpe);
  std::mt19937 rng(11);
  const std::string alphabet = "thean esrioud'\xC3\xA9\xE6\x97\xA5";
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1), length(1, 60);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string word;
    for (size_t n = length(rng); word.size() < n;) word.push_back(alphabet[pick(rng)]);
    std::vector<uint32_t> ids;
    model.encode_word(word, ids);
    REQUIRE(ids == naive_bpe(spec.bpe, word));
  }
}

TEST_CASE("tokenizer: the GPT-2 and Llama 3 scanners cut as their regexes do") {
  using tessera::train::SplitPattern;
  using Pieces = std::vector<std::string>;
  CHECK(pieces("Hello world's  end\n", SplitPattern::gpt2) == Pieces{"Hello", " world", "'s", " ", " end", "\n"});
  CHECK(pieces("I'M 12345 abc   ", SplitPattern::gpt2) == Pieces{"I", "'", "M", " 12345", " abc", "   "});
  CHECK(pieces("I'M 12345 abc   ", SplitPattern::llama3) == Pieces{"I", "'M", " ", "123", "45", " abc", "   "});
  CHECK(pieces("'ſa x\r\n\n  y", SplitPattern::llama3) == Pieces{"'ſ", "a", " x", "\r\n\n", " ", " y"});
  CHECK(pieces("(x) ...\n\nz", SplitPattern::llama3) == Pieces{"(x", ")", " ...\n\n", "z"});
  CHECK(pieces("a\xFF\xFE b", SplitPattern::gpt2) == Pieces{"a", "\xFF\xFE", " b"});  // two U+FFFD: other
  CHECK(pieces("", SplitPattern::gpt2).empty());
  CHECK(tessera::train::split_pattern_from_regex(tessera::train::split_pattern_regex(SplitPattern::llama3)) == SplitPattern::llama3);
  CHECK(!tessera::train::split_pattern_from_regex("\\s+"));
}

TEST_CASE("tokenizer: UTF-8 is decoded by maximal subparts, as Python's decoder replaces them") {
  struct Case {
    std::string bytes;
    std::vector<uint32_t> lengths;  // of each decoded character
    std::vector<bool> well_formed;
  };
  const std::vector<Case> cases = {
      {"a\xC3\xA9", {1, 2}, {true, true}},
      {"\xF0\x9F\x98 ", {3, 1}, {false, true}},            // a truncated 4-byte sequence is one subpart
      {"\xED\xA0\x80", {1, 1, 1}, {false, false, false}},  // a surrogate: the lead alone, then strays
      {"\xC0\xAF", {1, 1}, {false, false}},                // overlong lead
      {"\xE0\x80\x80", {1, 1, 1}, {false, false, false}},
      {"\xF4\x90\x80\x80", {1, 1, 1, 1}, {false, false, false, false}},  // above U+10FFFF
      {"\xE1\x80", {2}, {false}},
      {"\xF1\x80\x80\xFF", {3, 1}, {false, false}},
  };
  for (const Case& c : cases) {
    std::vector<uint32_t> lengths;
    std::vector<bool> well_formed;
    for (size_t at = 0; at < c.bytes.size();) {
      const tessera::train::Utf8Char ch = tessera::train::decode_utf8_char(c.bytes, at);
      lengths.push_back(ch.length);
      well_formed.push_back(ch.well_formed);
      if (!ch.well_formed) CHECK(ch.code_point == tessera::train::kReplacementCharacter);
      at += ch.length;
    }
    CHECK(lengths == c.lengths);
    CHECK(well_formed == c.well_formed);
  }
  CHECK(tessera::train::decode_utf8_char("\xF0\x9F\x98\x80", 0).code_point == 0x1F600);
}

TEST_CASE("tokenizer: Unicode classes are Unicode 16's, with Oniguruma's \\s") {
  using tessera::train::CharClass;
  CHECK(std::string(tessera::train::unicode_version()) == "16.0.0");
  CHECK(tessera::train::char_class('a') == CharClass::letter);
  CHECK(tessera::train::char_class(0x1C89) == CharClass::letter);   // CYRILLIC CAPITAL LETTER TJE, new in 16.0
  CHECK(tessera::train::char_class(0x10D40) == CharClass::number);  // GARAY DIGIT ZERO, new in 16.0
  CHECK(tessera::train::char_class(0x2EBF0) == CharClass::letter);  // CJK Extension I (15.1)
  CHECK(tessera::train::char_class(0x0663) == CharClass::number);   // ARABIC-INDIC DIGIT THREE
  CHECK(tessera::train::char_class(0x2162) == CharClass::number);   // ROMAN NUMERAL THREE (Nl)
  CHECK(tessera::train::char_class(0x3000) == CharClass::space);
  CHECK(tessera::train::char_class(0x0085) == CharClass::space);
  CHECK(tessera::train::char_class(0x001C) == CharClass::other);  // Python's str.isspace says yes; \s says no
  CHECK(tessera::train::char_class(0x0301) == CharClass::other);  // a combining mark
  CHECK(tessera::train::char_class(0xFFFD) == CharClass::other);
  CHECK(tessera::train::char_class(0x110000) == CharClass::other);
}

TEST_CASE("tokenizer: GPT-2's byte alphabet") {
  CHECK(tessera::train::byte_to_alphabet(' ') == 0x120);   // Ġ
  CHECK(tessera::train::byte_to_alphabet('\n') == 0x10A);  // Ċ
  CHECK(tessera::train::byte_to_alphabet('a') == 'a');
  CHECK(tessera::train::bytes_to_alphabet_text("a b") ==
        "a\xC4\xA0"
        "b");
  for (int byte = 0; byte < 256; ++byte) {
    CHECK(tessera::train::alphabet_to_byte(tessera::train::byte_to_alphabet(static_cast<uint8_t>(byte))) == byte);
  }
  CHECK(!tessera::train::alphabet_text_to_bytes(" "));  // the space itself is not of the alphabet
}

TEST_CASE("tokenizer: tokenizer.json features it cannot honour are refused by key") {
  const auto refused = [](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json json = gpt2_json();
    change(json);
    return refusal(json);
  };
  CHECK(refusal(gpt2_json()).empty());
  CHECK(refused([](auto& j) { j["model"]["type"] = "WordPiece"; }).find("model.type") != std::string::npos);
  CHECK(refused([](auto& j) { j["model"]["byte_fallback"] = true; }).find("model.byte_fallback") != std::string::npos);
  CHECK(refused([](auto& j) { j["model"]["dropout"] = 0.1; }).find("model.dropout") != std::string::npos);
  CHECK(refused([](auto& j) {
          j["model"]["continuing_subword_prefix"] = "##";
        }).find("model.continuing_subword_prefix") != std::string::npos);
  CHECK(refused([](auto& j) { j["normalizer"] = {{"type", "NFC"}}; }).find("normalizer") != std::string::npos);
  CHECK(refused([](auto& j) { j["truncation"] = {{"max_length", 8}}; }).find("truncation") != std::string::npos);
  CHECK(refused([](auto& j) {
          j["pre_tokenizer"] = {{"type", "Metaspace"}};
        }).find("pre_tokenizer.type") != std::string::npos);
  CHECK(refused([](auto& j) { j["pre_tokenizer"] = nullptr; }).find("pre_tokenizer") != std::string::npos);
  CHECK(refused([](auto& j) {
          j["pre_tokenizer"]["add_prefix_space"] = true;
        }).find("pre_tokenizer.add_prefix_space") != std::string::npos);
  CHECK(refused([](auto& j) { j["decoder"] = {{"type", "WordPiece"}}; }).find("decoder") != std::string::npos);
  CHECK(refused([](auto& j) { j["added_tokens"][0]["lstrip"] = true; }).find("added_tokens[0].lstrip") !=
        std::string::npos);
  CHECK(refused([](auto& j) { j["model"].erase("merges"); }).find("model.merges: missing") != std::string::npos);
  const std::string unknown_regex = refused([](auto& j) {
    j["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", "\\p{N}"}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  });
  CHECK(unknown_regex.find("pre_tokenizer.pretokenizers[0].pattern.Regex") != std::string::npos);
  CHECK(refusal(nlohmann::json::parse("[1]")).find("expected an object") != std::string::npos);
  CHECK_THROWS_WITH_AS(tessera::train::read_tokenizer_json("{\"model\": ", "t.json"), doctest::Contains("t.json: not valid JSON"),
                       tessera::Error);
}

TEST_CASE("tokenizer: inconsistent vocabularies and merges are refused by name") {
  const auto refused = [](const std::function<void(nlohmann::json&)>& change) {
    nlohmann::json json = gpt2_json();
    change(json);
    return refusal(json);
  };
  CHECK(refused([](auto& j) { j["model"]["merges"].push_back("zzz q"); }).find("'zzz' is not in the vocab") !=
        std::string::npos);
  CHECK(refused([](auto& j) { j["model"]["merges"].push_back("q q"); }).find("'qq' is not in the vocab") !=
        std::string::npos);
  CHECK(refused([](auto& j) { j["model"]["merges"].push_back("a  b"); }).find("model.merges[") != std::string::npos);
  CHECK(refused([](auto& j) { j["model"]["vocab"].erase("a"); }).find("no token for byte 0x61") != std::string::npos);
  CHECK(refused([](auto& j) { j["model"]["vocab"]["extra"] = 5; }).find("gives id 5") != std::string::npos);
  CHECK(refused([](auto& j) { j["model"]["vocab"]["extra"] = -1; }).find("must be an integer") != std::string::npos);
  CHECK(refused([](auto& j) { j["added_tokens"][1]["id"] = j["added_tokens"][2]["id"]; }).find("both have id") !=
        std::string::npos);

  const std::string vocab = read_text(kTokenizerGolden / "gpt2" / "vocab.json");
  CHECK_THROWS_WITH_AS(tessera::train::read_gpt2_vocab_files(vocab, "vocab.json", "#version: 0.2\na b\nab\n", "merges.txt"),
                       doctest::Contains("merges.txt: line 3"), tessera::Error);
  CHECK_THROWS_WITH_AS(Tokenizer(tessera::train::read_gpt2_vocab_files(vocab, "vocab.json", "x y\n", "merges.txt")),
                       doctest::Contains("'xy' is not in the vocab"), tessera::Error);
  CHECK_THROWS_WITH_AS(tessera::train::read_gpt2_vocab_files("{", "vocab.json", "", "merges.txt"),
                       doctest::Contains("vocab.json: not valid JSON"), tessera::Error);
  CHECK_THROWS_WITH_AS(Tokenizer::load(kTokenizerGolden / "absent.json"), doctest::Contains("absent.json"), tessera::Error);
  const fs::path empty = fs::temp_directory_path() / "tessera_tokenizer_empty_dir";
  fs::create_directories(empty);
  CHECK_THROWS_WITH_AS(Tokenizer::load(empty), doctest::Contains("neither tokenizer.json"), tessera::Error);
  fs::remove(empty);
}

TEST_CASE("tokenizer: decode names an id out of range or one no token has") {
  nlohmann::json json = gpt2_json();
  json["added_tokens"][1]["id"] = 700;  // ids 659..699 become a gap
  Tokenizer tokenizer(tessera::train::read_tokenizer_json(json.dump(), "gap.json"));
  CHECK(tokenizer.vocab_size() == 701);
  CHECK(tokenizer.decode(std::vector<uint32_t>{700}) == "endoftext");
  CHECK_THROWS_WITH_AS(tokenizer.decode(std::vector<uint32_t>{65, 701}),
                       doctest::Contains("id 701 at position 1 is out of range"), tessera::Error);
  CHECK_THROWS_WITH_AS(tokenizer.decode(std::vector<uint32_t>{680}),
                       doctest::Contains("id 680 at position 0 names no token"), tessera::Error);
}
