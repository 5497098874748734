// tools/mla.cpp — the mla command line. stdout carries results; stderr carries logs and errors.
#include <cstdio>

#include "cli.h"
#include "mla/error.h"
#include "tp_ranks.h"

// An error as exactly one line on stderr, whatever bytes the message quotes from the input.
static void print_error(const std::string& what) {
  std::fprintf(stderr, "mla: %s\n", mla::printable_line(what).c_str());
}

int main(int argc, char** argv) {
  using namespace mla::cli;
  set_command_line(argc, argv);
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
  add_shape_command(app, rc);
  add_bench_command(app, rc);
  add_serve_command(app, rc);
  add_bench_serve_command(app, rc);
  add_bench_model_command(app, rc);
  add_tokenize_command(app, rc);
  add_detokenize_command(app, rc);
  add_chat_template_command(app, rc);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    print_error(e.what());
    return kExitUsage;
  } catch (const UsageError& e) {
    print_error(e.what());
    return kExitUsage;
  } catch (const RankFinished&) {  // a tensor-parallel rank other than 0: rank 0's engine has ended
    return 0;
  } catch (const mla::Error& e) {
    print_error(e.what());
    return kExitFailure;
  } catch (const std::exception& e) {
    print_error(std::string("internal error: ") + e.what());
    return kExitFailure;
  }
  return rc;
}
