// load_token_corpus: the tokenizer's cached corpus ids as a TokenDataset. Built
// only with the tokenizer (KILN_TOKENIZER); TokenDataset itself takes plain ids.
#if defined(KILN_HAVE_TOKENIZER)
#include "kiln/token_dataset.h"
#include "kiln/tokenizer.h"

namespace kiln {

TokenDataset load_token_corpus(const Tokenizer& tok, const std::string& corpus_dir,
                               const std::string& cache_path, int threads) {
  TokenCache cache = cached_corpus_tokens(tok, corpus_dir, cache_path, threads);
  if (cache.vocab_size <= 65536) {  // half the memory of the cache's u32 ids
    std::vector<uint16_t> small(cache.ids.begin(), cache.ids.end());
    cache.ids = {};
    return TokenDataset(std::move(small), cache.vocab_size);
  }
  return TokenDataset(std::move(cache.ids), cache.vocab_size);
}

}  // namespace kiln
#endif
