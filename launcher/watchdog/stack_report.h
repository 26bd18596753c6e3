// Which rank is the odd one in a hang: every process's Python stack (faulthandler's text)
// reduced to the innermost frames of its main thread, processes grouped by them, and the
// groups that differ from the largest one named. In a collective hang the many wait in
// the same call (all_reduce) and the culprit is elsewhere (a sleep, a dataloader).
#pragma once

#include <string>
#include <vector>

#include "launcher/watchdog/python_stacks.h"

namespace bt::launcher::watchdog {

// The main thread's innermost `frames` frames, innermost first, as
// "all_reduce (distributed_c10d.py:1234) < main (train.py:30)"; "" when the dump holds no
// frame. The main thread is the one whose outermost frame is a module's body; failing
// that, the thread that handled the signal.
std::string InnermostFrames(const std::string& dump, int frames = 2);

struct StackGroup {
  std::string frames;                   // InnermostFrames of every member
  std::vector<const ProcessStack*> members;
};

// Largest group first; ties by frames, so the order is the same on every run.
std::vector<StackGroup> GroupByInnermostFrames(const std::vector<ProcessStack>& stacks, int frames = 2);

// "rank 2 (node 1, host node02, local rank 0, pid 4242)" from what the process saw.
std::string DescribeProcess(const ProcessStack& stack);

// One line per group for the log: the largest first, then each that differs, naming its
// members; processes that did not answer are named on their own line.
std::vector<std::string> SummarizeStacks(const std::vector<ProcessStack>& stacks, int frames = 2);

}  // namespace bt::launcher::watchdog
