#include "env/job_config.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string_view>

#include <nlohmann/json.hpp>

#include "env/identity.h"

namespace bt::env {
namespace {

using json = nlohmann::json;

std::string Child(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}

std::string Element(const std::string& path, size_t index) {
  return path + "[" + std::to_string(index) + "]";
}

std::string TypeName(const json& value) {
  if (value.is_number_integer()) return "an integer";
  if (value.is_number()) return "a number";
  return std::string("a ") + value.type_name();
}

[[noreturn]] void Fail(const std::string& path, const std::string& expectation, const json& got) {
  throw ConfigError(path, expectation + ", got " + TypeName(got));
}

// One JSON object whose keys must all be known: pydantic's extra="forbid".
class StrictObject {
 public:
  StrictObject(const json& value, std::string path, std::set<std::string_view> known)
      : value_(value), path_(std::move(path)) {
    if (!value_.is_object()) Fail(path_.empty() ? "(top level)" : path_, "expected an object", value_);
    for (const auto& [key, unused] : value_.items()) {
      if (!known.contains(key)) throw ConfigError(Child(path_, key), "unknown key (allowed: " + List(known) + ")");
    }
  }

  // Absent and null are the same, as for pydantic's Optional fields.
  const json* Find(std::string_view key) const {
    auto it = value_.find(key);
    if (it == value_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  const json& Require(std::string_view key) const {
    const json* found = Find(key);
    if (found == nullptr) throw ConfigError(Child(path_, key), "required field is missing");
    return *found;
  }
  std::string PathOf(std::string_view key) const { return Child(path_, key); }

 private:
  static std::string List(const std::set<std::string_view>& keys) {
    std::string out;
    for (auto key : keys) out += (out.empty() ? "" : ", ") + std::string(key);
    return out;
  }
  const json& value_;
  std::string path_;
};

std::string ReadString(const json& value, const std::string& path) {
  if (!value.is_string()) Fail(path, "expected a string", value);
  return value.get<std::string>();
}

std::string ReadNonEmptyString(const json& value, const std::string& path) {
  std::string text = ReadString(value, path);
  if (text.empty()) throw ConfigError(path, "expected a non-empty string");
  return text;
}

std::string ReadAbsolutePath(const json& value, const std::string& path) {
  std::string text = ReadString(value, path);
  if (text.empty() || text.front() != '/') throw ConfigError(path, "expected an absolute path, got \"" + text + "\"");
  return text;
}

bool ReadBool(const json& value, const std::string& path) {
  if (!value.is_boolean()) Fail(path, "expected true or false", value);
  return value.get<bool>();
}

int64_t ReadInt(const json& value, const std::string& path, int64_t min, int64_t max) {
  std::string expectation = "expected an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  if (!value.is_number_integer()) Fail(path, expectation, value);
  int64_t number = value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(INT64_MAX)
                       ? INT64_MAX
                       : value.get<int64_t>();
  if (number < min || number > max) throw ConfigError(path, expectation + ", got " + std::to_string(number));
  return number;
}

double ReadSeconds(const json& value, const std::string& path, double min_exclusive) {
  std::string expectation = "expected a number of seconds > " + std::to_string(int(min_exclusive));
  if (!value.is_number()) Fail(path, expectation, value);
  double seconds = value.get<double>();
  if (!(seconds > min_exclusive) || seconds > 1e7) throw ConfigError(path, expectation + ", got " + value.dump());
  return seconds;
}

// A grace period may be 0 (SIGKILL at once), unlike the other durations.
double ReadGrace(const json& value, const std::string& path) {
  if (!value.is_number() || value.get<double>() < 0 || value.get<double>() > 86400) {
    throw ConfigError(path, "expected a number of seconds in [0, 86400], got " + value.dump());
  }
  return value.get<double>();
}

double ReadMilliseconds(const json& value, const std::string& path) {
  double seconds = ReadSeconds(value, path, 0);
  if (seconds < 0.001) throw ConfigError(path, "expected at least 0.001 s (1 ms), got " + value.dump());
  return seconds;
}

std::vector<std::string> ReadStringList(const json& value, const std::string& path, bool non_empty_items) {
  if (!value.is_array()) Fail(path, "expected a list of strings", value);
  std::vector<std::string> items;
  for (size_t i = 0; i < value.size(); ++i) {
    items.push_back(non_empty_items ? ReadNonEmptyString(value[i], Element(path, i))
                                    : ReadString(value[i], Element(path, i)));
  }
  return items;
}

std::string ReadEnum(const json& value, const std::string& path, const std::set<std::string_view>& allowed) {
  std::string text = ReadString(value, path);
  if (allowed.contains(text)) return text;
  std::string list;
  for (auto item : allowed) list += (list.empty() ? "" : ", ") + std::string(item);
  throw ConfigError(path, "expected one of " + list + ", got \"" + text + "\"");
}

// A secret name becomes a file name in the secrets directory, so it must not walk out of it.
std::string ReadSecretName(const json& value, const std::string& path) {
  std::string name = ReadNonEmptyString(value, path);
  if (name.find('/') != std::string::npos || name == "." || name == ".." || name.find('\0') != std::string::npos) {
    throw ConfigError(path, "expected a secret name without '/', got \"" + name + "\"");
  }
  return name;
}

std::string ReadSecretReference(const json& value, const std::string& path) {
  StrictObject object(value, path, {"name"});
  return ReadSecretName(object.Require("name"), object.PathOf("name"));
}

bool IsEnvName(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

const std::set<std::string_view> kAccelerators = {"T4",   "L4",   "A10G", "V100",      "A100",
                                                  "A100_40GB", "H100", "H200", "H100_40GB", "B200",
                                                  "L40S", "RTX_PRO_6000", "B300", "GB300", "_B10"};

Accelerator ReadAccelerator(const json& value, const std::string& path) {
  Accelerator accelerator;
  if (value.is_string()) {  // "H100:8" or "H100"
    std::string text = value.get<std::string>();
    auto colon = text.find(':');
    accelerator.type = text.substr(0, colon);
    accelerator.count = 1;
    if (colon != std::string::npos) {
      const std::string digits = text.substr(colon + 1);
      if (digits.empty() || digits.size() > 4 || digits.find_first_not_of("0123456789") != std::string::npos) {
        throw ConfigError(path, "expected \"TYPE:COUNT\" such as \"H100:8\", got \"" + text + "\"");
      }
      accelerator.count = std::stoi(digits);
    }
    if (!kAccelerators.contains(accelerator.type)) {
      throw ConfigError(path, "unknown accelerator \"" + accelerator.type + "\" (expected H100, H200, A100, B200, ...)");
    }
    return accelerator;
  }
  StrictObject object(value, path, {"accelerator", "count"});
  if (const json* type = object.Find("accelerator")) {
    accelerator.type = ReadEnum(*type, object.PathOf("accelerator"), kAccelerators);
  }
  accelerator.count = 1;
  if (const json* count = object.Find("count")) accelerator.count = int(ReadInt(*count, object.PathOf("count"), 0, 1024));
  return accelerator;
}

Compute ReadCompute(const json& value, const std::string& path) {
  StrictObject object(value, path, {"node_count", "cpu_count", "memory", "accelerator", "availability_model"});
  Compute compute;
  if (const json* v = object.Find("node_count")) {
    compute.node_count = int(ReadInt(*v, object.PathOf("node_count"), 1, kMaxNodeCount));
    compute.node_count_given = true;
  }
  if (const json* v = object.Find("cpu_count")) compute.cpu_count = int(ReadInt(*v, object.PathOf("cpu_count"), 1, 1 << 16));
  if (const json* v = object.Find("memory")) compute.memory = ReadNonEmptyString(*v, object.PathOf("memory"));
  if (const json* v = object.Find("accelerator")) compute.accelerator = ReadAccelerator(*v, object.PathOf("accelerator"));
  if (const json* v = object.Find("availability_model")) {
    compute.availability_model = ReadEnum(*v, object.PathOf("availability_model"), {"dedicated", "spot"});
  }
  return compute;
}

std::map<std::string, EnvValue> ReadEnvironmentVariables(const json& value, const std::string& path) {
  if (!value.is_object()) Fail(path, "expected an object of NAME: value", value);
  std::map<std::string, EnvValue> variables;
  for (const auto& [name, item] : value.items()) {
    const std::string item_path = Child(path, name);
    if (!IsEnvName(name)) throw ConfigError(item_path, "expected a variable name of letters, digits and '_'");
    if (item.is_string()) {
      variables[name] = EnvValue{item.get<std::string>(), std::nullopt};
    } else if (item.is_object()) {
      variables[name] = EnvValue{"", ReadSecretReference(item, item_path)};
    } else {
      Fail(item_path, "expected a string or {\"name\": SECRET}", item);
    }
  }
  return variables;
}

CacheConfig ReadCacheConfig(const json& value, const std::string& path) {
  StrictObject object(value, path, {"enabled", "enable_legacy_hf_mount", "require_cache_affinity", "mount_base_path"});
  CacheConfig cache;
  if (const json* v = object.Find("enabled")) cache.enabled = ReadBool(*v, object.PathOf("enabled"));
  if (const json* v = object.Find("enable_legacy_hf_mount")) {
    cache.enable_legacy_hf_mount = ReadBool(*v, object.PathOf("enable_legacy_hf_mount"));
  }
  if (const json* v = object.Find("require_cache_affinity")) {
    cache.require_cache_affinity = ReadBool(*v, object.PathOf("require_cache_affinity"));
  }
  if (const json* v = object.Find("mount_base_path")) cache.mount_base_path = ReadAbsolutePath(*v, object.PathOf("mount_base_path"));
  return cache;
}

CheckpointingConfig ReadCheckpointingConfig(const json& value, const std::string& path) {
  StrictObject object(value, path, {"enabled", "checkpoint_path", "volume_size_gib"});
  CheckpointingConfig checkpointing;
  if (const json* v = object.Find("enabled")) checkpointing.enabled = ReadBool(*v, object.PathOf("enabled"));
  if (const json* v = object.Find("checkpoint_path")) {
    checkpointing.checkpoint_path = ReadAbsolutePath(*v, object.PathOf("checkpoint_path"));
  }
  if (const json* v = object.Find("volume_size_gib")) {
    checkpointing.volume_size_gib = int(ReadInt(*v, object.PathOf("volume_size_gib"), 1, 1 << 20));
  }
  return checkpointing;
}

CheckpointReference ReadCheckpointReference(const json& value, const std::string& path) {
  if (!value.is_object()) Fail(path, "expected a checkpoint reference object", value);
  const json* typ = value.contains("typ") ? &value["typ"] : nullptr;
  if (typ == nullptr) throw ConfigError(Child(path, "typ"), "required field is missing");
  // loops_checkpoint is a platform-side source (bt://loops:...): nothing a launcher can fetch.
  std::string kind = ReadEnum(*typ, Child(path, "typ"), {"baseten_latest_checkpoint", "baseten_named_checkpoint"});
  CheckpointReference reference;
  reference.config_path = path;
  if (kind == "baseten_latest_checkpoint") {
    StrictObject object(value, path, {"typ", "job_id", "project_name"});
    if (const json* project = object.Find("project_name")) ReadNonEmptyString(*project, object.PathOf("project_name"));
    const json* job = object.Find("job_id");
    if (job == nullptr) {
      throw ConfigError(object.PathOf("job_id"), "required: bt-launch finds a job's checkpoints by its id "
                                                 "(a project's latest job is only known to the platform)");
    }
    reference.job_id = ReadNonEmptyString(*job, object.PathOf("job_id"));
    ValidateJobId(reference.job_id, object.PathOf("job_id"));
    return reference;
  }
  StrictObject object(value, path, {"typ", "checkpoint_name", "job_id"});
  reference.kind = CheckpointReference::Kind::kNamed;
  reference.checkpoint_name = ReadNonEmptyString(object.Require("checkpoint_name"), object.PathOf("checkpoint_name"));
  reference.job_id = ReadNonEmptyString(object.Require("job_id"), object.PathOf("job_id"));
  ValidateJobId(reference.job_id, object.PathOf("job_id"));
  return reference;
}

LoadCheckpointConfig ReadLoadCheckpointConfig(const json& value, const std::string& path) {
  StrictObject object(value, path, {"enabled", "checkpoints", "download_folder"});
  LoadCheckpointConfig load;
  if (const json* v = object.Find("enabled")) load.enabled = ReadBool(*v, object.PathOf("enabled"));
  if (const json* v = object.Find("download_folder")) load.download_folder = ReadAbsolutePath(*v, object.PathOf("download_folder"));
  if (const json* v = object.Find("checkpoints")) {
    if (!v->is_array()) Fail(object.PathOf("checkpoints"), "expected a list of checkpoint references", *v);
    for (size_t i = 0; i < v->size(); ++i) {
      load.checkpoints.push_back(ReadCheckpointReference((*v)[i], Element(object.PathOf("checkpoints"), i)));
    }
  }
  return load;
}

Runtime ReadRuntime(const json& value, const std::string& path) {
  StrictObject object(value, path,
                      {"start_commands", "environment_variables", "enable_cache", "checkpointing_config",
                       "load_checkpoint_config", "cache_config"});
  Runtime runtime;
  if (const json* v = object.Find("start_commands")) {
    runtime.start_commands = ReadStringList(*v, object.PathOf("start_commands"), true);
  }
  if (const json* v = object.Find("environment_variables")) {
    runtime.environment_variables = ReadEnvironmentVariables(*v, object.PathOf("environment_variables"));
  }
  const json* legacy_cache = object.Find("enable_cache");
  const json* cache = object.Find("cache_config");
  if (legacy_cache != nullptr && cache != nullptr) {
    throw ConfigError(object.PathOf("enable_cache"), "cannot be set together with cache_config (enable_cache is deprecated)");
  }
  if (legacy_cache != nullptr) {  // the SDK rewrites the deprecated flag the same way
    bool enabled = ReadBool(*legacy_cache, object.PathOf("enable_cache"));
    runtime.cache_config.enabled = enabled;
    runtime.cache_config.enable_legacy_hf_mount = enabled;
  }
  if (cache != nullptr) runtime.cache_config = ReadCacheConfig(*cache, object.PathOf("cache_config"));
  if (const json* v = object.Find("checkpointing_config")) {
    runtime.checkpointing_config = ReadCheckpointingConfig(*v, object.PathOf("checkpointing_config"));
  }
  if (const json* v = object.Find("load_checkpoint_config")) {
    runtime.load_checkpoint_config = ReadLoadCheckpointConfig(*v, object.PathOf("load_checkpoint_config"));
  }
  return runtime;
}

void ValidateWeightsUri(const std::string& source, const std::string& path) {
  static const std::set<std::string_view> kSchemes = {"hf", "s3", "gs", "azure", "r2", "cw", "https", "file"};
  auto separator = source.find("://");
  std::string scheme = separator == std::string::npos ? "" : source.substr(0, separator);
  if (!kSchemes.contains(scheme)) {
    throw ConfigError(path, "expected a URI with scheme hf://, s3://, gs://, azure://, r2://, cw://, https:// or file://, got \"" + source + "\"");
  }
  std::string rest = source.substr(separator + 3);
  if (scheme != "hf" && source.find('@') != std::string::npos && scheme != "https") {
    throw ConfigError(path, "a @revision is allowed only for hf:// sources, got \"" + source + "\"");
  }
  bool is_cloud = scheme == "s3" || scheme == "gs" || scheme == "azure" || scheme == "r2" || scheme == "cw";
  if (is_cloud && (rest.empty() || rest.front() == '/')) {
    throw ConfigError(path, "expected " + scheme + "://bucket/path, got \"" + source + "\"");
  }
  if (scheme == "file" && (rest.empty() || rest.front() != '/')) {
    throw ConfigError(path, "expected file:///absolute/path, got \"" + source + "\"");
  }
  if (rest.empty()) throw ConfigError(path, "expected something after " + scheme + "://");
}

WeightsSource ReadWeightsSource(const json& value, const std::string& path) {
  StrictObject object(value, path,
                      {"source", "mount_location", "auth", "auth_secret_name", "allow_patterns", "ignore_patterns"});
  WeightsSource weights;
  weights.source = ReadString(object.Require("source"), object.PathOf("source"));
  ValidateWeightsUri(weights.source, object.PathOf("source"));
  weights.mount_location = ReadAbsolutePath(object.Require("mount_location"), object.PathOf("mount_location"));
  if (const json* v = object.Find("auth_secret_name")) {
    weights.auth_secret_name = ReadSecretName(*v, object.PathOf("auth_secret_name"));
  }
  if (const json* v = object.Find("auth")) {
    StrictObject auth(*v, object.PathOf("auth"), {"auth_method", "auth_secret_name"});
    // Training jobs accept only CUSTOM_SECRET; OIDC is rejected by the platform.
    ReadEnum(auth.Require("auth_method"), auth.PathOf("auth_method"), {"CUSTOM_SECRET"});
    if (const json* name = auth.Find("auth_secret_name")) {
      if (weights.auth_secret_name) {
        throw ConfigError(auth.PathOf("auth_secret_name"), "must not be set both here and in auth_secret_name");
      }
      weights.auth_secret_name = ReadSecretName(*name, auth.PathOf("auth_secret_name"));
    }
  }
  if (const json* v = object.Find("allow_patterns")) weights.allow_patterns = ReadStringList(*v, object.PathOf("allow_patterns"), true);
  if (const json* v = object.Find("ignore_patterns")) weights.ignore_patterns = ReadStringList(*v, object.PathOf("ignore_patterns"), true);
  return weights;
}

std::vector<WeightsSource> ReadWeights(const json& value, const std::string& path) {
  if (!value.is_array()) Fail(path, "expected a list of weight sources", value);
  std::vector<WeightsSource> weights;
  std::map<std::string, size_t> mounts;
  for (size_t i = 0; i < value.size(); ++i) {
    weights.push_back(ReadWeightsSource(value[i], Element(path, i)));
    std::string mount = weights.back().mount_location;
    while (mount.size() > 1 && mount.back() == '/') mount.pop_back();
    auto [it, inserted] = mounts.emplace(mount, i);
    if (!inserted) {
      throw ConfigError(Element(path, i) + ".mount_location",
                        "duplicate mount location \"" + mount + "\" (also " + Element(path, it->second) + ")");
    }
  }
  return weights;
}

void ReadImage(const json& value, const std::string& path, JobConfig& config) {
  StrictObject object(value, path, {"base_image", "docker_auth"});
  config.base_image = ReadNonEmptyString(object.Require("base_image"), object.PathOf("base_image"));
  const json* auth = object.Find("docker_auth");
  if (auth == nullptr) return;
  StrictObject docker(*auth, object.PathOf("docker_auth"),
                      {"auth_method", "registry", "aws_iam_docker_auth", "gcp_service_account_json_docker_auth",
                       "registry_secret_docker_auth"});
  ReadNonEmptyString(docker.Require("auth_method"), docker.PathOf("auth_method"));
  ReadNonEmptyString(docker.Require("registry"), docker.PathOf("registry"));
  auto read_refs = [&](std::string_view key, std::set<std::string_view> refs) {
    const json* v = docker.Find(key);
    if (v == nullptr) return;
    StrictObject holder(*v, docker.PathOf(key), refs);
    for (auto ref : refs) ReadSecretReference(holder.Require(ref), holder.PathOf(ref));
  };
  read_refs("aws_iam_docker_auth", {"access_key_secret_ref", "secret_access_key_secret_ref"});
  read_refs("gcp_service_account_json_docker_auth", {"service_account_json_secret_ref"});
  read_refs("registry_secret_docker_auth", {"secret_ref"});
}

void ReadInteractiveSession(const json& value, const std::string& path) {
  StrictObject object(value, path, {"trigger", "timeout_minutes", "session_provider", "auth_provider"});
  if (const json* v = object.Find("trigger")) ReadEnum(*v, object.PathOf("trigger"), {"on_startup", "on_failure", "on_demand"});
  if (const json* v = object.Find("timeout_minutes")) {
    if (ReadInt(*v, object.PathOf("timeout_minutes"), -1, 1 << 30) == 0) {
      throw ConfigError(object.PathOf("timeout_minutes"), "expected -1 or a positive number of minutes, got 0");
    }
  }
  if (const json* v = object.Find("session_provider")) ReadEnum(*v, object.PathOf("session_provider"), {"vs_code", "cursor", "ssh"});
  if (const json* v = object.Find("auth_provider")) ReadEnum(*v, object.PathOf("auth_provider"), {"microsoft", "github"});
}

void ReadWorkspace(const json& value, const std::string& path) {
  StrictObject object(value, path, {"workspace_root", "external_dirs", "exclude_dirs"});
  if (const json* v = object.Find("workspace_root")) ReadString(*v, object.PathOf("workspace_root"));
  if (const json* v = object.Find("external_dirs")) ReadStringList(*v, object.PathOf("external_dirs"), true);
  if (const json* v = object.Find("exclude_dirs")) ReadStringList(*v, object.PathOf("exclude_dirs"), true);
}

uint16_t ReadPort(const json& value, const std::string& path) { return uint16_t(ReadInt(value, path, 1, 65535)); }

RendezvousSettings ReadRendezvousSettings(const json& value, const std::string& path) {
  StrictObject object(value, path,
                      {"port", "join_timeout_s", "heartbeat_interval_s", "heartbeat_timeout_s",
                       "exit_barrier_timeout_s", "backend"});
  RendezvousSettings settings;
  if (const json* v = object.Find("port")) settings.port = ReadPort(*v, object.PathOf("port"));
  if (const json* v = object.Find("join_timeout_s")) settings.join_timeout_s = int(ReadInt(*v, object.PathOf("join_timeout_s"), 1, 7 * 86400));
  // Heartbeats are kept in whole milliseconds: anything shorter would become 0 ms.
  if (const json* v = object.Find("heartbeat_interval_s")) {
    settings.heartbeat_interval_s = ReadMilliseconds(*v, object.PathOf("heartbeat_interval_s"));
  }
  if (const json* v = object.Find("heartbeat_timeout_s")) {
    settings.heartbeat_timeout_s = ReadMilliseconds(*v, object.PathOf("heartbeat_timeout_s"));
  }
  if (settings.heartbeat_timeout_s < 2 * settings.heartbeat_interval_s) {
    throw ConfigError(object.PathOf("heartbeat_timeout_s"), "expected at least twice heartbeat_interval_s (" +
                                                                std::to_string(settings.heartbeat_interval_s) + " s)");
  }
  if (const json* v = object.Find("exit_barrier_timeout_s")) {
    settings.exit_barrier_timeout_s = int(ReadInt(*v, object.PathOf("exit_barrier_timeout_s"), 1, 86400));
  }
  if (const json* v = object.Find("backend")) {
    settings.backend = ReadEnum(*v, object.PathOf("backend"), {"tcp", "mpi"}) == "mpi" ? RendezvousBackend::kMpi
                                                                                        : RendezvousBackend::kTcp;
  }
  return settings;
}

CheckpointSettings ReadCheckpointSettings(const json& value, const std::string& path) {
  StrictObject object(value, path,
                      {"destination", "auth_secret_name", "drain_timeout_s", "marker", "quiet_period_s",
                       "scan_interval_s", "poll_interval_s", "watch"});
  CheckpointSettings settings;
  if (const json* v = object.Find("destination")) settings.destination = ReadNonEmptyString(*v, object.PathOf("destination"));
  if (const json* v = object.Find("auth_secret_name")) {
    settings.auth_secret_name = ReadSecretName(*v, object.PathOf("auth_secret_name"));
  }
  if (const json* v = object.Find("drain_timeout_s")) settings.drain_timeout_s = ReadSeconds(*v, object.PathOf("drain_timeout_s"), 0);
  if (const json* v = object.Find("marker")) {
    settings.marker = ReadNonEmptyString(*v, object.PathOf("marker"));
    if (settings.marker.find('/') != std::string::npos) {
      throw ConfigError(object.PathOf("marker"), "expected a file name without '/', got \"" + settings.marker + "\"");
    }
  }
  if (const json* v = object.Find("quiet_period_s")) settings.quiet_period_s = ReadSeconds(*v, object.PathOf("quiet_period_s"), 0);
  if (const json* v = object.Find("scan_interval_s")) settings.scan_interval_s = ReadSeconds(*v, object.PathOf("scan_interval_s"), 0);
  if (const json* v = object.Find("poll_interval_s")) settings.poll_interval_s = ReadSeconds(*v, object.PathOf("poll_interval_s"), 0);
  if (const json* v = object.Find("watch")) {
    std::string mode = ReadEnum(*v, object.PathOf("watch"), {"auto", "inotify", "poll"});
    settings.watch = mode == "poll" ? WatchMode::kPoll : mode == "inotify" ? WatchMode::kInotify : WatchMode::kAuto;
  }
  return settings;
}

WeightsSettings ReadWeightsSettings(const json& value, const std::string& path) {
  StrictObject object(value, path, {"timeout_s", "mode"});
  WeightsSettings settings;
  if (const json* v = object.Find("timeout_s")) settings.timeout_s = ReadSeconds(*v, object.PathOf("timeout_s"), 0);
  if (const json* v = object.Find("mode")) {
    std::string mode = ReadEnum(*v, object.PathOf("mode"), {"auto", "stage", "wait"});
    settings.mode = mode == "stage" ? WeightsMode::kStage : mode == "wait" ? WeightsMode::kWait : WeightsMode::kAuto;
  }
  return settings;
}

CacheSeedSettings ReadCacheSeedSettings(const json& value, const std::string& path) {
  StrictObject object(value, path, {"seed_commands", "seed_key", "lease_s"});
  CacheSeedSettings settings;
  if (const json* v = object.Find("seed_commands")) settings.seed_commands = ReadStringList(*v, object.PathOf("seed_commands"), true);
  if (const json* v = object.Find("seed_key")) settings.seed_key = ReadString(*v, object.PathOf("seed_key"));
  if (const json* v = object.Find("lease_s")) settings.lease_s = ReadSeconds(*v, object.PathOf("lease_s"), 0);
  return settings;
}

FabricSettings ReadFabricSettings(const json& value, const std::string& path) {
  StrictObject object(value, path,
                      {"require", "probe", "probe_timeout_s", "nccl_preflight", "min_busbw_gbps", "preflight_bytes",
                       "preflight_timeout_s"});
  FabricSettings settings;
  if (const json* v = object.Find("require")) {
    const std::string require = ReadEnum(*v, object.PathOf("require"), {"auto", "ib", "any", "none"});
    settings.require = require == "ib"    ? FabricRequirement::kIb
                       : require == "any" ? FabricRequirement::kAny
                       : require == "none" ? FabricRequirement::kNone
                                           : FabricRequirement::kAuto;
  }
  if (const json* v = object.Find("probe")) {
    const std::string probe = ReadEnum(*v, object.PathOf("probe"), {"off", "ring", "all-pairs"});
    settings.probe = probe == "ring" ? FabricProbe::kRing : probe == "all-pairs" ? FabricProbe::kAllPairs : FabricProbe::kOff;
  }
  if (const json* v = object.Find("probe_timeout_s")) settings.probe_timeout_s = ReadSeconds(*v, object.PathOf("probe_timeout_s"), 0);
  if (const json* v = object.Find("nccl_preflight")) settings.nccl_preflight = ReadBool(*v, object.PathOf("nccl_preflight"));
  if (const json* v = object.Find("min_busbw_gbps")) {
    if (!v->is_number() || v->get<double>() < 0 || v->get<double>() > 1e5) {
      throw ConfigError(object.PathOf("min_busbw_gbps"), "expected a bus bandwidth in GB/s in [0, 100000], got " + v->dump());
    }
    settings.min_busbw_gbps = v->get<double>();
  }
  if (const json* v = object.Find("preflight_bytes")) {
    settings.preflight_bytes = ReadInt(*v, object.PathOf("preflight_bytes"), 4, int64_t(1) << 36);
  }
  if (const json* v = object.Find("preflight_timeout_s")) {
    settings.preflight_timeout_s = ReadSeconds(*v, object.PathOf("preflight_timeout_s"), 0);
  }
  return settings;
}

RestartSettings ReadRestartSettings(const json& value, const std::string& path) {
  StrictObject object(value, path, {"max_restarts", "rejoin_timeout_s", "max_cycles_without_progress", "max_failures_per_node"});
  RestartSettings settings;
  if (const json* v = object.Find("max_restarts")) settings.max_restarts = int(ReadInt(*v, object.PathOf("max_restarts"), 0, 10000));
  if (const json* v = object.Find("rejoin_timeout_s")) settings.rejoin_timeout_s = ReadSeconds(*v, object.PathOf("rejoin_timeout_s"), 0);
  if (const json* v = object.Find("max_cycles_without_progress")) {
    settings.max_cycles_without_progress = int(ReadInt(*v, object.PathOf("max_cycles_without_progress"), 1, 10000));
  }
  if (const json* v = object.Find("max_failures_per_node")) {
    settings.max_failures_per_node = int(ReadInt(*v, object.PathOf("max_failures_per_node"), 1, 10000));
  }
  return settings;
}

// A duration that may be 0 (the check is off).
double ReadSecondsOrOff(const json& value, const std::string& path) {
  if (!value.is_number() || value.get<double>() < 0 || value.get<double>() > 1e7) {
    throw ConfigError(path, "expected a number of seconds in [0, 1e7] (0: off), got " + value.dump());
  }
  return value.get<double>();
}

WatchdogSettings ReadWatchdogSettings(const json& value, const std::string& path) {
  StrictObject object(value, path, {"stall_timeout_s", "auto_min_s", "startup_timeout_s", "stack_timeout_s", "report_dir"});
  WatchdogSettings settings;
  if (const json* v = object.Find("stall_timeout_s")) {
    if (!(v->is_string() && v->get<std::string>() == "auto")) {
      if (!v->is_number()) Fail(object.PathOf("stall_timeout_s"), "expected \"auto\" or a number of seconds (0: off)", *v);
      settings.stall_timeout_s = ReadSecondsOrOff(*v, object.PathOf("stall_timeout_s"));
    }
  }
  if (const json* v = object.Find("auto_min_s")) settings.auto_min_s = ReadSeconds(*v, object.PathOf("auto_min_s"), 0);
  if (const json* v = object.Find("startup_timeout_s")) {
    settings.startup_timeout_s = ReadSecondsOrOff(*v, object.PathOf("startup_timeout_s"));
  }
  if (const json* v = object.Find("stack_timeout_s")) settings.stack_timeout_s = ReadSeconds(*v, object.PathOf("stack_timeout_s"), 0);
  if (const json* v = object.Find("report_dir")) settings.report_dir = ReadNonEmptyString(*v, object.PathOf("report_dir"));
  return settings;
}

HealthSettings ReadHealthSettings(const json& value, const std::string& path) {
  StrictObject object(value, path, {"enabled", "interval_s", "expect_gpus", "on_unhealthy"});
  HealthSettings settings;
  if (const json* v = object.Find("enabled")) {
    if (v->is_boolean()) {
      settings.mode = v->get<bool>() ? HealthMode::kOn : HealthMode::kOff;
    } else if (!(v->is_string() && v->get<std::string>() == "auto")) {
      Fail(object.PathOf("enabled"), "expected \"auto\", true or false", *v);
    }
  }
  if (const json* v = object.Find("interval_s")) {
    if (!v->is_number() || v->get<double>() < 0.1 || v->get<double>() > 86400) {
      throw ConfigError(object.PathOf("interval_s"), "expected a number of seconds in [0.1, 86400], got " + v->dump());
    }
    settings.interval_s = v->get<double>();
  }
  if (const json* v = object.Find("expect_gpus")) {
    if (!(v->is_string() && v->get<std::string>() == "auto")) {
      if (!v->is_number_integer()) Fail(object.PathOf("expect_gpus"), "expected \"auto\" or a number of GPUs", *v);
      settings.expect_gpus = int(ReadInt(*v, object.PathOf("expect_gpus"), 0, 1024));
    }
  }
  if (const json* v = object.Find("on_unhealthy")) {
    const std::string action = ReadEnum(*v, object.PathOf("on_unhealthy"), {"leave", "warn"});
    settings.on_unhealthy = action == "warn" ? OnUnhealthy::kWarn : OnUnhealthy::kLeave;
  }
  return settings;
}

ProgressSettings ReadProgressSettings(const json& value, const std::string& path) {
  StrictObject object(value, path, {"step_pattern", "straggler_ratio"});
  ProgressSettings settings;
  if (const json* v = object.Find("step_pattern")) {
    settings.step_pattern = ReadNonEmptyString(*v, object.PathOf("step_pattern"));
    try {
      const std::regex pattern(settings.step_pattern);
      if (pattern.mark_count() != 1) {
        throw ConfigError(object.PathOf("step_pattern"), "expected exactly one group (the step number), got " +
                                                             std::to_string(pattern.mark_count()) + " in " + v->dump());
      }
    } catch (const std::regex_error& error) {
      throw ConfigError(object.PathOf("step_pattern"), std::string("not a regular expression (") + error.what() + "): " + v->dump());
    }
  }
  if (const json* v = object.Find("straggler_ratio")) {
    if (!v->is_number() || !(v->get<double>() > 1) || v->get<double>() > 100) {
      throw ConfigError(object.PathOf("straggler_ratio"), "expected a number above 1 (1.2: 20% slower), got " + v->dump());
    }
    settings.straggler_ratio = v->get<double>();
  }
  return settings;
}

MetricsSettings ReadMetricsSettings(const json& value, const std::string& path) {
  StrictObject object(value, path, {"port"});
  MetricsSettings settings;
  if (const json* v = object.Find("port")) settings.port = ReadPort(*v, object.PathOf("port"));
  return settings;
}

LauncherSettings ReadLauncherSettings(const json& value, const std::string& path) {
  StrictObject object(value, path, {"job_id", "project_id", "project_name", "grace_period_s", "peer_failure_grace_s",
                                             "master_port", "rendezvous", "checkpoint", "weights", "cache", "fabric", "restart", "watchdog",
                                             "health", "spares", "progress", "metrics"});
  LauncherSettings launcher;
  if (const json* v = object.Find("job_id")) {
    launcher.job_id = ReadNonEmptyString(*v, object.PathOf("job_id"));
    ValidateJobId(*launcher.job_id, object.PathOf("job_id"));
  }
  if (const json* v = object.Find("project_id")) launcher.project_id = ReadNonEmptyString(*v, object.PathOf("project_id"));
  if (const json* v = object.Find("project_name")) launcher.project_name = ReadNonEmptyString(*v, object.PathOf("project_name"));
  if (const json* v = object.Find("grace_period_s")) launcher.grace_period_s = ReadGrace(*v, object.PathOf("grace_period_s"));
  if (const json* v = object.Find("peer_failure_grace_s")) {
    launcher.peer_failure_grace_s = ReadGrace(*v, object.PathOf("peer_failure_grace_s"));
  }
  if (const json* v = object.Find("master_port")) launcher.master_port = ReadPort(*v, object.PathOf("master_port"));
  if (const json* v = object.Find("rendezvous")) launcher.rendezvous = ReadRendezvousSettings(*v, object.PathOf("rendezvous"));
  if (const json* v = object.Find("checkpoint")) launcher.checkpoint = ReadCheckpointSettings(*v, object.PathOf("checkpoint"));
  if (const json* v = object.Find("weights")) launcher.weights = ReadWeightsSettings(*v, object.PathOf("weights"));
  if (const json* v = object.Find("cache")) launcher.cache = ReadCacheSeedSettings(*v, object.PathOf("cache"));
  if (const json* v = object.Find("fabric")) launcher.fabric = ReadFabricSettings(*v, object.PathOf("fabric"));
  if (const json* v = object.Find("restart")) launcher.restart = ReadRestartSettings(*v, object.PathOf("restart"));
  if (const json* v = object.Find("watchdog")) launcher.watchdog = ReadWatchdogSettings(*v, object.PathOf("watchdog"));
  if (const json* v = object.Find("health")) launcher.health = ReadHealthSettings(*v, object.PathOf("health"));
  if (const json* v = object.Find("progress")) launcher.progress = ReadProgressSettings(*v, object.PathOf("progress"));
  if (const json* v = object.Find("metrics")) launcher.metrics = ReadMetricsSettings(*v, object.PathOf("metrics"));
  if (const json* v = object.Find("spares")) launcher.spares = int(ReadInt(*v, object.PathOf("spares"), 0, 1024));
  return launcher;
}

// nlohmann keeps the last of two equal keys without a word; a strict config must not.
// The callback sees the parse as events: a stack of the keys seen per open object.
json::parser_callback_t DuplicateKeyCheck() {
  struct Frame {
    bool is_object;
    std::string name;  // this container's place in its parent: "runtime", "weights[]"
    std::set<std::string> keys;
    std::string last_key;
  };
  auto stack = std::make_shared<std::vector<Frame>>();
  auto path_of = [stack](const std::string& key) {
    std::string path;
    for (const Frame& frame : *stack) path += frame.name;
    return path.empty() ? key : path + "." + key;
  };
  return [stack, path_of](int, json::parse_event_t event, json& parsed) {
    auto child_name = [&]() -> std::string {
      if (stack->empty()) return "";
      const Frame& parent = stack->back();
      if (!parent.is_object) return "[]";
      return (stack->size() > 1 ? "." : "") + parent.last_key;
    };
    switch (event) {
      case json::parse_event_t::object_start: stack->push_back({true, child_name(), {}, ""}); break;
      case json::parse_event_t::array_start: stack->push_back({false, child_name(), {}, ""}); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end: stack->pop_back(); break;
      case json::parse_event_t::key: {
        Frame& frame = stack->back();
        const std::string key = parsed.get<std::string>();
        if (!frame.keys.insert(key).second) throw ConfigError(path_of(key), "duplicate key (the JSON has it twice)");
        frame.last_key = key;
        break;
      }
      case json::parse_event_t::value: break;
    }
    return true;
  };
}

std::string Fnv1aHex(const std::string& text) {
  uint64_t hash = 1469598103934665603ULL;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ULL;
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(hash));
  return out;
}

// The records that name the job (manifest, journal, commit record, spool, the seed lease)
// are JSON, whose strings are UTF-8: writing any other throws.
bool IsUtf8(const std::string& text) {
  try {
    static_cast<void>(json(text).dump());
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

}  // namespace

ConfigError::ConfigError(std::string path, const std::string& expectation)
    : std::runtime_error(path + ": " + expectation), path_(std::move(path)) {}

void ValidateJobId(const std::string& job_id, const std::string& origin) {
  const bool one_component = !job_id.empty() && job_id.find('/') == std::string::npos &&
                             job_id.find('\0') == std::string::npos && job_id.front() != '.';
  if (one_component && IsUtf8(job_id)) return;
  const std::string shown = json(job_id).dump(-1, ' ', false, json::error_handler_t::replace);
  throw ConfigError(origin, "job id " + shown + " is not usable as a path component (it may not be empty, "
                            "contain '/' or NUL, start with '.' or be other than UTF-8 text)");
}

// Node 0 serves the metrics, the rendezvous and its training's MASTER_PORT on one host: the
// metrics' server holding MASTER_PORT failed the training's own bind with nothing naming the
// field (reviews 11 and 12). With restarts, a MASTER_PORT the launcher chose walks
// kMasterPortCycles ports, one per cycle.
void ValidateMetricsPort(const JobConfig& config) {
  const int port = config.launcher.metrics.port;
  if (port == 0) return;
  const int master = config.launcher.master_port;
  const bool walks =
      config.launcher.restart.max_restarts > 0 && !config.runtime.environment_variables.contains("MASTER_PORT");
  const int last = master + (walks ? kMasterPortCycles - 1 : 0);
  if (port >= master && port <= last) {
    throw ConfigError("launcher.metrics.port",
                      std::to_string(port) + " is also a MASTER_PORT of the training (launcher.master_port " +
                          std::to_string(master) + (walks ? " to " + std::to_string(last) + ", one per restart cycle" : "") +
                          "): give the metrics a port of their own");
  }
  if (port == config.launcher.rendezvous.port) {
    throw ConfigError("launcher.metrics.port",
                      std::to_string(port) + " is also launcher.rendezvous.port: give the metrics a port of their own");
  }
}

JobConfig ParseJobConfig(const std::string& json_text, bool require_start_command) {
  json document;
  try {
    document = json::parse(json_text, DuplicateKeyCheck());
  } catch (const json::parse_error& error) {
    throw ConfigError("(document)", std::string("expected valid JSON: ") + error.what());
  }
  StrictObject object(document, "",
                      {"image", "compute", "runtime", "interactive_session", "name", "priority", "workspace",
                       "weights", "enable_baseten_workdir", "launcher"});
  JobConfig config;
  config.source_digest = Fnv1aHex(json_text);
  if (const json* v = object.Find("image")) ReadImage(*v, "image", config);
  if (const json* v = object.Find("compute")) config.compute = ReadCompute(*v, "compute");
  if (const json* v = object.Find("runtime")) config.runtime = ReadRuntime(*v, "runtime");
  if (const json* v = object.Find("interactive_session")) ReadInteractiveSession(*v, "interactive_session");
  if (const json* v = object.Find("name")) config.name = ReadNonEmptyString(*v, "name");
  if (const json* v = object.Find("priority")) ReadInt(*v, "priority", INT32_MIN, INT32_MAX);
  if (const json* v = object.Find("workspace")) ReadWorkspace(*v, "workspace");
  if (const json* v = object.Find("weights")) config.weights = ReadWeights(*v, "weights");
  if (const json* v = object.Find("enable_baseten_workdir")) config.enable_baseten_workdir = ReadBool(*v, "enable_baseten_workdir");
  if (const json* v = object.Find("launcher")) config.launcher = ReadLauncherSettings(*v, "launcher");
  if (require_start_command && config.runtime.start_commands.empty()) {
    throw ConfigError("runtime.start_commands", "expected at least one command (or give one after `--`)");
  }
  ValidateMetricsPort(config);
  // A spare takes a rank in a restart: without restarts it would only wait.
  if (config.launcher.spares > 0 && config.launcher.restart.max_restarts == 0) {
    throw ConfigError("launcher.spares", std::to_string(config.launcher.spares) +
                                             " spare(s) need launcher.restart.max_restarts above 0 (a spare takes a "
                                             "rank in a restart)");
  }
  if (config.launcher.spares > 0 && config.launcher.rendezvous.backend == RendezvousBackend::kMpi) {
    throw ConfigError("launcher.spares", "the mpi rendezvous backend (launcher.rendezvous.backend) has no leader that "
                                         "restarts: spares need the tcp backend");
  }
  return config;
}

JobConfig DefaultJobConfig() {
  JobConfig config = ParseJobConfig("{}", false);
  config.is_embedded_default = true;
  return config;
}

JobConfig LoadJobConfig(const std::optional<std::string>& config_flag, const char* bt_job_config_env,
                        bool require_start_command) {
  std::string origin;
  std::string text;
  std::string env_value = bt_job_config_env != nullptr ? bt_job_config_env : "";
  auto inline_start = env_value.find_first_not_of(" \t\r\n");
  if (config_flag) {
    origin = *config_flag;
  } else if (inline_start != std::string::npos && env_value[inline_start] == '{') {
    text = env_value;
    origin = "BT_JOB_CONFIG";
  } else if (!env_value.empty()) {
    origin = env_value;
  } else {
    JobConfig config = DefaultJobConfig();
    if (require_start_command) {
      throw ConfigError("runtime.start_commands", "no config given (--config or BT_JOB_CONFIG) and no command after `--`");
    }
    return config;
  }
  if (text.empty()) {
    std::ifstream file(origin, std::ios::binary);
    if (!file) throw ConfigError(origin, std::string("cannot read config file: ") + std::strerror(errno));
    std::ostringstream buffer;
    buffer << file.rdbuf();
    text = buffer.str();
  }
  try {
    return ParseJobConfig(text, require_start_command);
  } catch (const ConfigError& error) {
    throw ConfigError(error.path(), std::string(error.what()).substr(error.path().size() + 2) + " (in " + origin + ")");
  }
}

}  // namespace bt::env
