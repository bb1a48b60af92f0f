#include "cli/token_command.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <ostream>
#include <sstream>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "services/runtime/auth.h"
#include "services/runtime/transport_security.h"

namespace sluice::cli {

CLI::App* AddTokenCommand(CLI::App& app, TokenCreateFlags* flags) {
  CLI::App* token = app.add_subcommand("token", "Bearer tokens for --auth-tokens files");
  token->require_subcommand(1);
  CLI::App* create =
      token->add_subcommand("create",
                            "Print a new token once and append its SHA-256 (never the "
                            "token) to a tokens "
                            "file; services re-read the file within a second");
  create
      ->add_option("--role", flags->role,
                   "operator (submit, cancel, read), viewer (read), or a "
                   "service's role: "
                   "worker, trainer, controller")
      ->required();
  create
      ->add_option("--identity", flags->identity,
                   "who holds it: a user's name, or a worker's --worker-id "
                   "(what its groups "
                   "are attributed to)")
      ->required();
  create->add_option("--tokens-file", flags->tokens_file, "the tokens file to append to")
      ->capture_default_str();
  create->add_option("--expires-in", flags->expires_in,
                     "lifetime, e.g. 30d, 12h, 90m (default: no expiry)");
  return token;
}

int RunTokenCreate(const TokenCreateFlags& flags, std::ostream& out, std::ostream& err) {
  absl::StatusOr<runtime::Role> role = runtime::ParseRole(flags.role);
  if (!role.ok()) {
    err << "sluice token create: " << role.status().message() << "\n";
    return 2;
  }
  runtime::TokenEntry entry;
  entry.role = *role;
  entry.identity = flags.identity;
  if (!flags.expires_in.empty()) {
    std::string text = flags.expires_in;
    absl::Duration lifetime;
    if (!text.empty() && text.back() == 'd') {
      int days = 0;
      if (!absl::SimpleAtoi(text.substr(0, text.size() - 1), &days) || days <= 0) {
        err << "sluice token create: --expires-in '" << text << "' is not e.g. 30d, 12h, 90m\n";
        return 2;
      }
      lifetime = absl::Hours(24 * days);
    } else if (!absl::ParseDuration(text, &lifetime) || lifetime <= absl::ZeroDuration()) {
      err << "sluice token create: --expires-in '" << text << "' is not e.g. 30d, 12h, 90m\n";
      return 2;
    }
    entry.expires = absl::Now() + lifetime;
  }
  const std::string token = runtime::NewToken();
  entry.sha256 = runtime::TokenHash(token);

  // Read, check, append and write back under an flock of a lock file beside
  // it (not of the file itself: the rename replaces that inode), so that two
  // creates do not lose one of the entries.
  const std::string lock_path = flags.tokens_file + ".lock";
  const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0 || flock(fd, LOCK_EX) != 0) {
    err << "sluice token create: cannot lock " << lock_path << "\n";
    if (fd >= 0) close(fd);
    return 1;
  }
  std::stringstream existing;
  existing << std::ifstream(flags.tokens_file).rdbuf();
  std::string text = existing.str();
  if (text.find("tokens:") == std::string::npos) {
    text = "# Bearer tokens: SHA-256 only (`sluice token create` appends here).\ntokens:\n";
  } else if (!text.empty() && text.back() != '\n') {
    text += "\n";
  }
  text += runtime::TokenEntryYaml(entry);
  absl::Status written = runtime::ParseTokensYaml(text, flags.tokens_file).status();
  if (written.ok()) written = runtime::WriteSecretFile(flags.tokens_file, text);
  close(fd);
  if (!written.ok()) {
    err << "sluice token create: nothing written: " << written.message() << "\n";
    return 1;
  }
  out << token << "\n";
  err << "sluice token create: added " << runtime::RoleName(entry.role) << " '" << entry.identity
      << "' to " << flags.tokens_file << "; the token above is shown only once\n";
  return 0;
}

}  // namespace sluice::cli
