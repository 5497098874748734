// libFuzzer: chat templates — the Jinja lexer, parser and evaluator on a template's text.
#include "fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mla::fuzz::chat_template_text(data, size);
  return 0;
}
