// Where the trainer's tokens come from: byte-level text (one token per
// byte, vocab 256), token files in llm.c's format, and the default corpus that a
// fresh Debian machine has, so that training needs nothing from the web.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "train/token_stream.h"

namespace tessera::train {

// A run's whole token stream, before the train/validation split.
struct TokenData {
  TokenStream tokens;
  int64_t token_range = 0;  // largest token + 1: the smallest vocab that covers the data
  std::string description;  // where the tokens came from, for the log and the run's identity
  std::string note;         // for the log only ("" = none): how they were made (token_cache.h)
};

// Text before it becomes tokens, and where it came from.
struct CorpusText {
  std::string text;
  std::string description;  // "PATH (text, N bytes)"
};

// llm.c's token files (`dev/data/*.bin`): a header of 256 int32 (magic,
// version, token count, then zeros) followed by the tokens, as uint16 in
// version 1 (GPT-2) and as uint32 in version 2 (Llama 3), little-endian.
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;      // uint16 tokens
inline constexpr int32_t kLlmcWideVersion = 2;  // uint32 tokens
inline constexpr int64_t kLlmcHeaderInts = 256;

// The version of llm.c's format that stores `tokens` as they are held.
int32_t llmc_version_of(const TokenStream& tokens);

// Reads `path`: llm.c's format when the file opens with its magic, otherwise
// the file's bytes as byte-level tokens. Throws tessera::Error when the file
// cannot be read, is empty, or has a broken llm.c header.
TokenData load_token_file(const std::filesystem::path& path);

// How many tokens load_token_file(path) would hold, and the bytes they take,
// from the file's size and (for llm.c's format) its header, without reading
// the tokens: memory estimates need it before anything is loaded. Zeros
// when the file cannot be read.
struct TokenFileSize {
  int64_t tokens = 0;
  int64_t bytes = 0;
};
TokenFileSize token_size_of_file(const std::filesystem::path& path);

// The bytes of a text file. Throws tessera::Error when it cannot be read, is
// empty, or is an llm.c token file (tokens, not text).
CorpusText read_text_file(const std::filesystem::path& path);

// Concatenates the bytes of `files` (in the given order) into byte-level tokens.
TokenData load_text_files(const std::vector<std::filesystem::path>& files, const std::string& description);

// The text a terminal shows for `text`. Fortunes' cookies were written for
// nroff and carry its backspace (0x08) overstrikes: underlining `_\bX` (also
// as runs, `___\b\b\bnot`), bold `X\bX`, accents typed over a letter
// (`Poincar'\be`); and a few BEL bytes (0x07). Each line is replayed column
// by column: a backspace steps one column back (none at the line's start);
// of a character and an underscore struck over each other the character
// stays, of a letter (or digit, or UTF-8 character) and a mark the letter,
// and otherwise the later (bold: the same); BEL is dropped. Nothing else
// changes (tabs, UTF-8, '\r' included).
// The default corpus is read through it: the 2.6 MB of the fortunes package
// hold 311 backspaces and 54 bells, 676 bytes with the characters struck over,
// which would teach a byte model sequences no reader sees (such as
// `_\b_\b_\b_\bmean`).
std::string render_overstrikes(std::string_view text);

// The default corpus: the plain-text cookie files of Debian's `fortunes`
// package, else (package absent) the licence texts every Debian ships.
struct CorpusLocations {
  std::filesystem::path fortunes = "/usr/share/games/fortunes";
  std::filesystem::path licenses = "/usr/share/common-licenses";
};

// The regular files of the first location that has any, sorted by name.
// Skipped: symlinks (fortunes' `.u8` names and the licences' `GPL -> GPL-3`
// aliases would count texts twice) and fortunes' `.dat` index files (binary).
std::vector<std::filesystem::path> default_corpus_files(const CorpusLocations& locations = {});

// The text of default_corpus_files(), each file through render_overstrikes;
// throws tessera::Error naming both places when neither has a file.
CorpusText read_default_corpus(const CorpusLocations& locations = {});

// read_default_corpus() as byte-level tokens.
TokenData load_default_corpus(const CorpusLocations& locations = {});

// How many tokens load_default_corpus(locations) holds (reads the files):
// fewer than their sizes add up to when they carry overstrikes.
int64_t default_corpus_token_count(const CorpusLocations& locations = {});

}  // namespace tessera::train
