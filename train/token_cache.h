// Text tokenized by a BPE tokenizer for `train --tokenizer`, and the cache
// that spares a run the tokenizing on its next launch: the tokens in llm.c's
// format (corpus.h) as DIR/tokens-v1-<tokenizer CRC-32C>-<text CRC-32C>-<text
// bytes>.bin, next to the run's checkpoints, reused while both the
// tokenizer's files and the text are the same. Written to a temporary file
// and renamed, so a cache file is whole or absent; an unreadable one is
// replaced.
#pragma once

#include <filesystem>
#include <string>

#include "train/corpus.h"
#include "train/tokenizer/tokenizer.h"

namespace tessera::train {

// The cache file of `text` under `tokenizer` in `directory`.
std::filesystem::path token_cache_path(const std::filesystem::path& directory, const Tokenizer& tokenizer,
                                       const std::string& text);

// The tokens of corpus.text: from the cache in `cache_directory` when it
// holds them, else encoded (and cached there; "" = no cache), narrow or wide
// as their ids need (token_stream.h; the cache file is llm.c's version 1 or
// 2 accordingly). The description names the text and the tokenizer (the same
// on every launch: it is part of the run's identity); the note says what the
// cache did. Throws tessera::Error when the text gives no tokens.
TokenData tokenize_corpus(const CorpusText& corpus, Tokenizer& tokenizer, const std::string& cache_directory);

}  // namespace tessera::train
