// mla/error.h — the one error type of the library: a single line that names what is wrong.
#pragma once
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace mla {

// Thrown for bad input (config, checkpoint, batch, unsupported method on a platform) and for
// requests the library cannot satisfy. The message is one line, naming the input at fault.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace mla
