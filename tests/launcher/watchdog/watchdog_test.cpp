// The hang watchdog of one node, through the real binary: what counts as progress (output,
// the heartbeat file), the limits (a fixed stall timeout, auto, the startup timeout), the
// report a hang leaves, and the job's own Python startup hooks still running. The
// multi-node hang (torchrun, gloo, a restart) is tests/integration/hang_test.sh.
#include <atomic>
#include <filesystem>
#include <thread>
#include <regex>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/launcher_process.h"

namespace bt::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr const char* kPython = "/usr/bin/python3";

class WatchdogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(kPython, X_OK) != 0) GTEST_SKIP() << "SKIPPED: " << kPython << " is not installed";
  }

  // Runs `script` (Python) as the job's one start command under `watchdog` settings; the
  // launcher's stdout and stderr are pipes, or `output_file` (appended to).
  ProcessResult RunPython(const std::string& script, const nlohmann::json& watchdog,
                          std::map<std::string, std::string> variables = {},
                          std::optional<std::string> output_file = std::nullopt, bool on_a_terminal = false,
                          const std::string& name = "job") {
    const std::string program = dir_.Write(name + ".py", script);
    nlohmann::json config = {
        {"compute", {{"node_count", 1}}},
        {"enable_baseten_workdir", false},
        {"runtime", {{"start_commands", {std::string(kPython) + " " + program}}, {"environment_variables", variables}}},
        {"launcher", {{"watchdog", watchdog}, {"grace_period_s", 2}, {"peer_failure_grace_s", 2}}}};
    const std::string path = dir_.Write(name + ".json", config.dump());
    std::vector<std::string> args = {"run", "--config", path, "--root", dir_.path() + (name == "job" ? "" : "/" + name)};
    if (!on_a_terminal) return RunLauncher({args, {}, {}, std::nullopt, 60s, output_file});
    // `docker run -t`: the launcher's stdout and stderr are a terminal (Python's pty.spawn
    // copies what it shows to the test's pipe, with the terminal's \r\n).
    args.insert(args.begin(), {"-c", "import os, pty, sys; sys.exit(os.waitstatus_to_exitcode(pty.spawn(sys.argv[1:])))",
                               BT_LAUNCH_BINARY});
    return RunLauncher({args, {}, {}, std::nullopt, 60s}, kPython);
  }

  // The hang reports node 0 wrote (under the default report_dir, in the scratch directory).
  std::vector<fs::path> Reports() const {
    std::vector<fs::path> reports;
    for (const auto& entry : fs::recursive_directory_iterator(dir_.path())) {
      if (entry.path().filename().string().rfind("hang-", 0) == 0) reports.push_back(entry.path());
    }
    return reports;
  }

  TempDir dir_;
};

TEST_F(WatchdogTest, ASilentJobIsHungAtTheStallTimeoutAndLeavesItsStackInTheReport) {
  ProcessResult result = RunPython(R"PY(
import time
print("step 1", flush=True)
def wait_for_the_other_ranks():
    time.sleep(1000)
wait_for_the_other_ranks()
)PY",
                                   {{"stall_timeout_s", 2}, {"startup_timeout_s", 2}});
  EXPECT_EQ(result.exit_code, 124) << result.err;
  EXPECT_LT(result.elapsed, 15s);
  EXPECT_NE(result.out.find("step 1"), std::string::npos);
  EXPECT_NE(result.err.find("this node's job made no progress for"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("in wait_for_the_other_ranks (job.py:5) < <module> (job.py:6)"), std::string::npos) << result.err;
  const std::vector<fs::path> reports = Reports();
  ASSERT_EQ(reports.size(), 1u) << result.err;
  EXPECT_NE(result.err.find("report: " + reports.front().string()), std::string::npos) << result.err;
  const std::string report = ReadFile(reports.front());
  EXPECT_NE(report.find("line 5 in wait_for_the_other_ranks"), std::string::npos) << report;
  EXPECT_NE(report.find("NCCL flight recorder"), std::string::npos) << report;
  // Native frames where gdb is installed (scripts/install-deps.sh installs it), else SKIPPED.
  if (access("/usr/bin/gdb", X_OK) == 0) {
    EXPECT_NE(report.find("native frames: gdb (/usr/bin/gdb) for 2 of 2 processes"), std::string::npos) << report;
    EXPECT_NE(report.find("clock_nanosleep"), std::string::npos) << report;
  } else {
    EXPECT_NE(report.find("native frames: SKIPPED (gdb is not installed"), std::string::npos) << report;
  }
}

