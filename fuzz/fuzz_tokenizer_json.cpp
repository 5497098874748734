// libFuzzer: the tokenizer.json reader, and encoding/decoding with whatever it accepts.
#include "fuzz_text_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mla::fuzz::tokenizer_json(data, size);
  return 0;
}
