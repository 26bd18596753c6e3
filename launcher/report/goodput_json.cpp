#include "launcher/report/goodput_json.h"

#include <cmath>
#include <limits>
#include <vector>

#include "launcher/exit_codes.h"
#include "storage/durable_file.h"

namespace bt::launcher::report {
namespace {

using nlohmann::json;

// How far the stored figures may stray from adding up (they are sums of doubles).
constexpr double kSumToleranceS = 1e-6;

std::string Join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }
std::string Index(const std::string& path, size_t index) { return path + "[" + std::to_string(index) + "]"; }

std::string Kind(const json& value) {
  if (value.is_null()) return "null";
  if (value.is_boolean()) return "a boolean";
  if (value.is_number()) return "a number";
  if (value.is_string()) return "a string";
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  return "binary data";
}

// Where a JSON text broke: the path of the value being read when the parser gave up.
class PathAtError final : public json::json_sax_t {
 public:
  bool null() override { return Value(); }
  bool boolean(bool) override { return Value(); }
  bool number_integer(number_integer_t) override { return Value(); }
  bool number_unsigned(number_unsigned_t) override { return Value(); }
  bool number_float(number_float_t, const string_t&) override { return Value(); }
  bool string(string_t&) override { return Value(); }
  bool binary(binary_t&) override { return Value(); }
  bool start_object(std::size_t) override {
    frames_.push_back(Frame{false, 0, ""});
    return true;
  }
  bool key(string_t& name) override {
    frames_.back().key = name;
    return true;
  }
  bool end_object() override { return EndContainer(); }
  bool start_array(std::size_t) override {
    frames_.push_back(Frame{true, 0, ""});
    return true;
  }
  bool end_array() override { return EndContainer(); }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& error) override {
    position_ = position;
    message_ = error.what();
    path_ = Path();
    return false;
  }

  const std::string& path() const { return path_; }
  size_t position() const { return position_; }
  const std::string& message() const { return message_; }

 private:
  struct Frame {
    bool array;
    size_t index;     // arrays: the element being read
    std::string key;  // objects: the member being read
  };
  // A value (or a container, at its end) completed its parent's current element.
  bool Value() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }
  bool EndContainer() {
    frames_.pop_back();
    return Value();
  }
  std::string Path() const {
    std::string path;
    for (const Frame& frame : frames_) {
      if (frame.array) {
        path = Index(path, frame.index);
      } else if (!frame.key.empty()) {
        path = Join(path, frame.key);
      }
    }
    return path;
  }

  std::vector<Frame> frames_;
  std::string path_;
  size_t position_ = 0;
  std::string message_;
};

// The fields of one JSON object, each read with its path for the error.
class Fields {
 public:
  Fields(const json& object, std::string path, const std::string& origin) : object_(object), path_(std::move(path)), origin_(origin) {
    if (!object_.is_object()) Fail(path_, "expected an object, found " + Kind(object_));
  }

  [[noreturn]] void Fail(const std::string& field, const std::string& problem) const {
    throw GoodputJsonError(origin_, field, problem);
  }
  std::string PathOf(const std::string& key) const { return Join(path_, key); }
  bool Has(const std::string& key) const { return object_.contains(key) && !object_.at(key).is_null(); }