TEST_F(WatchdogTest, NothingBeforeTheFirstProgressIsHungAtTheStartupTimeout) {
  ProcessResult result = RunPython("import time\ntime.sleep(1000)\n", {{"stall_timeout_s", 1000}, {"startup_timeout_s", 2}});
  EXPECT_EQ(result.exit_code, 124) << result.err;
  EXPECT_NE(result.err.find("launcher.watchdog.startup_timeout_s, before the job's first progress"), std::string::npos)
      << result.err;
}

// A single node's job that exits 0 while the watchdog takes its stacks (a slow final save,
// not a hang; here the stack signal is blocked, so the collection waits stack_timeout_s)
// ends with its own code, not 124.
TEST_F(WatchdogTest, AJobThatExitsZeroWhileItsStacksAreTakenIsNotHung) {
  ProcessResult result = RunPython(R"PY(
import os, signal, time
signal.pthread_sigmask(signal.SIG_BLOCK, {int(os.environ["BT_STACK_SIGNAL"])})
print("step 1", flush=True)
time.sleep(5)
print("saved", flush=True)
)PY",
                                   {{"stall_timeout_s", 2}, {"startup_timeout_s", 2}, {"stack_timeout_s", 10}});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("saved\n"), std::string::npos) << result.out;
  EXPECT_NE(result.err.find("this node's job made no progress for"), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("the job hung"), std::string::npos) << result.err;
  EXPECT_TRUE(Reports().empty()) << result.err;
}

// A banner (or torchrun's OMP warning) and then a long load: output alone does not end the
// startup window, so the load gets startup_timeout_s, not the stall limit.
TEST_F(WatchdogTest, ABannerBeforeALongLoadDoesNotEndTheStartupWindow) {
  ProcessResult result = RunPython(R"PY(
import time
print("banner: starting", flush=True)
time.sleep(4.5)  # loading the model, silently
for step in range(6):
    print("step", step, flush=True)
    time.sleep(0.5)
)PY",
                                   {{"stall_timeout_s", 2}, {"startup_timeout_s", 7}});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.err.find("made no progress"), std::string::npos) << result.err;
}

// The heartbeat's first touch says the job is in its loop: the startup window ends there,
// and a hang after it is found at the stall limit, not at startup_timeout_s.
TEST_F(WatchdogTest, TheFirstHeartbeatEndsTheStartupWindow) {
  ProcessResult result = RunPython(R"PY(
import os, time
os.utime(os.environ["BT_HEARTBEAT_FILE"])
time.sleep(1000)
)PY",
                                   {{"stall_timeout_s", 2}, {"startup_timeout_s", 60}});
  EXPECT_EQ(result.exit_code, 124) << result.err;
  EXPECT_LT(result.elapsed, 15s);
  EXPECT_NE(result.err.find("limit 2.00 s: launcher.watchdog.stall_timeout_s"), std::string::npos) << result.err;
}

// The issue's case scaled down: a training that prints every 40 s is never hung with auto
// (its floor is 15 minutes); here the floor is 2 s, the prints 1.5 s apart, then one gap
// of 4 s, longer than the floor but within 5x the longest gap seen before it.
TEST_F(WatchdogTest, AutoLearnsTheJobsOwnGapsAndNeverCallsASlowPrinterHung) {
  ProcessResult result = RunPython(R"PY(
import time
for step in range(4):
    print("step", step, flush=True)
    time.sleep(1.5)
time.sleep(2.5)
print("done", flush=True)
)PY",
                                   {{"stall_timeout_s", "auto"}, {"auto_min_s", 2}, {"startup_timeout_s", 5}});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.err.find("made no progress"), std::string::npos) << result.err;
}

TEST_F(WatchdogTest, AHeartbeatFileTouchedEveryStepKeepsASilentJobAlive) {
  ProcessResult result = RunPython(R"PY(
import os, time
for step in range(12):
    os.utime(os.environ["BT_HEARTBEAT_FILE"])  # the launcher created it
    time.sleep(0.5)
)PY",
                                   {{"stall_timeout_s", 2}, {"startup_timeout_s", 2}});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.err.find("made no progress"), std::string::npos) << result.err;
}

