// A destination call at the end of a job that must not hold the launcher's exit: a follower
// reading a commit record after its drain, node 0 uploading the job's report. An rclone call
// to an object store that a partition cut off can take minutes (its own retries), a hung
// NFS mount forever.
#pragma once

#include <chrono>
#include <functional>

namespace bt::storage {

// Runs `call` on a thread of its own and waits at most `bound` for it: true when it finished
// (what it threw is its own to catch). A call still running then is left to finish, or to end
// with the process: it must own everything it touches (copies, shared pointers).
bool FinishesWithin(std::chrono::milliseconds bound, std::function<void()> call);

}  // namespace bt::storage
