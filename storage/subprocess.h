// Runs a helper program (rclone) with an environment built for it, never the launcher's:
// an inherited AWS_CA_BUNDLE, for one, breaks every S3 call of rclone 1.60.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace bt::storage {

// A NULL-terminated array of pointers into `strings`, as exec and posix_spawn take argv
// and envp; valid while `strings` lives unchanged.
std::vector<char*> CStringArray(const std::vector<std::string>& strings);

struct ProcessResult {
  int exit_code = -1;     // 127 when it could not be started, 128+signal when killed
  std::string output;     // stdout
  std::string spawn_error;
};

// Runs `argv` with exactly `environ`, calling `on_stderr_line` for each line it writes to
// stderr and `every_second`, when given, about once a second; returns when it has exited.
// When `every_second` throws, the process is killed and reaped, and the exception goes on:
// a stop does not wait for a transfer that may never end. The process is SIGKILLed when the
// thread that started it dies (PR_SET_PDEATHSIG): it never outlives its caller.
ProcessResult RunProcess(const std::vector<std::string>& argv, const std::vector<std::string>& environ,
                         const std::function<void(const std::string&)>& on_stderr_line,
                         const std::function<void()>& every_second = nullptr);

// The first executable file `program` in the launcher's PATH (/usr/bin:/bin without one), or "".
std::string FindOnPath(const std::string& program);

// The path of the running binary (/proc/self/exe): the uploader, the preflight worker and
// the benchmark's simulated nodes are bt-launch itself, and its plugins lie beside it.
std::string CurrentExecutable();

}  // namespace bt::storage
