// tools/mla.cpp — the mla command line. stdout carries results; stderr carries logs and errors.
#include <cstdio>

#include "cli.h"
#include "mla/error.h"

namespace mla::cli {

std::vector<int64_t> parse_int_list(const std::string& text, const std::string& what) {
  std::vector<int64_t> out;
  if (text.empty()) return out;
  size_t pos = 0;
  while (true) {
    const size_t end = text.find(',', pos);
    const std::string item = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    if (item.empty() || item.size() > 18 || item.find_first_not_of("0123456789") != std::string::npos)
      throw UsageError(fmt::format("{}: '{}' is not a non-negative integer", what, item));
    out.push_back(std::stoll(item));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return out;
}

}  // namespace mla::cli

int main(int argc, char** argv) {
  using namespace mla::cli;
  CLI::App app{"mla — DeepSeek Multi-head Latent Attention engine"};
  app.set_version_flag("--version", std::string("mla ") + MLA_VERSION);
  app.require_subcommand(1);
  int rc = 0;
  add_dispatch_command(app, rc);
  add_attn_command(app, rc);
  add_demo_command(app, rc);
  add_attn_demo_command(app, rc);
  add_logits_command(app, rc);
  add_generate_command(app, rc);
  add_inspect_command(app, rc);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "mla: %s\n", e.what());
    return kExitUsage;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "mla: %s\n", e.what());
    return kExitUsage;
  } catch (const mla::Error& e) {
    std::fprintf(stderr, "mla: %s\n", e.what());
    return kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mla: internal error: %s\n", e.what());
    return kExitFailure;
  }
  return rc;
}
