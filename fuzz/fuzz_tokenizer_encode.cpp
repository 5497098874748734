// libFuzzer: the encoder on arbitrary bytes (the tiny DeepSeek-style tokenizer of tests/data/text).
#include "fuzz_text_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mla::fuzz::tokenizer_encode(data, size);
  return 0;
}
