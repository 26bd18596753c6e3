// `bt-launch run -- CMD` reduced to its supervision, with the output relay on: a
// SignalRouter, a Supervisor given a watchdog::Progress, one command. For the output
// relay's tests and scripts/bench_output.sh until `run` turns the relay on itself (with
// the watchdog). Exits with the job's code, as `run` does.
//   relay_run [--no-relay] [--grace-ms N] [--log-level L] -- CMD [ARG...]
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "launcher/log.h"
#include "launcher/supervision/signals.h"
#include "launcher/supervision/supervisor.h"
#include "launcher/watchdog/output_files.h"
#include "launcher/watchdog/progress.h"

extern char** environ;

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);  // as bt-launch's main
  bool relay = true;
  int grace_ms = 5000;
  std::string level = "warn";  // the job's stderr alone, unless the relay has something to say
  int first = 1;
  for (; first < argc && std::strcmp(argv[first], "--") != 0; ++first) {
    if (std::strcmp(argv[first], "--no-relay") == 0) {
      relay = false;
    } else if (std::strcmp(argv[first], "--grace-ms") == 0 && first + 1 < argc) {
      grace_ms = std::atoi(argv[++first]);
    } else if (std::strcmp(argv[first], "--log-level") == 0 && first + 1 < argc) {
      level = argv[++first];
    } else {
      std::fprintf(stderr, "usage: %s [--no-relay] [--grace-ms N] [--log-level L] -- CMD [ARG...]\n", argv[0]);
      return 64;
    }
  }
  if (first + 1 >= argc) {
    std::fprintf(stderr, "usage: %s [--no-relay] [--grace-ms N] [--log-level L] -- CMD [ARG...]\n", argv[0]);
    return 64;
  }
  bt::log::Init(bt::log::Format::kText, spdlog::level::from_str(level));
  bt::launcher::SignalRouter signals;
  bt::launcher::watchdog::Progress progress;
  std::optional<bt::launcher::watchdog::OutputFiles> output_files;  // as `run` with the watchdog on: a file is the job's
  if (relay) output_files.emplace();
  bt::launcher::Supervisor supervisor(signals, std::chrono::milliseconds(grace_ms), std::chrono::seconds(5),
                                      relay ? &progress : nullptr, relay ? &*output_files : nullptr);
  bt::launcher::Command command;
  command.argv.assign(argv + first + 1, argv + argc);
  command.search_path = true;
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) environment.emplace_back(*entry);
  const bt::launcher::JobOutcome outcome = supervisor.Run({command}, environment, "", nullptr, "command");
  spdlog::info("progress seen: {}", progress.seen() || (output_files && output_files->JobWrote()) ? "yes" : "no");
  return outcome.exit_code;
}
