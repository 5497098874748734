// mla/error.h — the one error type of the library: a single line that names what is wrong.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace mla {

// Text quoted into an error message (a name, a token, a template's own message, another library's
// error), as one printable line: control bytes (newlines, NUL, DEL) become \xHH, and text longer
// than max_bytes is cut at a UTF-8 character boundary with "..." after it. Never empty when the
// text is not.
inline std::string printable_line(std::string_view s, size_t max_bytes = std::string_view::npos) {
  const bool cut = s.size() > max_bytes;
  if (cut) {
    size_t n = max_bytes;
    while (n > 0 && (uint8_t(s[n]) & 0xC0) == 0x80) --n;  // s[n] starts the first character left out
    s = s.substr(0, n);
  }
  std::string out;
  out.reserve(s.size() + (cut ? 3 : 0));
  for (const char c : s) {
    const auto u = uint8_t(c);
    if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  return cut ? out + "..." : out;
}

// Thrown for bad input (config, checkpoint, batch, unsupported method on a platform) and for
// requests the library cannot satisfy. The message is one line, naming the input at fault; what
// it quotes from the input is made printable here (a NUL would otherwise end what() early).
class Error : public std::runtime_error {
 public:
  explicit Error(std::string_view what) : std::runtime_error(printable_line(what)) {}
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace mla
