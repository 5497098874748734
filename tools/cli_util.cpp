// tools/cli_util.cpp — the CLI's text parsers (id lists, request lists, prompt files), kept apart
// from main so that tests and fuzz targets can link them.
#include <algorithm>

#include <fmt/format.h>

#include "cli_util.h"
#include "mla/error.h"

namespace mla::cli {
namespace {

// An item of the user's text for a one-line message: control bytes escaped, long items cut.
std::string shown(std::string_view s) { return mla::printable_line(s, 40); }

}  // namespace

std::vector<int64_t> parse_int_list(const std::string& text, const std::string& what) {
  std::vector<int64_t> out;
  if (text.empty()) return out;
  size_t pos = 0;
  while (true) {
    const size_t end = text.find(',', pos);
    const std::string item =
        text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos)
      throw UsageError(fmt::format("{}: '{}' is not a non-negative integer", what, shown(item)));
    if (item.size() > 18)
      throw UsageError(fmt::format("{}: '{}' is too large (at most 18 digits)", what, shown(item)));
    out.push_back(std::stoll(item));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return out;
}

std::vector<std::pair<int64_t, int64_t>> parse_requests(const std::string& text) {
  std::vector<std::pair<int64_t, int64_t>> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t end = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, end - pos);
    const size_t colon = item.find(':');
    if (colon == std::string::npos)
      throw UsageError(fmt::format("--requests: '{}' is not PREFIX:NEW", shown(item)));
    auto nums = parse_int_list(item.substr(0, colon) + "," + item.substr(colon + 1), "--requests");
    if (nums.size() != 2)
      throw UsageError(fmt::format("--requests: '{}' is not PREFIX:NEW", shown(item)));
    out.emplace_back(nums[0], nums[1]);
    pos = end + 1;
  }
  return out;
}

std::vector<int64_t> parse_id_text(const std::string& text, const std::string& what) {
  std::string norm;  // whitespace and commas → one comma between items
  for (char ch : text) {
    if (ch == '\n' || ch == '\r' || ch == ' ' || ch == '\t') ch = ',';
    if (!(ch == ',' && (norm.empty() || norm.back() == ','))) norm += ch;
  }
  if (!norm.empty() && norm.back() == ',') norm.pop_back();
  return parse_int_list(norm, what);
}

}  // namespace mla::cli
