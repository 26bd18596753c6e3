// bt-launch: the entrypoint of every container of a multi-node training job.
#include <csignal>
#include <cstdio>
#include <exception>

#include <spdlog/spdlog.h>

#include "launcher/cli.h"
#include "launcher/exit_codes.h"
#include "launcher/launch.h"
#include "launcher/log.h"
#include "launcher/phases/nccl_preflight.h"
#include "launcher/supervision/peers.h"
#include "launcher/tools/bench.h"
#include "launcher/tools/commands.h"
#include "launcher/tools/doctor.h"

#ifndef BT_LAUNCH_VERSION
#define BT_LAUNCH_VERSION "dev"
#endif

namespace {

int Dispatch(const bt::launcher::CliOptions& cli) {
  using bt::launcher::Subcommand;
  switch (cli.subcommand) {
    case Subcommand::kRun: return bt::launcher::RunSubcommand(cli);
    case Subcommand::kEnv: return bt::launcher::EnvSubcommand(cli);
    case Subcommand::kRendezvous: return bt::launcher::RendezvousSubcommand(cli);
    case Subcommand::kCheckpoints: return bt::launcher::CheckpointsSubcommand(cli);
    case Subcommand::kReport: return bt::launcher::ReportSubcommand(cli);
    case Subcommand::kBench: return bt::launcher::BenchSubcommand(cli);
    case Subcommand::kFabric: return bt::launcher::FabricSubcommand(cli);
    case Subcommand::kDoctor: return bt::launcher::DoctorSubcommand(cli);
    case Subcommand::kUploadWorker: return bt::launcher::UploadWorkerSubcommand(cli);
    case Subcommand::kNcclPreflightWorker: return bt::launcher::NcclPreflightWorker(cli);
    case Subcommand::kVersion: std::printf("bt-launch %s\n", BT_LAUNCH_VERSION); return 0;
    case Subcommand::kHelp: std::fputs(cli.help_text.c_str(), stdout); return 0;
  }
  return bt::launcher::kExitInternal;
}

}  // namespace

int main(int argc, char** argv) {
  // A reader of our output that goes away (a log pipe, `| head`) must not kill PID 1 with
  // SIGPIPE: writes fail with EPIPE instead. Children get the default back (supervisor.cpp).
  std::signal(SIGPIPE, SIG_IGN);
  bt::log::Init(bt::log::Format::kText, spdlog::level::info);
  try {
    bt::launcher::RendezvousTokenFromEnvironment();  // before anything can be spawned or read it
    bt::launcher::CliOptions cli = bt::launcher::ParseCommandLine(argc, argv);
    bt::log::Init(cli.log_format, spdlog::level::from_str(cli.log_level));
    return Dispatch(cli);
  } catch (const bt::launcher::LaunchFailure& failure) {
    spdlog::error("{}", failure.what());
    return failure.code();
  } catch (const std::exception& error) {
    spdlog::critical("internal error: {}", error.what());
    return bt::launcher::kExitInternal;
  }
}
