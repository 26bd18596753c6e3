// `bt-launch doctor`: the checks a person runs when a multi-node job will not start, each
// one line with a verdict and, where something is wrong, what to do about it.
#pragma once

#include <string>
#include <vector>

#include "launcher/cli.h"

namespace bt::launcher {

enum class Verdict { kOk, kWarn, kFail, kSkip };

struct Finding {
  std::string check;   // "leader port"
  Verdict verdict = Verdict::kOk;
  std::string detail;  // what was seen
  std::string fix;     // what to do; empty when nothing is wrong
};

// The table (check, verdict, detail, fix), or one JSON object {"findings": [...], "failed": n}.
std::string FormatFindings(const std::vector<Finding>& findings, bool json);

// Runs every check this node can run; exit 0 when none failed, 1 when one did.
int DoctorSubcommand(const CliOptions& cli);

}  // namespace bt::launcher
