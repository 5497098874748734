// libFuzzer: the safetensors header parser, on bytes in memory (SafetensorsFile::from_bytes).
#include "fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mla::fuzz::safetensors_bytes(data, size);
  return 0;
}
