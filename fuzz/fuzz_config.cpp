// libFuzzer: the HF config.json readers (attention part and whole model).
#include "fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mla::fuzz::config_text(data, size);
  return 0;
}
