// Goodput (issue 31 §1): how much of a job's wall time became training progress that was
// kept, and where the rest went. Every second of [0, wall_end_s] lands in exactly one
// bucket: goodput, or badput by cause (prepare, restart, lost work, hang, drain), so the
// table adds up. Pure functions over what the launcher already records (its timeline, the
// restart cycles, the committed checkpoints); no clock, no I/O.
//
// The rules, for cycles sorted by their run's start:
//   prepare    0 -> the first cycle's run start
//   goodput    a cycle's run start -> its kept point (the save time of the checkpoint whose
//              progress survived the fault); a successful cycle's whole run
//   lost work  the kept point (or the run start, when nothing was kept) -> the fault (a hang:
//              -> the stall's start, since the job made no progress after it)
//   hang       the stall's start -> its detection
//   restart    the fault (or the detection) -> the next cycle's run start: stop, barrier,
//              resume load, spare promotion
//   drain      the last cycle's end (training_end_s when given) -> wall_end_s
// Which checkpoint was kept: the next cycle's `resumed_from` is the ground truth (that is
// what the job went on from), so a save committed after its cycle failed still counts when
// the restart resumed from it. When that is not known (the last cycle, or a name that is in
// no commit), the newest checkpoint saved during the run and committed before the job's end
// is taken. A cycle is judged by what the next one resumed from only: the commit rule never
// moves `latest` backwards, so an earlier cycle's kept progress stays kept.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace bt::launcher::report {

// Times are seconds since the job's first launcher start.
struct Phase {
  std::string name;  // the timeline's: identity, environment, weights, rendezvous, fabric, health,
                     // nccl preflight, resume, load checkpoints, ready, cache seed, run, drain, exit barrier
  double start_s = 0;
  double end_s = 0;
};

// One launcher's phases. `node` is the training rank it ran last (-1: a spare never promoted).
struct NodeLane {
  int node = -1;
  int slot = -1;
  std::string host;
  std::vector<Phase> phases;
};

// One run of the start commands and how it ended. Causes: failure, lost, hang, unhealthy,
// promotion (a spare took a node's place), success, stopped (SIGTERM: the platform's stop or a
// preemption). Any other cause string is taken as a failure.
struct Cycle {
  int64_t cycle = 0;
  double start_s = 0;  // the run's start; negative or NaN: the cycle never reached its run
  double end_s = 0;    // the fault (or the end of training)
  std::string cause;
  int node = -1;  // the node that failed (-1: none, or the whole job)
  std::string host;
  std::string message;
  std::string resumed_from;            // the checkpoint this cycle started from ("" for none)
  std::optional<double> stall_start_s;  // hangs: the job's last progress
  std::optional<double> detected_s;     // hangs: when the watchdog called it
};

struct Commit {
  std::string name;
  double saved_s = 0;      // complete on disk: the training state it holds is from this time
  double committed_s = 0;  // every rank's part uploaded and the commit record written
};

// Progress lines or heartbeat values, one node's (see steps.h).
struct StepSample {
  double time_s = 0;
  int64_t step = 0;
  int64_t cycle = 0;  // the restart cycle it was seen in: no step time spans two (a restart's downtime)
};
struct NodeSteps {
  int node = -1;
  std::vector<StepSample> samples;
};

struct JobRecord {
  double wall_end_s = 0;  // the last launcher's exit
  double training_end_s = -1;  // the last cycle's job ended (negative: take the last cycle's end_s)
  std::vector<NodeLane> lanes;
  std::vector<Cycle> cycles;
  std::vector<Commit> commits;
  std::vector<NodeSteps> steps;  // empty: no step source
  double straggler_ratio = 1.2;  // launcher.progress.straggler_ratio
};

struct Badput {
  double prepare_s = 0;
  double restart_s = 0;
  double lost_work_s = 0;
  double hang_s = 0;
  double drain_s = 0;
  double Total() const { return prepare_s + restart_s + lost_work_s + hang_s + drain_s; }
};

// One cycle's input as it was taken (times clamped) and its share of each bucket.
struct CycleShare {
  Cycle cycle;
  std::string kept;          // the checkpoint its progress survives in ("" for none)
  double kept_s = 0;         // where its goodput ends (its start when nothing was kept)
  double goodput_s = 0;
  double lost_work_s = 0;
  double hang_s = 0;
  double restart_s = 0;      // from its fault to the next cycle's run (0 for the last)
};

struct NodeStepTime {
  int node = -1;
  double median_s = 0;
  int64_t intervals = 0;
};

struct StepStats {
  int64_t steps_done = 0;    // the highest step reached minus the first one seen
  int64_t steps_redone = 0;  // steps run again after a restart went back to a checkpoint
  double step_p50_s = 0;
  double step_p95_s = 0;
  std::vector<NodeStepTime> nodes;
  std::optional<int> straggler_node;  // the slowest node, when slower than straggler_ratio
  double straggler_ratio = 0;         // its median over the other nodes' median (0: none)
};

struct Goodput {
  static constexpr int kVersion = 1;
  double wall_s = 0;
  double goodput_s = 0;
  double goodput_ratio = 0;  // goodput_s / wall_s (0 for a zero-length job)
  double training_end_s = 0;
  Badput badput;
  std::vector<CycleShare> cycles;
  // What the report draws: the record's lanes and commits, times clamped to [0, wall_s].
  std::vector<NodeLane> lanes;
  std::vector<Commit> commits;
  std::optional<StepStats> steps;
  // What was wrong with the input and how it was taken ("cycle 3 ends before it starts:
  // taken as zero-length"): the figures still add up, the report says why they may be odd.
  std::vector<std::string> notes;
};

Goodput ComputeGoodput(const JobRecord& record);

// The text table node 0 prints after the timeline: wall time, goodput, each bucket with its
// seconds and share, one line per cycle, and the step figures when there are any.
std::string FormatGoodputTable(const Goodput& goodput);

// `value` with `decimals` digits after the point, as printf's "%.*f" gives it (faster: the
// report writes thousands at the end of every job).
std::string FormatFixed(double value, int decimals);

// "1h02m03s", "4m05s", "12.3 s": a duration as the table and the report show it.
std::string FormatSeconds(double seconds);

}  // namespace bt::launcher::report
