#ifndef SLUICE_CLI_TOKEN_COMMAND_H_
#define SLUICE_CLI_TOKEN_COMMAND_H_

#include <iosfwd>
#include <string>

namespace CLI {
class App;
}

namespace sluice::cli {

// `sluice token create --role R --identity I [--tokens-file F] [--expires-in
// D]`: prints a fresh bearer token once (stdout) and appends its SHA-256 entry
// to the tokens file the services read with --auth-tokens (created if missing;
// they pick the change up within a second). The token itself is stored
// nowhere.
struct TokenCreateFlags {
  std::string role;
  std::string identity;
  std::string tokens_file = "tokens.yaml";
  std::string expires_in;  // "30d", "12h"; empty = never.
};

CLI::App* AddTokenCommand(CLI::App& app, TokenCreateFlags* flags);
int RunTokenCreate(const TokenCreateFlags& flags, std::ostream& out, std::ostream& err);

}  // namespace sluice::cli

#endif  // SLUICE_CLI_TOKEN_COMMAND_H_
