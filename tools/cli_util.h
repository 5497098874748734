// tools/cli_util.h — the CLI's usage error and text parsers (tools/cli_util.cpp), apart from
// CLI11 so that tests and fuzz targets can use them cheaply.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mla::cli {

// Thrown for bad command-line values; main prints the message and exits with kExitUsage.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Bad text throws UsageError naming `what` (the option), with the item quoted on one line.
// "3,17,42" → {3, 17, 42}: non-negative integers (at most 18 digits), no empty items.
std::vector<int64_t> parse_int_list(const std::string& text, const std::string& what);
// "4096:512,0:17" → {(4096, 512), (0, 17)}: PREFIX:NEW per request (--requests).
std::vector<std::pair<int64_t, int64_t>> parse_requests(const std::string& text);
// Ids separated by commas and/or whitespace (a --prompt-file); empty when there are none.
std::vector<int64_t> parse_id_text(const std::string& text, const std::string& what);

}  // namespace mla::cli
