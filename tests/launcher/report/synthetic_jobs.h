// Jobs as the launcher would record them, built from a few facts (when each cycle ran, how it
// ended, what was committed), so each test states only what it is about.
#pragma once

#include <string>
#include <vector>

#include "launcher/report/goodput.h"

namespace bt::launcher::report::testing {

Cycle Ran(int64_t cycle, double start_s, double end_s, const std::string& cause, int node = -1,
          const std::string& resumed_from = "");
Cycle Hung(int64_t cycle, double start_s, double end_s, int node, double stall_s, double detected_s,
           const std::string& resumed_from = "");
Commit Saved(const std::string& name, double saved_s, double committed_s);

// A job over `nodes` nodes: every node's lane has the phases of a launch (identity,
// environment, rendezvous, weights, fabric, health, then per cycle resume, load checkpoints,
// ready, run, and at the end drain and exit barrier) laid out from the cycles, each node a few
// milliseconds apart; hosts are "host-<node>".
JobRecord SyntheticJob(int nodes, std::vector<Cycle> cycles, std::vector<Commit> commits, double wall_end_s,
                       double training_end_s = -1);

// The buckets and goodput summed: what must equal the wall time.
double SumOfBuckets(const Goodput& goodput);

// How many times `needle` occurs in `text`.
size_t Count(const std::string& text, const std::string& needle);

}  // namespace bt::launcher::report::testing
