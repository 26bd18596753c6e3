// goodput.json (issue 31 §1): what node 0 writes at the end of a job and `bt-launch report`
// reads back. Reading checks every field it uses (type, range, and that the buckets add up
// to the wall time), so a corrupt or truncated file is an error naming the file and the
// field, never a crash or a report that lies. Version 1 (times in seconds since the job's
// first launcher start; * = required when read, the rest optional):
//   version*, wall_s*, goodput_s*, goodput_ratio*, training_end_s,
//   badput_s*: {prepare*, restart*, lost_work*, hang*, drain*},
//   cycles*: [{cycle*, cause*, node*, host*, start_s*, end_s*, message, resumed_from,
//              stall_start_s, detected_s (null unless a hang), kept, kept_s,
//              goodput_s, lost_work_s, hang_s, restart_s}],
//   lanes: [{node, slot, host, phases: [{name, start_s, end_s}]}],
//   commits: [{name, saved_s, committed_s}],
//   steps: {steps_done, steps_redone, step_p50_s, step_p95_s, straggler_node (null: none),
//           straggler_ratio, nodes: [{node, median_s, intervals}]},
//   notes: [string]
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "launcher/report/goodput.h"

namespace bt::launcher::report {

// A goodput.json that cannot be read: what() is "<origin>: <field>: <problem>", the field a
// path such as `cycles[2].start_s` ("" when the document itself is not JSON at all).
class GoodputJsonError : public std::runtime_error {
 public:
  GoodputJsonError(std::string origin, std::string field, const std::string& problem);
  const std::string& origin() const { return origin_; }
  const std::string& field() const { return field_; }

 private:
  std::string origin_;
  std::string field_;
};

nlohmann::json GoodputToJson(const Goodput& goodput);

// Throws GoodputJsonError; `origin` names the file (or whatever the JSON came from).
Goodput GoodputFromJson(const nlohmann::json& json, const std::string& origin);

// The text of a goodput.json: a syntax error or a truncation names the field it broke in.
// Throws GoodputJsonError.
Goodput ParseGoodputJson(std::string_view text, const std::string& origin);

// Writes goodput.json at `json_path` (its directory created; whole or not at all). 0, or 74
// (kExitIo) with `error` naming the path.
int WriteGoodputJson(const Goodput& goodput, const std::string& json_path, std::string& error);

}  // namespace bt::launcher::report