// `bt-launch run > train.log 2>&1`: the job writes to the file itself (no pipe, no copy by
// the launcher), and what it appends is progress.
TEST_F(WatchdogTest, AJobWhoseOutputIsAFileWritesToItItselfAndItsLinesAreProgress) {
  const std::string log = dir_.path() + "/train.log";
  ProcessResult result = RunPython(R"PY(
import os, time
print("stdout is", os.readlink("/proc/self/fd/1"), flush=True)
for step in range(8):
    print("step", step, flush=True)
    time.sleep(0.7)
)PY",
                                   {{"stall_timeout_s", 2}, {"startup_timeout_s", 2}}, {}, log);
  const std::string output = ReadFile(log);
  EXPECT_EQ(result.exit_code, 0) << output;
  EXPECT_NE(output.find("stdout is " + log + "\n"), std::string::npos) << output;
  EXPECT_NE(output.find("step 7\n"), std::string::npos) << output;
  EXPECT_EQ(output.find("made no progress"), std::string::npos) << output;
}

// `tty: true`, `docker run -t`: the launcher's output is a terminal. The job still writes to a
// terminal, and what it prints there is progress.
TEST_F(WatchdogTest, AJobWhoseOutputIsATerminalIsWatchedAndStillSeesATerminal) {
  ProcessResult result = RunPython(R"PY(
import sys, time
print("stdout is a terminal:", sys.stdout.isatty(), flush=True)
for step in range(14):
    print("step", step, flush=True)
    time.sleep(0.4)
)PY",
                                   {{"stall_timeout_s", 2}, {"startup_timeout_s", 2}}, {}, std::nullopt, true);
  EXPECT_EQ(result.exit_code, 0) << result.out;
  EXPECT_NE(result.out.find("stdout is a terminal: True\r\n"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("step 13\r\n"), std::string::npos) << result.out;
  EXPECT_EQ(result.out.find("made no progress"), std::string::npos) << result.out;
}

// With the launcher's stdout a file, a job that logs to `/dev/stdout` by path (a logging
// FileHandler) writes through a description of its own: its writes are progress too.
TEST_F(WatchdogTest, AJobLoggingToDevStdoutByPathIsNotHung) {
  const std::string log = dir_.path() + "/train.log";
  ProcessResult result = RunPython(R"PY(
import logging, time
logger = logging.getLogger("train")
logger.addHandler(logging.FileHandler("/dev/stdout"))
logger.setLevel(logging.INFO)
for step in range(10):
    logger.info("step %d", step)
    time.sleep(0.6)
)PY",
                                   {{"stall_timeout_s", 2}, {"startup_timeout_s", 3}}, {}, log);
  const std::string output = ReadFile(log);
  EXPECT_EQ(result.exit_code, 0) << output;
  EXPECT_NE(output.find("step 9\n"), std::string::npos) << output;
  EXPECT_EQ(output.find("made no progress"), std::string::npos) << output;
}

// Other launchers and their jobs write to the same file (jobs of a local test sharing one
// log): their lines, the launchers' log in either format and a job printing every 0.3 s,
// are not this job's progress, and its silence is still a hang.
TEST_F(WatchdogTest, OthersWritingToTheJobsOutputFileAreNotItsProgress) {
  const std::string log = dir_.path() + "/shared.log";
  std::atomic<bool> done{false};
  std::thread neighbour([&] {
    for (int round = 0; !done; ++round) {
      RunLauncher({{"run", "--root", dir_.path() + "/neighbour", "--log-level", "debug", "--log-format",
                    round % 2 == 0 ? "text" : "json", "--", "sh", "-c", "for i in 1 2 3; do echo neighbour $i; sleep 0.3; done"},
                   {}, {}, std::nullopt, 20s, log});
    }
  });
  ProcessResult result = RunPython("import time\nprint('loading', flush=True)\ntime.sleep(1000)\n",
                                   {{"stall_timeout_s", 2}, {"startup_timeout_s", 2}}, {}, log);
  done = true;
  neighbour.join();
  const std::string output = ReadFile(log);
  EXPECT_EQ(result.exit_code, 124) << output;
  EXPECT_LT(result.elapsed, 20s);
  EXPECT_NE(output.find("this node's job made no progress for"), std::string::npos) << output;
  EXPECT_NE(output.find("neighbour 3\n"), std::string::npos) << "the neighbour's job printed nothing";
  EXPECT_NE(output.find("\"node\":0,\"ts\""), std::string::npos) << "the neighbour logged no JSON line";
}

