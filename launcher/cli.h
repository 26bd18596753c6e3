// The command line: `bt-launch SUBCOMMAND [options] [-- CMD ARGS...]`.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "env/identity.h"
#include "launcher/log.h"

namespace bt::launcher {

enum class Subcommand { kRun, kEnv, kRendezvous, kCheckpoints, kReport, kBench, kFabric, kDoctor, kUploadWorker, kNcclPreflightWorker, kHelp, kVersion };

struct CliOptions {
  Subcommand subcommand = Subcommand::kHelp;
  std::optional<std::string> config_path;
  std::optional<std::string> root;
  env::IdentityFlags identity;
  std::vector<std::string> command;  // after `--`
  log::Format log_format = log::Format::kText;
  std::string log_level = "info";
  std::string output_format;  // env: shell|json; rendezvous: table|json
  bool serve = false;         // rendezvous --serve
  std::optional<std::string> destination;  // checkpoints: overrides the configured one
  std::optional<std::string> job_id;       // checkpoints, upload-worker
  bool verify = false;                     // checkpoints --verify
  std::optional<std::string> input;        // report: a goodput.json (default: the job's, at its destination)
  std::string out = "bt-launch-report.html";  // report: the HTML file written
  std::string bench_target;                // bench: "checkpoint" or "rendezvous"
  std::optional<std::string> bench_dir;    // bench: where to write (default: a temporary directory)
  int bench_nodes = 1024;                  // bench rendezvous --nodes
  int bench_runs = 3;                      // bench rendezvous --runs
  bool bench_protocol_only = false;        // bench rendezvous --protocol-only
  bool bench_restart = false;              // bench rendezvous --restart: one restart in place after the start
  int parent_pid = 0;                      // upload-worker
  size_t preflight_bytes = size_t(1) << 28;  // nccl-preflight-worker --bytes
  std::optional<std::string> sysfs_root;   // run, rendezvous, fabric, doctor: read devices from DIR/class/infiniband
  std::string help_text;
};

// Throws LaunchFailure(kExitUsage) with the reason.
CliOptions ParseCommandLine(int argc, char** argv);

}  // namespace bt::launcher