  const json& Required(const std::string& key) const {
    if (!object_.contains(key)) Fail(PathOf(key), "missing");
    return object_.at(key);
  }
  double Number(const std::string& key) const {
    const json& value = Required(key);
    if (!value.is_number()) Fail(PathOf(key), "expected a number, found " + Kind(value));
    const double number = value.get<double>();
    if (!std::isfinite(number)) Fail(PathOf(key), "not a finite number");
    return number;
  }
  // A time or a duration inside the job: [0, limit].
  double Seconds(const std::string& key, double limit = std::numeric_limits<double>::infinity()) const {
    const double seconds = Number(key);
    if (seconds < 0) Fail(PathOf(key), "negative (" + std::to_string(seconds) + ")");
    if (seconds > limit + kSumToleranceS) {
      Fail(PathOf(key), std::to_string(seconds) + " s is past the job's wall time (" + std::to_string(limit) + " s)");
    }
    return seconds;
  }
  std::optional<double> OptionalSeconds(const std::string& key, double limit) const {
    if (!Has(key)) return std::nullopt;
    return Seconds(key, limit);
  }
  int64_t Integer(const std::string& key) const {
    const json& value = Required(key);
    if (!value.is_number_integer()) Fail(PathOf(key), "expected an integer, found " + Kind(value));
    return value.get<int64_t>();
  }
  int Int(const std::string& key) const {
    const int64_t value = Integer(key);
    if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) Fail(PathOf(key), "out of range");
    return int(value);
  }
  std::string String(const std::string& key) const {
    const json& value = Required(key);
    if (!value.is_string()) Fail(PathOf(key), "expected a string, found " + Kind(value));
    return value.get<std::string>();
  }
  std::string OptionalString(const std::string& key) const { return Has(key) ? String(key) : ""; }
  const json& Array(const std::string& key) const {
    const json& value = Required(key);
    if (!value.is_array()) Fail(PathOf(key), "expected an array, found " + Kind(value));
    return value;
  }
  const json& OptionalArray(const std::string& key) const {
    static const json kEmpty = json::array();
    return Has(key) ? Array(key) : kEmpty;
  }

 private:
  const json& object_;
  std::string path_;
  const std::string& origin_;
};

json OptionalToJson(const std::optional<double>& value) { return value ? json(*value) : json(nullptr); }

json LaneToJson(const NodeLane& lane) {
  json phases = json::array();
  for (const Phase& phase : lane.phases) {
    phases.push_back({{"name", phase.name}, {"start_s", phase.start_s}, {"end_s", phase.end_s}});
  }
  return {{"node", lane.node}, {"slot", lane.slot}, {"host", lane.host}, {"phases", std::move(phases)}};
}

json CycleToJson(const CycleShare& share) {
  const Cycle& cycle = share.cycle;
  return {{"cycle", cycle.cycle},
          {"cause", cycle.cause},
          {"node", cycle.node},
          {"host", cycle.host},
          {"message", cycle.message},
          {"start_s", std::isfinite(cycle.start_s) && cycle.start_s >= 0 ? json(cycle.start_s) : json(nullptr)},
          {"end_s", cycle.end_s},
          {"resumed_from", cycle.resumed_from},
          {"stall_start_s", OptionalToJson(cycle.stall_start_s)},
          {"detected_s", OptionalToJson(cycle.detected_s)},
          {"kept", share.kept},
          {"kept_s", share.kept_s},
          {"goodput_s", share.goodput_s},
          {"lost_work_s", share.lost_work_s},
          {"hang_s", share.hang_s},
          {"restart_s", share.restart_s}};
}

json StepsToJson(const StepStats& steps) {
  json nodes = json::array();
  for (const NodeStepTime& node : steps.nodes) {
    nodes.push_back({{"node", node.node}, {"median_s", node.median_s}, {"intervals", node.intervals}});
  }
  return {{"steps_done", steps.steps_done},
          {"steps_redone", steps.steps_redone},
          {"step_p50_s", steps.step_p50_s},
          {"step_p95_s", steps.step_p95_s},
          {"straggler_node", steps.straggler_node ? json(*steps.straggler_node) : json(nullptr)},
          {"straggler_ratio", steps.straggler_ratio},
          {"nodes", std::move(nodes)}};
}

Phase PhaseFromJson(const Fields& fields, double wall_s) {
  Phase phase{fields.String("name"), fields.Seconds("start_s", wall_s), fields.Seconds("end_s", wall_s)};
  if (phase.end_s < phase.start_s) fields.Fail(fields.PathOf("end_s"), "before start_s");
  return phase;
}

NodeLane LaneFromJson(const Fields& fields, double wall_s, const std::string& origin) {
  NodeLane lane{fields.Int("node"), fields.Int("slot"), fields.String("host"), {}};
  const json& phases = fields.Array("phases");
  for (size_t i = 0; i < phases.size(); ++i) {
    lane.phases.push_back(PhaseFromJson(Fields(phases[i], Index(fields.PathOf("phases"), i), origin), wall_s));
  }
  return lane;
}

Commit CommitFromJson(const Fields& fields, double wall_s) {
  return Commit{fields.String("name"), fields.Seconds("saved_s", wall_s), fields.Seconds("committed_s", wall_s)};
}