// Two jobs (and two launchers of one config) sharing report_dir: the busy one's heartbeat
// does not keep the silent one alive, and the silent one's report holds only its own process
// (the other's is neither signalled nor counted).
TEST_F(WatchdogTest, JobsSharingTheReportFolderNeverSeeEachOthersHeartbeatOrProcesses) {
  const std::string shared = dir_.path() + "/shared-reports";
  std::thread busy([&] {
    RunPython(R"PY(
import os, time
def keep_busy():
    for step in range(40):
        os.utime(os.environ["BT_HEARTBEAT_FILE"])
        time.sleep(0.25)
keep_busy()
)PY",
              {{"stall_timeout_s", 2}, {"startup_timeout_s", 2}, {"report_dir", shared}}, {}, std::nullopt, false, "busy");
  });
  std::this_thread::sleep_for(1s);
  // stack_timeout_s 2: gdb attaching beside the busy job must not eat the bound below.
  ProcessResult result = RunPython("import time\ndef silent():\n    time.sleep(1000)\nsilent()\n",
                                   {{"stall_timeout_s", 2}, {"startup_timeout_s", 2}, {"stack_timeout_s", 2},
                                    {"report_dir", shared}});
  busy.join();
  EXPECT_EQ(result.exit_code, 124) << result.err;
  EXPECT_LT(result.elapsed, 9s) << "the other job's heartbeat kept it alive";
  EXPECT_NE(result.err.find("its one rank in silent (job.py:3)"), std::string::npos) << result.err;
  const std::vector<fs::path> reports = Reports();
  ASSERT_EQ(reports.size(), 1u) << result.err;
  const std::string report = ReadFile(reports.front());
  EXPECT_EQ(report.find("keep_busy"), std::string::npos) << report;
  EXPECT_EQ(report.find("busy.py"), std::string::npos) << report;
}

// A BT_HEARTBEAT_FILE the job's config sets is the one watched.
TEST_F(WatchdogTest, AHeartbeatFileTheUserChoseIsTheOneWatched) {
  const std::string heartbeat = dir_.path() + "/my-heartbeat";
  ProcessResult result = RunPython(R"PY(
import os, pathlib, time
for step in range(12):
    pathlib.Path(os.environ["BT_HEARTBEAT_FILE"]).touch()
    time.sleep(0.5)
)PY",
                                   {{"stall_timeout_s", 2}, {"startup_timeout_s", 2}}, {{"BT_HEARTBEAT_FILE", heartbeat}});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(fs::exists(heartbeat));
}

// A process that armed the hook and then exec'd another program no longer catches the
// stack signal, whose default action would kill it: it is listed, not signalled.
TEST_F(WatchdogTest, AProcessThatExecdAnotherProgramIsNotSignalled) {
  ProcessResult result = RunPython("import os\nos.execvp('sleep', ['sleep', '1000'])\n",
                                   {{"stall_timeout_s", 2}, {"startup_timeout_s", 2}});
  EXPECT_EQ(result.exit_code, 124) << result.err;
  const std::vector<fs::path> reports = Reports();
  ASSERT_EQ(reports.size(), 1u) << result.err;
  const std::string report = ReadFile(reports.front());
  EXPECT_TRUE(std::regex_search(report, std::regex("pid [0-9]+ state S waiting in [^:]+: sleep 1000"))) << report;
}

// Workers a rank starts with multiprocessing's spawn inherit its RANK: they are no ranks.
TEST_F(WatchdogTest, WorkersARankSpawnsAreNotCountedAsRanks) {
  ProcessResult result = RunPython(R"PY(
import multiprocessing as mp, time

def wait_for_work(queue):
    queue.get()

def stuck():
    time.sleep(1000)

if __name__ == "__main__":
    context = mp.get_context("spawn")
    queue = context.Queue()
    workers = [context.Process(target=wait_for_work, args=(queue,)) for _ in range(2)]
    for worker in workers:
        worker.start()
    stuck()
)PY",
                                   {{"stall_timeout_s", 3}, {"startup_timeout_s", 3}}, {{"RANK", "0"}, {"LOCAL_RANK", "0"}});
  EXPECT_EQ(result.exit_code, 124) << result.err;
  EXPECT_NE(result.err.find("its one rank in stuck (job.py:"), std::string::npos) << result.err;
  EXPECT_TRUE(std::regex_search(result.err, std::regex("watchdog: [3-9] other Python processes"))) << result.err;
}

