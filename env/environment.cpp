#include "env/environment.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

extern char** environ;

namespace bt::env {
namespace {

constexpr size_t kMaxSecretBytes = 1 << 20;

// Launchers above us leave these behind, describing *our* process as a task of theirs.
// mpirun, PMIx: a job that calls MPI_Init itself would join our MPI world. srun: the job's
// processes are torchrun's workers, not Slurm tasks, and libraries that read the task
// variables (Lightning's SLURMEnvironment: SLURM_NTASKS, SLURM_PROCID) would take one
// node's launcher for the whole world. Slurm's job-level SLURM_JOB_* stay.
bool IsLauncherTaskVariable(const std::string& name) {
  for (const char* prefix : {"OMPI_", "PMIX_", "PMI_", "PRTE_", "SLURM_STEP_"}) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  for (const char* task : {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEPID",
                           "SLURM_TASK_PID", "SLURM_GTIDS"}) {
    if (name == task) return true;
  }
  return false;
}

std::string ShellQuote(const std::string& value) {
  std::string quoted = "'";
  for (char c : value) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// Values the launcher derives; `Offer` keeps whatever the user or platform already set.
class VariableSet {
 public:
  explicit VariableSet(std::map<std::string, std::string>& variables) : variables_(variables) {}
  void Offer(const std::string& name, const std::string& value) { variables_.try_emplace(name, value); }
  void Force(const std::string& name, const std::string& value) { variables_[name] = value; }
  const std::string& Get(const std::string& name) const { return variables_.at(name); }

 private:
  std::map<std::string, std::string>& variables_;
};

}  // namespace

PathLayout::PathLayout(std::optional<std::string> root, int node_rank) : root_(std::move(root)), node_rank_(node_rank) {
  if (root_) {
    while (root_->size() > 1 && root_->back() == '/') root_->pop_back();
    *root_ = std::filesystem::absolute(*root_).lexically_normal().string();
  }
}

std::string PathLayout::NodeLocal(const std::string& default_path) const {
  if (!root_) return default_path;
  return *root_ + "/node-" + std::to_string(node_rank_) + default_path;
}

std::string PathLayout::Shared(const std::string& default_path) const {
  if (!root_) return default_path;
  return *root_ + default_path;
}

std::string ReadSecretFile(const std::string& secrets_dir, const std::string& secret_name, const std::string& used_by) {
  const std::string path = secrets_dir + "/" + secret_name;
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    throw SecretError(used_by + ": secret \"" + secret_name + "\" not found at " +
                      path + " (" + std::strerror(errno) + "); set BT_SECRETS_DIR or add the secret");
  }
  std::string value(kMaxSecretBytes + 1, '\0');
  file.read(value.data(), std::streamsize(value.size()));
  value.resize(size_t(file.gcount()));
  if (value.size() > kMaxSecretBytes) {
    throw SecretError("secret \"" + secret_name + "\" at " + path + " is larger than 1 MiB");
  }
  if (!value.empty() && value.back() == '\n') value.pop_back();  // `echo value > file` adds one
  if (!value.empty() && value.back() == '\r') value.pop_back();
  return value;
}
std::map<std::string, std::string> ParseEnviron(

const std::vector<std::string>& entries) {
  std::map<std::string, std::string> variables;
  for (const std::string& entry : entries) {
    auto equals = entry.find('=');
    if (equals == std::string::npos || equals == 0) continue;
    variables.try_emplace(entry.substr(0, equals), entry.substr(equals + 1));
  }
  return variables;
}

std::vector<std::string> CurrentEnviron() {
  std::vector<std::string> entries;
  for (char** entry = environ; *entry != nullptr; ++entry) entries.emplace_back(*entry);
  return entries;
}

namespace {

std::optional<std::string> NonEmpty(const std::map<std::string, std::string>& variables, const std::string& name) {
  auto it = variables.find(name);
  if (it == variables.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

// The job as the orchestrator knows it, the same on every node of this job and different for
// the next: so two jobs of one config on shared nodes (two Slurm jobs, two Indexed Jobs in
// one namespace) get different ids and so different derived tokens, and never form one
// rendezvous. None under mpirun: its ranks may sit in different Slurm steps.
std::optional<std::string> OrchestratorJobId(const std::map<std::string, std::string>& inherited) {
  for (const char* mpi_rank : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"}) {
    if (NonEmpty(inherited, mpi_rank)) return std::nullopt;
  }
  if (auto slurm_job = NonEmpty(inherited, "SLURM_JOB_ID")) {
    // Two steps of one allocation are two trainings (`srun -N2 &` twice): the step id keeps them apart.
    auto step = NonEmpty(inherited, "SLURM_STEP_ID");
    return "slurm-" + *slurm_job + (step ? "." + *step : "");
  }
  // A LeaderWorkerSet group is named by its leader pod: <lws>-<group>.<lws>.<namespace>...
  if (auto leader = NonEmpty(inherited, "LWS_LEADER_ADDRESS")) return "k8s-" + leader->substr(0, leader->find('.'));
  // An Indexed Job's pods are named <job>-<index>, and the pod's name is its HOSTNAME.
  auto index = NonEmpty(inherited, "JOB_COMPLETION_INDEX");
  auto hostname = NonEmpty(inherited, "HOSTNAME");
  const std::string suffix = index ? "-" + *index : "";
  if (index && hostname && hostname->size() > suffix.size() && hostname->ends_with(suffix)) {
    return "k8s-" + hostname->substr(0, hostname->size() - suffix.size());
  }
  return std::nullopt;
}

}  // namespace

std::string ResolveJobId(const JobConfig& config, const std::map<std::string, std::string>& inherited) {
  if (auto explicit_id = NonEmpty(inherited, "BT_TRAINING_JOB_ID")) {
    ValidateJobId(*explicit_id, "BT_TRAINING_JOB_ID");
    return *explicit_id;
  }
  if (config.launcher.job_id) return *config.launcher.job_id;
  if (auto orchestrator_id = OrchestratorJobId(inherited)) return *orchestrator_id;
  return ConfigDerivedJobId(config);
}

std::string ConfigDerivedJobId(const JobConfig& config) { return "local-" + config.source_digest.substr(0, 8); }

JobEnvironment BuildJobEnvironment(const JobConfig& config, const NodeIdentity& identity, const PathLayout& paths,
                                   const std::vector<std::string>& inherited) {
  JobEnvironment environment;
  const auto inherited_variables = ParseEnviron(inherited);
  for (const auto& [name, value] : inherited_variables) {
    if (!IsLauncherTaskVariable(name) && name != kRendezvousTokenVariable) environment.variables[name] = value;
  }
  // The user's runtime.environment_variables come first: nothing below may replace them.
  auto secrets_dir_it = inherited_variables.find("BT_SECRETS_DIR");
  const std::string secrets_dir =
      secrets_dir_it != inherited_variables.end() ? secrets_dir_it->second : paths.Shared("/secrets");
  environment.secrets_dir = secrets_dir;
  for (const auto& [name, value] : config.runtime.environment_variables) {
    if (value.secret_name) {
      environment.variables[name] = ReadSecretFile(secrets_dir, *value.secret_name, "runtime.environment_variables." + name);
      environment.secret_variables.insert(name);
    } else {
      environment.variables[name] = value.literal;
    }
  }

  VariableSet vars(environment.variables);
  const std::string job_id = ResolveJobId(config, inherited_variables);
  vars.Offer("BT_TRAINING_JOB_ID", job_id);
  vars.Offer("BT_TRAINING_JOB_NAME", config.name.value_or(job_id));
  vars.Offer("BT_TRAINING_PROJECT_ID", config.launcher.project_id.value_or("local"));
  vars.Offer("BT_TRAINING_PROJECT_NAME", config.launcher.project_name.value_or("local"));
  const int gpus = config.compute.accelerator ? config.compute.accelerator->count : 0;
  vars.Offer("BT_NUM_GPUS", std::to_string(gpus));
  vars.Offer("BT_RETRY_COUNT", "0");
  vars.Offer("BT_SCRATCH_DIR", paths.NodeLocal("/mnt/bt-scratch"));
  if (config.enable_baseten_workdir) vars.Offer("BT_WORKING_DIR", paths.NodeLocal("/b10/workspace"));

  const auto& checkpointing = config.runtime.checkpointing_config;
  if (checkpointing.enabled) {
    vars.Offer("BT_CHECKPOINT_DIR", paths.NodeLocal(checkpointing.checkpoint_path.value_or("/mnt/ckpts")));
  }
  const auto& loading = config.runtime.load_checkpoint_config;
  // A job that checkpoints may resume from its own checkpoints (a restart, a retried job).
  if (loading.enabled || checkpointing.enabled) {
    vars.Offer("BT_LOAD_CHECKPOINT_DIR", paths.NodeLocal(loading.download_folder.value_or("/tmp/loaded_checkpoints")));
  }
  const auto& cache = config.runtime.cache_config;
  if (cache.enabled) {
    const std::string base = paths.Shared(cache.mount_base_path.value_or("/root/.cache"));
    vars.Offer("BT_PROJECT_CACHE_DIR", base + "/user_artifacts");
    vars.Offer("BT_TEAM_CACHE_DIR", base + "/team_artifacts");
    vars.Offer("BT_RW_CACHE_DIR", vars.Get("BT_PROJECT_CACHE_DIR"));  // legacy alias of the project cache
    if (cache.enable_legacy_hf_mount) vars.Offer("HF_HOME", base + "/huggingface");
  }

  // The resolved identity already took BT_NODE_RANK & co. into account, so it always wins.
  vars.Force("BT_NODE_RANK", std::to_string(identity.rank));
  // The training's node count: hot spares (launcher.spares) run no rank until promoted.
  vars.Force("BT_GROUP_SIZE", std::to_string(identity.training_count()));
  vars.Force("BT_LEADER_ADDR", identity.leader_addr);
  vars.Offer("MASTER_ADDR", identity.leader_addr);
  vars.Offer("MASTER_PORT", std::to_string(config.launcher.master_port));
  vars.Offer("NNODES", std::to_string(identity.training_count()));
  vars.Offer("NODE_RANK", std::to_string(identity.rank));
  vars.Offer("NPROC_PER_NODE", std::to_string(gpus > 0 ? gpus : 1));

  for (const char* name : {"BT_SCRATCH_DIR", "BT_WORKING_DIR", "BT_CHECKPOINT_DIR", "BT_LOAD_CHECKPOINT_DIR",
                           "BT_PROJECT_CACHE_DIR", "BT_TEAM_CACHE_DIR", "HF_HOME"}) {
    auto it = environment.variables.find(name);
    bool launcher_owned = std::string(name) != "HF_HOME" || cache.enable_legacy_hf_mount;
    if (it != environment.variables.end() && launcher_owned && !it->second.empty()) {
      environment.directories.push_back(it->second);
    }
  }
  if (environment.variables.contains("BT_WORKING_DIR")) environment.working_dir = environment.variables["BT_WORKING_DIR"];
  return environment;
}

void CreateDirectories(const JobEnvironment& environment) {
  for (const std::string& directory : environment.directories) {
    std::error_code error;
    std::filesystem::create_directories(directory, error);
    if (error) throw std::runtime_error("cannot create directory " + directory + ": " + error.message());
  }
}

std::vector<std::string> JobEnvironment::ToEnviron() const {
  std::vector<std::string> entries;
  entries.reserve(variables.size());
  for (const auto& [name, value] : variables) entries.push_back(name + "=" + value);
  return entries;
}

std::string JobEnvironment::RenderShell() const {
  std::ostringstream out;
  for (const auto& [name, value] : variables) {
    out << "export " << name << "=" << ShellQuote(secret_variables.contains(name) ? kMaskedSecret : value) << "\n";
  }
  return out.str();
}

std::string JobEnvironment::RenderJson() const {
  nlohmann::json object = nlohmann::json::object();
  for (const auto& [name, value] : variables) object[name] = secret_variables.contains(name) ? kMaskedSecret : value;
  // Environment values are bytes, not always UTF-8: replace what is not rather than throw.
  return object.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

}  // namespace bt::env