CycleShare CycleFromJson(const Fields& fields, double wall_s) {
  CycleShare share;
  Cycle& cycle = share.cycle;
  cycle.cycle = fields.Integer("cycle");
  cycle.cause = fields.String("cause");
  cycle.node = fields.Int("node");
  cycle.host = fields.String("host");
  // null: the cycle never reached its run (a restart decided while its barrier waited).
  if (!fields.Has("start_s")) fields.Required("start_s");
  cycle.start_s = fields.OptionalSeconds("start_s", wall_s).value_or(std::numeric_limits<double>::quiet_NaN());
  cycle.end_s = fields.Seconds("end_s", wall_s);
  if (cycle.end_s < cycle.start_s) fields.Fail(fields.PathOf("end_s"), "before start_s");
  cycle.message = fields.OptionalString("message");
  cycle.resumed_from = fields.OptionalString("resumed_from");
  cycle.stall_start_s = fields.OptionalSeconds("stall_start_s", wall_s);
  cycle.detected_s = fields.OptionalSeconds("detected_s", wall_s);
  share.kept = fields.OptionalString("kept");
  share.kept_s = fields.Has("kept_s") ? fields.Seconds("kept_s", wall_s) : cycle.start_s;
  auto duration = [&](const char* key) { return fields.Has(key) ? fields.Seconds(key, wall_s) : 0.0; };
  share.goodput_s = duration("goodput_s");
  share.lost_work_s = duration("lost_work_s");
  share.hang_s = duration("hang_s");
  share.restart_s = duration("restart_s");
  return share;
}

StepStats StepsFromJson(const Fields& fields, const std::string& origin) {
  StepStats steps;
  steps.steps_done = fields.Integer("steps_done");
  steps.steps_redone = fields.Integer("steps_redone");
  steps.step_p50_s = fields.Seconds("step_p50_s");
  steps.step_p95_s = fields.Seconds("step_p95_s");
  if (fields.Has("straggler_node")) steps.straggler_node = fields.Int("straggler_node");
  steps.straggler_ratio = fields.Seconds("straggler_ratio");
  const json& nodes = fields.OptionalArray("nodes");
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Fields node(nodes[i], Index(fields.PathOf("nodes"), i), origin);
    steps.nodes.push_back(NodeStepTime{node.Int("node"), node.Seconds("median_s"), node.Integer("intervals")});
  }
  return steps;
}

Badput BadputFromJson(const Fields& fields, double wall_s) {
  return Badput{fields.Seconds("prepare", wall_s), fields.Seconds("restart", wall_s), fields.Seconds("lost_work", wall_s),
                fields.Seconds("hang", wall_s), fields.Seconds("drain", wall_s)};
}

// The figures a table is drawn from must add up, or the report would show a job that never was.
void CheckItAddsUp(const Goodput& goodput, const Fields& top) {
  const double tolerance_s = kSumToleranceS * std::max(1.0, goodput.wall_s);
  const double total_s = goodput.goodput_s + goodput.badput.Total();
  if (std::fabs(total_s - goodput.wall_s) > tolerance_s) {
    top.Fail("badput_s", "goodput_s and the badput add up to " + std::to_string(total_s) + " s, not wall_s (" +
                             std::to_string(goodput.wall_s) + " s)");
  }
  const double ratio = goodput.wall_s > 0 ? goodput.goodput_s / goodput.wall_s : 0;
  if (std::fabs(ratio - goodput.goodput_ratio) > 1e-6) {
    top.Fail("goodput_ratio", std::to_string(goodput.goodput_ratio) + " is not goodput_s / wall_s (" + std::to_string(ratio) + ")");
  }
}

}  // namespace

GoodputJsonError::GoodputJsonError(std::string origin, std::string field, const std::string& problem)
    : std::runtime_error(origin + ": " + (field.empty() ? std::string() : field + ": ") + problem),
      origin_(std::move(origin)),
      field_(std::move(field)) {}