// torch.multiprocessing.spawn's pattern, without RANK: the parent only waits for the ranks
// it spawned, and multiprocessing's resource tracker serves them: neither is a rank.
TEST_F(WatchdogTest, AMultiprocessingParentAndItsResourceTrackerAreNotRanks) {
  ProcessResult result = RunPython(R"PY(
import multiprocessing as mp, time

def train(rank, lock):
    with lock:
        pass
    time.sleep(1000)

if __name__ == "__main__":
    context = mp.get_context("spawn")
    lock = context.Lock()  # a semaphore: the resource tracker starts
    workers = [context.Process(target=train, args=(rank, lock)) for rank in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
)PY",
                                   {{"stall_timeout_s", 3}, {"startup_timeout_s", 3}});
  EXPECT_EQ(result.exit_code, 124) << result.err;
  EXPECT_NE(result.err.find("no odd one: all 4 in train (job.py:7)"), std::string::npos) << result.err;
  EXPECT_TRUE(std::regex_search(result.err, std::regex("watchdog: 2 other Python processes"))) << result.err;
}

// A rank stopped (or stuck in the kernel) gives no stack: it is still a rank, and the odd
// one while the others wait in their collective.
TEST_F(WatchdogTest, ARankThatGivesNoStackIsTheOddOne) {
  ProcessResult result = RunPython(R"PY(
import os, signal, subprocess, sys, time
def all_reduce():
    time.sleep(1000)
rank = os.environ.get("RANK")
if rank is None:
    ranks = [subprocess.Popen([sys.executable, __file__], env=dict(os.environ, RANK=str(r))) for r in range(3)]
    for process in ranks:
        process.wait()
else:
    print("rank", rank, "step 1", flush=True)
    if rank == "2":
        os.kill(os.getpid(), signal.SIGSTOP)
    all_reduce()
)PY",
                                   {{"stall_timeout_s", 2}, {"startup_timeout_s", 3}, {"stack_timeout_s", 3}});
  EXPECT_EQ(result.exit_code, 124) << result.err;
  EXPECT_TRUE(std::regex_search(result.err, std::regex("the odd one: rank 2 \\(node 0, [^)]*\\) gave no stack \\(state T \\(stopped\\)")))
      << result.err;
  EXPECT_NE(result.err.find("while 2 ranks are in all_reduce (job.py:4)"), std::string::npos) << result.err;
}

// Two equal groups (1+1): no majority, so the headline says where each group is, and the
// rank outside the collective is the odd one.
TEST_F(WatchdogTest, TwoEqualGroupsAreEachNamedWithWhereTheyAre) {
  dir_.Write("distributed_c10d.py", "import time\ndef all_reduce():\n    time.sleep(1000)\n");
  ProcessResult result = RunPython(R"PY(
import os, subprocess, sys, time
from distributed_c10d import all_reduce
def load_batch():
    time.sleep(1000)
rank = os.environ.get("RANK")
if rank is None:
    ranks = [subprocess.Popen([sys.executable, __file__], env=dict(os.environ, RANK=str(r))) for r in range(2)]
    for process in ranks:
        process.wait()
else:
    print("rank", rank, "step 1", flush=True)
    load_batch() if rank == "1" else all_reduce()
)PY",
                                   {{"stall_timeout_s", 2}, {"startup_timeout_s", 3}});
  EXPECT_EQ(result.exit_code, 124) << result.err;
  EXPECT_TRUE(std::regex_search(result.err, std::regex("the odd one: rank 1 \\(node 0, [^)]*\\) in load_batch \\(job.py:5\\)[^;]*, "
                                                       "the only group not in a collective; no majority: "
                                                       "1 in all_reduce \\(distributed_c10d.py:3\\) < <module> \\(job.py:[0-9]+\\): rank 0 \\(node 0")))
      << result.err;
}

