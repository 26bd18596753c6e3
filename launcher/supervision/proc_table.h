// What /proc says about processes, for the supervisor (the job's group, what escaped it,
// who handles a signal) and the watchdog (the job's processes at a hang).
#pragma once

#include <sys/types.h>

#include <set>
#include <string>
#include <vector>

namespace bt::launcher {

struct ProcessEntry {
  pid_t pid = 0;
  pid_t parent = 0;
  pid_t group = 0;
  char state = 0;
};

// Every process now, from /proc/*/stat.
std::vector<ProcessEntry> AllProcesses();

// Every descendant of `ancestor` now, from one pass over /proc (the launcher is a
// subreaper: a job's orphans stay below it). With `except_executable`, a process running that
// program (the launcher's own helpers) is left out with everything below it.
std::set<pid_t> DescendantsOf(pid_t ancestor, const std::string& except_executable = "");

// Whether `pid` has a handler installed for `signal_number`: the SigCgt mask of
// /proc/PID/status (hex, bit N-1 for signal N).
bool HandlesSignal(pid_t pid, int signal_number);

// Its command line, arguments separated by spaces, cut at 200 bytes.
std::string CommandLine(pid_t pid);

}  // namespace bt::launcher
