// libFuzzer: the CLI's text parsers — id lists (--ids, --seq-lens), --requests, prompt files.
#include "fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mla::fuzz::cli_text(data, size);
  return 0;
}