// 1+1 on two nodes, the rank outside the collective (node 1's) the last to print: the blame
// goes to its node, not to the node whose progress stopped first.
TEST_F(WatchdogTest, TwoEqualGroupsOnTwoNodesBlameTheRankOutsideTheCollective) {
  dir_.Write("distributed_c10d.py", "import time\ndef all_reduce():\n    time.sleep(1000)\n");
  const std::string program = dir_.Write("equal.py", R"PY(
import os, sys, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distributed_c10d import all_reduce
def load_batch():
    time.sleep(1000)
if os.environ["RANK"] == "1":
    time.sleep(1.5)
    print("rank 1 step 1", flush=True)
    load_batch()
print("rank 0 step 1", flush=True)
all_reduce()
)PY");
  nlohmann::json config = {
      {"compute", {{"node_count", 2}}},
      {"enable_baseten_workdir", false},
      {"runtime", {{"start_commands", {"RANK=$BT_NODE_RANK exec " + std::string(kPython) + " " + program}}}},
      {"launcher", {{"watchdog", {{"stall_timeout_s", 3}, {"startup_timeout_s", 4}, {"stack_timeout_s", 3}}},
                    {"grace_period_s", 2}, {"peer_failure_grace_s", 2}}}};
  const std::string path = dir_.Write("equal.json", config.dump());
  const std::string port = std::to_string(FreePort());
  std::vector<std::unique_ptr<LauncherProcess>> nodes;
  for (int rank = 0; rank < 2; ++rank) {
    nodes.push_back(std::make_unique<LauncherProcess>(LaunchSpec{
        {"run", "--config", path, "--root", dir_.path() + "/equal", "--node-rank", std::to_string(rank), "--node-count", "2",
         "--leader-addr", "127.0.0.1"},
        {{"BT_RENDEZVOUS_PORT", port}, {"BT_RENDEZVOUS_TOKEN", "equal-groups"}},
        {},
        std::nullopt,
        60s}));
  }
  std::vector<ProcessResult> results;
  for (auto& node : nodes) results.push_back(node->Finish());
  for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(results[size_t(rank)].exit_code, 124) << results[size_t(rank)].err;
  const std::string& leader = results[0].err;
  EXPECT_TRUE(std::regex_search(leader, std::regex("the odd one: rank 1 \\(node 1, [^)]*\\) in load_batch"))) << leader;
  EXPECT_TRUE(std::regex_search(leader, std::regex("node 1 \\([^)]*\\) hung"))) << leader;
}

// One node's job ends while the other's hangs (a rank stuck in a final save while the
// others wait at the exit barrier): the hang is still found, and every node exits 124.
// Node 0 stuck while node 1 waits, and node 1 stuck while node 0 (which gathers) waits.
TEST_F(WatchdogTest, AHangOnOneNodeIsFoundWhileTheOtherNodesJobHasEnded) {
  const std::string program = dir_.Write("stuck.py", "import time\nprint('saving', flush=True)\ntime.sleep(1000)\n");
  for (int stuck = 0; stuck < 2; ++stuck) {
    SCOPED_TRACE("node " + std::to_string(stuck) + " is stuck");
    nlohmann::json config = {
        {"compute", {{"node_count", 2}}},
        {"enable_baseten_workdir", false},
        {"runtime",
         {{"start_commands", {"[ \"$BT_NODE_RANK\" = " + std::to_string(stuck) + " ] && exec " + std::string(kPython) + " " +
                              program + " || echo done"}}}},
        {"launcher", {{"watchdog", {{"stall_timeout_s", 2}, {"startup_timeout_s", 2}, {"stack_timeout_s", 3}}},
                      {"grace_period_s", 2}, {"peer_failure_grace_s", 2}}}};
    const std::string path = dir_.Write("two.json", config.dump());
    const std::string port = std::to_string(FreePort());
    std::vector<std::unique_ptr<LauncherProcess>> nodes;
    for (int rank = 0; rank < 2; ++rank) {
      nodes.push_back(std::make_unique<LauncherProcess>(LaunchSpec{
          {"run", "--config", path, "--root", dir_.path() + "/nodes-" + std::to_string(stuck), "--node-rank",
           std::to_string(rank), "--node-count", "2", "--leader-addr", "127.0.0.1"},
          {{"BT_RENDEZVOUS_PORT", port}, {"BT_RENDEZVOUS_TOKEN", "hang-two"}},
          {},
          std::nullopt,
          60s}));
    }
    std::vector<ProcessResult> results;
    for (auto& node : nodes) results.push_back(node->Finish());
    for (int rank = 0; rank < 2; ++rank) EXPECT_EQ(results[size_t(rank)].exit_code, 124) << results[size_t(rank)].err;
    const std::string& leader = results[0].err;
    EXPECT_NE(leader.find("1 stalled, the last: node " + std::to_string(stuck)), std::string::npos) << leader;
    EXPECT_TRUE(std::regex_search(leader, std::regex("node " + std::to_string(1 - stuck) +
                                                     " \\([^)]*\\): its job had ended; it waits for the others")))
        << leader;
    EXPECT_NE(leader.find("its one rank in <module> (stuck.py:3)"), std::string::npos) << leader;
  }
}

