#include "launcher/cli.h"

#include <cstdlib>

#include <cxxopts.hpp>

#include "launcher/exit_codes.h"

namespace bt::launcher {
namespace {

constexpr const char* kUsage =
    "usage: bt-launch run [options] [-- CMD ARGS...]   run the job (start_commands, or CMD)\n"
    "       bt-launch env [options] [--format shell|json]   print the job's environment, run nothing\n"
    "       bt-launch rendezvous [--serve] [options] [--format table|json]   join (or lead) and print the roster\n"
    "       bt-launch checkpoints [--destination URI] [--job-id ID] [--verify] [--format table|json]   list committed checkpoints\n"
    "       bt-launch report [--input goodput.json | --destination URI --job-id ID] [--out FILE]   the job's goodput report as one HTML file\n"
    "       bt-launch fabric [--sysfs-root DIR] [--format text|json]   this node's RDMA devices and the NCCL variables it would set\n"
    "       bt-launch doctor [options] [--format table|json]   why a multi-node job will not start: one line per check, with the fix\n"
    "       bt-launch bench checkpoint [--dir DIR] [--format table|json]   checkpoint hashing, handoff and upload figures\n"
    "       bt-launch bench rendezvous [--nodes N] [--runs R] [--protocol-only | --restart] [--sysfs-root DIR]   N nodes starting a job together\n"
    "       bt-launch --version\n";

Subcommand ParseSubcommand(const std::string& word) {
  if (word == "run") return Subcommand::kRun;
  if (word == "env") return Subcommand::kEnv;
  if (word == "rendezvous") return Subcommand::kRendezvous;
  if (word == "checkpoints") return Subcommand::kCheckpoints;
  if (word == "report") return Subcommand::kReport;
  if (word == "bench") return Subcommand::kBench;
  if (word == "fabric") return Subcommand::kFabric;
  if (word == "doctor") return Subcommand::kDoctor;
  if (word == "upload-worker") return Subcommand::kUploadWorker;  // started by `run`, not by people
  if (word == "nccl-preflight-worker") return Subcommand::kNcclPreflightWorker;  // the same
  if (word == "--help" || word == "-h" || word == "help") return Subcommand::kHelp;
  if (word == "--version" || word == "version") return Subcommand::kVersion;
  throw LaunchFailure(kExitUsage, "unknown subcommand \"" + word + "\"\n" + kUsage);
}

std::optional<std::string> Optional(const cxxopts::ParseResult& result, const std::string& name) {
  if (!result.count(name)) return std::nullopt;
  return result[name].as<std::string>();
}

}  // namespace

CliOptions ParseCommandLine(int argc, char** argv) {
  CliOptions cli;
  cli.help_text = kUsage;
  if (argc < 2) throw LaunchFailure(kExitUsage, std::string("missing subcommand\n") + kUsage);
  cli.subcommand = ParseSubcommand(argv[1]);
  if (cli.subcommand == Subcommand::kHelp || cli.subcommand == Subcommand::kVersion) return cli;

  std::vector<char*> own_args = {argv[0]};
  int index = 2;
  if (cli.subcommand == Subcommand::kBench) {
    if (index >= argc || argv[index][0] == '-') {
      throw LaunchFailure(kExitUsage, std::string("bench: which one? (checkpoint, rendezvous)\n") + kUsage);
    }
    cli.bench_target = argv[index++];
    if (cli.bench_target != "checkpoint" && cli.bench_target != "rendezvous") {
      throw LaunchFailure(kExitUsage, "bench: unknown benchmark \"" + cli.bench_target + "\" (expected checkpoint or rendezvous)");
    }
  }
  for (; index < argc && std::string(argv[index]) != "--"; ++index) own_args.push_back(argv[index]);
  for (++index; index < argc; ++index) cli.command.emplace_back(argv[index]);

  cxxopts::Options options("bt-launch", kUsage);
  options.add_options()
      ("config", "job config JSON file (default: BT_JOB_CONFIG, else the embedded default)", cxxopts::value<std::string>())
      ("root", "put every default path under DIR (default: BT_ROOT)", cxxopts::value<std::string>())
      ("node-rank", "this node's rank", cxxopts::value<std::string>())
      ("node-count", "number of nodes", cxxopts::value<std::string>())
      ("leader-addr", "address (IP or DNS name) of node 0", cxxopts::value<std::string>())
      ("log-format", "text or json", cxxopts::value<std::string>()->default_value("text"))
      ("log-level", "trace, debug, info, warn, error", cxxopts::value<std::string>()->default_value("info"))
      ("format", "output format (env: shell|json; rendezvous: table|json)", cxxopts::value<std::string>())
      ("serve", "rendezvous: lead (serve the store) instead of joining")
      ("destination", "checkpoints, report: the destination URI (default: the job's)", cxxopts::value<std::string>())
      ("job-id", "checkpoints, report: whose checkpoints (default: this job's id)", cxxopts::value<std::string>())
      ("verify", "checkpoints: re-hash every file against its manifest")
      ("input", "report: a goodput.json (default: <job_id>/.bt-report/goodput.json at the destination)", cxxopts::value<std::string>())
      ("out", "report: the HTML file to write (default: bt-launch-report.html)", cxxopts::value<std::string>())
      ("dir", "bench: directory to write in (default: a new one under /tmp)", cxxopts::value<std::string>())
      ("parent-pid", "upload-worker: the launcher's pid", cxxopts::value<int>())
      ("nodes", "bench rendezvous: number of nodes, node 0 included (default 1024)", cxxopts::value<int>())
      ("runs", "bench rendezvous: runs; the JSON line has the median (default 3)", cxxopts::value<int>())
      ("protocol-only", "bench rendezvous: the protocol alone (join, a store barrier, exit) under `rendezvous --serve`, "
                        "instead of what `run` does before its first command")
      ("restart", "bench rendezvous: then one node's job fails and every node restarts in place: the restart phase "
                  "is the failure's report to the last node's go for cycle 1")
      ("bytes", "nccl-preflight-worker: all-reduce size per GPU", cxxopts::value<size_t>())
      ("sysfs-root", "run, rendezvous, fabric, doctor: read RDMA devices from DIR/class/infiniband (default: BT_SYSFS_ROOT, else /sys)",
       cxxopts::value<std::string>())
      ("h,help", "show this help");
  cxxopts::ParseResult result;
  try {
    result = options.parse(int(own_args.size()), own_args.data());
  } catch (const cxxopts::exceptions::exception& error) {
    throw LaunchFailure(kExitUsage, std::string(error.what()) + "\n" + kUsage);
  }
  if (!result.unmatched().empty()) {
    throw LaunchFailure(kExitUsage, "unexpected argument \"" + result.unmatched().front() +
                                        "\" (put the command after `--`)\n" + kUsage);
  }
  if (result.count("help")) {
    cli.subcommand = Subcommand::kHelp;
    cli.help_text = options.help();
    return cli;
  }
  cli.config_path = Optional(result, "config");
  cli.root = Optional(result, "root");
  if (!cli.root) {
    const char* root_env = std::getenv("BT_ROOT");
    if (root_env != nullptr && *root_env != '\0') cli.root = root_env;
  }
  cli.identity = {Optional(result, "node-rank"), Optional(result, "node-count"), Optional(result, "leader-addr")};
  try {
    cli.log_format = log::ParseFormat(result["log-format"].as<std::string>());
  } catch (const std::invalid_argument& error) {
    throw LaunchFailure(kExitUsage, error.what());
  }
  cli.log_level = result["log-level"].as<std::string>();
  cli.serve = result.count("serve") > 0;
  cli.destination = Optional(result, "destination");
  cli.job_id = Optional(result, "job-id");
  cli.verify = result.count("verify") > 0;
  cli.input = Optional(result, "input");
  if (result.count("out")) cli.out = result["out"].as<std::string>();
  cli.bench_dir = Optional(result, "dir");
  if (result.count("parent-pid")) cli.parent_pid = result["parent-pid"].as<int>();
  cli.sysfs_root = Optional(result, "sysfs-root");
  if (result.count("nodes")) cli.bench_nodes = result["nodes"].as<int>();
  if (result.count("runs")) cli.bench_runs = result["runs"].as<int>();
  cli.bench_protocol_only = result.count("protocol-only") > 0;
  cli.bench_restart = result.count("restart") > 0;
  if (cli.bench_nodes < 2 || cli.bench_nodes > 1'000'000) throw LaunchFailure(kExitUsage, "--nodes: expected 2 to 1000000");
  if (cli.bench_runs < 1 || cli.bench_runs > 100) throw LaunchFailure(kExitUsage, "--runs: expected 1 to 100");
  if (result.count("bytes")) cli.preflight_bytes = result["bytes"].as<size_t>();
  const std::string human_format = cli.subcommand == Subcommand::kEnv      ? "shell"
                                   : cli.subcommand == Subcommand::kFabric ? "text"
                                                                           : "table";
  cli.output_format = Optional(result, "format").value_or(human_format);
  const bool format_ok = cli.output_format == human_format || cli.output_format == "json";
  if (!format_ok) throw LaunchFailure(kExitUsage, "--format: unsupported value \"" + cli.output_format + "\"");
  if (!cli.command.empty() && cli.subcommand != Subcommand::kRun) {
    throw LaunchFailure(kExitUsage, "only `run` takes a command after `--`");
  }
  return cli;
}

}  // namespace bt::launcher