nlohmann::json GoodputToJson(const Goodput& goodput) {
  json cycles = json::array();
  for (const CycleShare& share : goodput.cycles) cycles.push_back(CycleToJson(share));
  json lanes = json::array();
  for (const NodeLane& lane : goodput.lanes) lanes.push_back(LaneToJson(lane));
  json commits = json::array();
  for (const Commit& commit : goodput.commits) {
    commits.push_back({{"name", commit.name}, {"saved_s", commit.saved_s}, {"committed_s", commit.committed_s}});
  }
  json document = {{"version", Goodput::kVersion},
                   {"wall_s", goodput.wall_s},
                   {"goodput_s", goodput.goodput_s},
                   {"goodput_ratio", goodput.goodput_ratio},
                   {"training_end_s", goodput.training_end_s},
                   {"badput_s",
                    {{"prepare", goodput.badput.prepare_s},
                     {"restart", goodput.badput.restart_s},
                     {"lost_work", goodput.badput.lost_work_s},
                     {"hang", goodput.badput.hang_s},
                     {"drain", goodput.badput.drain_s}}},
                   {"cycles", std::move(cycles)},
                   {"lanes", std::move(lanes)},
                   {"commits", std::move(commits)},
                   {"notes", goodput.notes}};
  if (goodput.steps) document["steps"] = StepsToJson(*goodput.steps);
  return document;
}

Goodput GoodputFromJson(const nlohmann::json& document, const std::string& origin) {
  const Fields top(document, "", origin);
  const int64_t version = top.Integer("version");
  if (version != Goodput::kVersion) {
    top.Fail("version", std::to_string(version) + " is not a version this bt-launch reads (" +
                            std::to_string(Goodput::kVersion) + ")");
  }
  Goodput goodput;
  goodput.wall_s = top.Seconds("wall_s");
  goodput.goodput_s = top.Seconds("goodput_s", goodput.wall_s);
  goodput.goodput_ratio = top.Number("goodput_ratio");
  goodput.training_end_s = top.Has("training_end_s") ? top.Seconds("training_end_s", goodput.wall_s) : goodput.wall_s;
  goodput.badput = BadputFromJson(Fields(top.Required("badput_s"), "badput_s", origin), goodput.wall_s);
  CheckItAddsUp(goodput, top);
  const json& cycles = top.Array("cycles");
  for (size_t i = 0; i < cycles.size(); ++i) {
    goodput.cycles.push_back(CycleFromJson(Fields(cycles[i], Index("cycles", i), origin), goodput.wall_s));
  }
  const json& lanes = top.OptionalArray("lanes");
  for (size_t i = 0; i < lanes.size(); ++i) {
    goodput.lanes.push_back(LaneFromJson(Fields(lanes[i], Index("lanes", i), origin), goodput.wall_s, origin));
  }
  const json& commits = top.OptionalArray("commits");
  for (size_t i = 0; i < commits.size(); ++i) {
    goodput.commits.push_back(CommitFromJson(Fields(commits[i], Index("commits", i), origin), goodput.wall_s));
  }
  const json& notes = top.OptionalArray("notes");
  for (size_t i = 0; i < notes.size(); ++i) {
    if (!notes[i].is_string()) top.Fail(Index("notes", i), "expected a string, found " + Kind(notes[i]));
    goodput.notes.push_back(notes[i].get<std::string>());
  }
  if (top.Has("steps")) goodput.steps = StepsFromJson(Fields(top.Required("steps"), "steps", origin), origin);
  return goodput;
}

Goodput ParseGoodputJson(std::string_view text, const std::string& origin) {
  json document = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) {
    PathAtError locator;
    json::sax_parse(text.begin(), text.end(), &locator);
    const bool truncated = locator.position() >= text.size();
    const std::string problem = truncated ? "the file ends in the middle of the JSON (truncated?)"
                                          : "not JSON at byte " + std::to_string(locator.position()) + ": " + locator.message();
    throw GoodputJsonError(origin, locator.path(), problem);
  }
  return GoodputFromJson(document, origin);
}

int WriteGoodputJson(const Goodput& goodput, const std::string& json_path, std::string& error) {
  try {
    storage::WriteFileAtomically(json_path, GoodputToJson(goodput).dump(1, ' ', false, json::error_handler_t::replace) + "\n");
  } catch (const std::exception& failure) {
    error = failure.what();
    return kExitIo;
  }
  return 0;
}

}  // namespace bt::launcher::report
