// What a tokenizer's files say, once read and checked for what tessera can
// honour: the BPE model, the pre-tokenizer's regex splits and the added
// tokens. tokenizer_json.h and gpt2_vocab_files.h make one; Tokenizer runs it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/tokenizer/added_tokens.h"
#include "train/tokenizer/bpe_model.h"
#include "train/tokenizer/split_pattern.h"

namespace tessera::train {

struct TokenizerSpec {
  BpeSpec bpe;
  // The pre-tokenizer's splits, applied in turn (each cuts the pieces of the
  // one before); none: each stretch between added tokens is one word.
  std::vector<SplitPattern> splits;
  std::vector<AddedToken> added_tokens;
  std::string source;           // the file(s) read, for messages
  uint32_t content_crc32c = 0;  // CRC-32C of the files' bytes, in the order read
};

}  // namespace tessera::train
