// The environment the job's commands get: the platform's BT_* contract, the user's
// runtime.environment_variables (secrets resolved), torchrun-compatible variables, and
// the inherited environment minus MPI launcher variables.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "env/identity.h"
#include "env/job_config.h"

namespace bt::env {

// Where default paths live. With a root, node-local paths go under ROOT/node-<rank>/ and
// shared ones (caches, secrets) under ROOT/, so several nodes can share one host and one
// root the way nodes of a real cluster share only the project cache.
class PathLayout {
 public:
  PathLayout(std::optional<std::string> root, int node_rank);
  std::string NodeLocal(const std::string& default_path) const;
  std::string Shared(const std::string& default_path) const;
  bool has_root() const { return root_.has_value(); }

 private:
  std::optional<std::string> root_;
  int node_rank_;
};

// A secret that is missing or unreadable (exit 65). Never carries the secret's value.
class SecretError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct JobEnvironment {
  std::map<std::string, std::string> variables;
  std::set<std::string> secret_variables;  // names whose values must never be shown
  std::vector<std::string> directories;    // created before the job starts
  std::string working_dir;                 // empty: inherit the launcher's
  std::string secrets_dir;                 // BT_SECRETS_DIR, else /secrets (under the root)

  std::vector<std::string> ToEnviron() const;  // "NAME=value" entries for execve
  std::string RenderShell() const;             // `export NAME='value'` lines, secrets masked
  std::string RenderJson() const;              // one flat JSON object, secrets masked
};

inline constexpr const char* kMaskedSecret = "<secret>";
// The launchers' shared secret: it stays with the launcher, the job never sees it.
inline constexpr const char* kRendezvousTokenVariable = "BT_RENDEZVOUS_TOKEN";

// `inherited` is the launcher's own environment as "NAME=value" entries.
JobEnvironment BuildJobEnvironment(const JobConfig& config, const NodeIdentity& identity, const PathLayout& paths,
                                   const std::vector<std::string>& inherited);

// Creates every directory of the environment (mkdir -p). Throws std::runtime_error naming
// the path and the errno text.
void CreateDirectories(const JobEnvironment& environment);

// The job id every node agrees on: BT_TRAINING_JOB_ID, else launcher.job_id, else the
// orchestrator's (slurm-<SLURM_JOB_ID>.<SLURM_STEP_ID>; k8s-<Indexed Job name> or
// k8s-<LeaderWorkerSet leader>), else one derived from the config text (same config, same
// id). Throws ConfigError when the inherited BT_TRAINING_JOB_ID is not a path component
// (ValidateJobId).
std::string ResolveJobId(const JobConfig& config, const std::map<std::string, std::string>& inherited);
// The last of those: "local-" and the config text's digest. It names no job on its own
// (two nodes of one local test may be given different config files).
std::string ConfigDerivedJobId(const JobConfig& config);

// The secret `secret_name` from `secrets_dir` (one trailing newline dropped, at most 1 MiB).
// Throws SecretError naming `used_by` (the config field), the secret and the path.
std::string ReadSecretFile(const std::string& secrets_dir, const std::string& secret_name, const std::string& used_by);

std::map<std::string, std::string> ParseEnviron(const std::vector<std::string>& entries);
std::vector<std::string> CurrentEnviron();

}  // namespace bt::env
