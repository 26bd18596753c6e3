#include "launcher/supervision/proc_table.h"

#include <dirent.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace bt::launcher {

std::vector<ProcessEntry> AllProcesses() {
  std::vector<ProcessEntry> processes;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return processes;
  while (dirent* entry = readdir(proc)) {
    if (!std::isdigit(static_cast<unsigned char>(entry->d_name[0]))) continue;
    std::ifstream stat(std::string("/proc/") + entry->d_name + "/stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    auto close = line.rfind(')');
    if (close == std::string::npos) continue;
    ProcessEntry process;
    process.pid = std::atoi(entry->d_name);
    std::istringstream fields(line.substr(close + 2));
    fields >> process.state >> process.parent >> process.group;
    processes.push_back(process);
  }
  closedir(proc);
  return processes;
}

std::set<pid_t> DescendantsOf(pid_t ancestor, const std::string& except_executable) {
  std::map<pid_t, std::vector<pid_t>> children;
  for (const ProcessEntry& process : AllProcesses()) children[process.parent].push_back(process.pid);
  std::set<pid_t> found;
  std::vector<pid_t> next{ancestor};
  while (!next.empty()) {
    const pid_t parent = next.back();
    next.pop_back();
    for (const pid_t child : children[parent]) {
      if (found.contains(child)) continue;  // pids read at different moments may loop
      std::error_code error;
      if (!except_executable.empty() &&
          std::filesystem::read_symlink("/proc/" + std::to_string(child) + "/exe", error) == except_executable) {
        continue;
      }
      found.insert(child);
      next.push_back(child);
    }
  }
  return found;
}

bool HandlesSignal(pid_t pid, int signal_number) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("SigCgt:", 0) != 0) continue;
    const uint64_t caught = std::strtoull(line.c_str() + 7, nullptr, 16);
    return (caught >> (signal_number - 1)) & 1;
  }
  return false;
}

std::string CommandLine(pid_t pid) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(file)), {});
  std::replace(text.begin(), text.end(), '\0', ' ');
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text.size() > 200 ? text.substr(0, 200) + "..." : text;
}

}  // namespace bt::launcher