TEST_F(WatchdogTest, TheUsersSitecustomizeStillRunsAndTheHookArms) {
  const std::string user_dir = dir_.path() + "/user-site";
  WriteFile(user_dir + "/sitecustomize.py", "import os\nopen(os.environ['MARKER'], 'w').write('ran')\n");
  const std::string marker = dir_.path() + "/marker";
  ProcessResult result = RunPython("import os\nprint(os.environ['BT_STACK_DIR'])\n", {{"stall_timeout_s", 60}},
                                   {{"PYTHONPATH", user_dir}, {"MARKER", marker}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(ReadFile(marker), "ran");
  const std::string stacks = result.out.substr(0, result.out.find('\n'));
  bool armed = false;
  for (const auto& entry : fs::directory_iterator(stacks)) armed = armed || entry.path().extension() == ".armed";
  EXPECT_TRUE(armed) << "no .armed marker in " << stacks;
}

// A job that drops to an unprivileged user (su, gosu): its Python processes still arm, and
// the hook never writes into their output (here a program's captured output).
TEST_F(WatchdogTest, TheHookWritesNothingIntoTheOutputOfAnUnprivilegedJob) {
  if (geteuid() != 0) GTEST_SKIP() << "SKIPPED: needs root, to drop to an unprivileged user";
  fs::permissions(dir_.path(), fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                                   fs::perms::others_read | fs::perms::others_exec);
  ProcessResult result = RunPython(R"PY(
import os, subprocess, sys
os.setgid(65534)
os.setuid(65534)
child = "import os\nprint('child', os.getuid())\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\n"
out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
print("captured:", repr(out.stdout + out.stderr), flush=True)
)PY",
                                   {{"stall_timeout_s", 60}});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("captured: 'child 65534\\n'\n"), std::string::npos) << result.out;
  EXPECT_EQ(result.err.find("will not be collected"), std::string::npos) << result.err;
}

// PyTorch's NCCL flight recorder is armed for the report unless the job set it itself.
TEST_F(WatchdogTest, TheNcclFlightRecorderIsArmedUnlessTheJobSetsIt) {
  ProcessResult result = RunPython(R"PY(
import os
for name in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"):
    print(name + "=" + os.environ.get(name, "<unset>"))
)PY",
                                   {{"stall_timeout_s", 60}}, {{"TORCH_NCCL_TRACE_BUFFER_SIZE", "50"}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("TORCH_NCCL_TRACE_BUFFER_SIZE=50\n"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("TORCH_NCCL_DUMP_ON_TIMEOUT=1\n"), std::string::npos) << result.out;
  EXPECT_TRUE(std::regex_search(result.out, std::regex("TORCH_NCCL_DEBUG_INFO_TEMP_FILE=/.*/bt-launch/[^/]+/node-0/nccl-trace/rank_\n")))
      << result.out;
}

TEST_F(WatchdogTest, OffExportsNothingAndTakesNothingOver) {
  ProcessResult result = RunPython(R"PY(
import os
print("heartbeat" if "BT_HEARTBEAT_FILE" in os.environ else "no heartbeat")
print("hook" if "BT_STACK_DIR" in os.environ else "no hook")
)PY",
                                   {{"stall_timeout_s", 0}, {"startup_timeout_s", 0}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("no heartbeat\nno hook\n"), std::string::npos) << result.out;
}

}  // namespace
}  // namespace bt::testing
