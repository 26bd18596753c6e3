// The Python stack hook and its collection with real interpreters (/usr/bin/python3):
// ranks blocked in different places, one spinning in C with the GIL held, a forked child,
// a shell beside them, a user's own sitecustomize; then the grouping that names the odd one.
#include "launcher/watchdog/python_stacks.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "launcher/watchdog/stack_report.h"

namespace bt::launcher::watchdog {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/bt-stacks-XXXXXX";
    path_ = mkdtemp(pattern);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }
  std::string Write(const std::string& name, const std::string& content) const {
    const std::string file = path_ + "/" + name;
    std::ofstream(file) << content;
    return file;
  }

 private:
  std::string path_;
};

constexpr const char* kPython = "/usr/bin/python3";

// A rank of a stuck job: `collective` waits in all_reduce, `straggler` sleeps in
// load_batch, `spinner` computes in C with the GIL held, `forker` forks a child that
// waits too. Each says "ready" on stdout once it is where it will stay.
constexpr const char* kRank = R"PY(
import os, select, sys, time

def all_reduce():
    print("ready", flush=True)
    select.select([], [], [])  # blocks in C, as a collective waits in torch's C++

def worker_loop():
    select.select([], [], [])

def load_batch():
    print("ready", flush=True)
    time.sleep(3600)

def crunch():
    print("ready", flush=True)
    sum(range(10 ** 13))

role = sys.argv[1]
if role == "collective":
    all_reduce()
elif role == "straggler":
    load_batch()
elif role == "spinner":
    crunch()
elif role == "forker":
    if os.fork() == 0:
        worker_loop()
    all_reduce()
elif role == "waiter":
    # A child holds a lock its parent waits on (a data preparation step under flock).
    import fcntl, subprocess
    lock_path = sys.argv[2]
    holder = subprocess.Popen([sys.executable, "-c",
        "import fcntl, sys, time\n"
        "lock = open(sys.argv[1], 'w'); fcntl.flock(lock, fcntl.LOCK_EX)\n"
        "open(sys.argv[1] + '.held', 'w').close()\n"
        "def hold_the_lock():\n    time.sleep(3600)\n"
        "hold_the_lock()\n", lock_path])
    import os, time
    for _ in range(600):  # the child holds the lock (its start takes long on a busy machine)
        if os.path.exists(lock_path + ".held"):
            break
        time.sleep(0.05)
    def wait_for_the_lock():
        print("ready", flush=True)
        lock = open(lock_path, "w")
        fcntl.flock(lock, fcntl.LOCK_EX)  # blocks in the kernel, as long as the child lives
    wait_for_the_lock()
)PY";

class PythonStacksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(kPython, X_OK) != 0) GTEST_SKIP() << "SKIPPED: " << kPython << " is not installed";
    script_ = dir_.Write("rank.py", kRank);
    hook_env_ = InstallPythonStackHook(dir_.path() + "/hook", dir_.path() + "/dumps", user_pythonpath_);
  }

  void TearDown() override {
    for (pid_t pid : started_) {
      kill(-pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    for (int fd : outputs_) close(fd);
  }

  // Starts `argv` in a process group of its own with the hook's environment and RANK set;
  // returns once it printed "ready" (or after 20 s).
  pid_t Start(std::vector<std::string> argv, int rank) {
    int out[2];
    EXPECT_EQ(pipe(out), 0);
    pid_t pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // a crashed test leaves no rank behind
      setpgid(0, 0);
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      for (const auto& [name, value] : hook_env_) setenv(name.c_str(), value.c_str(), 1);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(rank % 2).c_str(), 1);
      setenv("BT_NODE_RANK", std::to_string(rank / 2).c_str(), 1);
      std::vector<char*> args;
      for (auto& arg : argv) args.push_back(arg.data());
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    close(out[1]);
    started_.push_back(pid);
    std::string said;
    char buffer[64];
    for (auto deadline = std::chrono::steady_clock::now() + 20s;
         said.find("ready") == std::string::npos && std::chrono::steady_clock::now() < deadline;) {
      ssize_t got = read(out[0], buffer, sizeof buffer);
      if (got <= 0) break;
      said.append(buffer, size_t(got));
    }
    outputs_.push_back(out[0]);  // open until the end: a late write must not fail the rank
    EXPECT_NE(said.find("ready"), std::string::npos) << argv.back() << " never got ready";
    return pid;
  }

  pid_t StartRank(const std::string& role, int rank) { return Start({kPython, script_, role}, rank); }

  TempDir dir_;
  std::string user_pythonpath_;
  std::string script_;
  std::map<std::string, std::string> hook_env_;
  std::vector<pid_t> started_;
  std::vector<int> outputs_;
};

TEST_F(PythonStacksTest, TheRankNotInTheCollectiveIsNamed) {
  StartRank("collective", 0);
  StartRank("collective", 1);
  pid_t straggler = StartRank("straggler", 2);
  StartRank("collective", 3);
  std::this_thread::sleep_for(300ms);  // from its "ready" into the wait
  const auto stacks = CollectPythonStacks(dir_.path() + "/dumps", 10s, 64 * 1024);
  ASSERT_EQ(stacks.size(), 4u);
  for (const auto& stack : stacks) {
    EXPECT_TRUE(stack.answered) << stack.pid;
    EXPECT_NE(stack.dump.find("rank.py"), std::string::npos) << stack.dump;
  }
  const auto groups = GroupByInnermostFrames(stacks);
  ASSERT_EQ(groups.size(), 2u) << ::testing::PrintToString(SummarizeStacks(stacks));
  EXPECT_EQ(groups[0].members.size(), 3u);
  EXPECT_NE(groups[0].frames.find("all_reduce (rank.py:"), std::string::npos) << groups[0].frames;
  ASSERT_EQ(groups[1].members.size(), 1u);
  EXPECT_EQ(groups[1].members[0]->pid, straggler);
  EXPECT_EQ(groups[1].frames.rfind("load_batch (rank.py:", 0), 0u) << groups[1].frames;
  const auto summary = SummarizeStacks(stacks);
  ASSERT_EQ(summary.size(), 2u);
  EXPECT_NE(summary[0].find("3 of 4 ranks in all_reduce"), std::string::npos) << summary[0];
  EXPECT_NE(summary[1].find("differs: 1 in load_batch"), std::string::npos) << summary[1];
  EXPECT_NE(summary[1].find("rank 2 (node 1, local rank 0, pid " + std::to_string(straggler) + ")"), std::string::npos)
      << summary[1];
}

// faulthandler's handler needs no GIL: a rank computing in C while holding it still answers.
TEST_F(PythonStacksTest, ARankSpinningInCWithTheGilHeldStillAnswers) {
  StartRank("spinner", 0);
  const auto stacks = CollectPythonStacks(dir_.path() + "/dumps", 10s, 64 * 1024);
  ASSERT_EQ(stacks.size(), 1u);
  EXPECT_TRUE(stacks[0].answered);
  EXPECT_EQ(InnermostFrames(stacks[0].dump, 1).rfind("crunch (rank.py:", 0), 0u) << stacks[0].dump;
}

// A rank blocked in flock() on a lock its child process holds, and the child: both answer,
// each with its own frames (the hook arms every interpreter the job starts).
TEST_F(PythonStacksTest, ARankWaitingOnAChildThatHoldsALockAndTheChildBothAnswer) {
  Start({kPython, script_, "waiter", dir_.path() + "/lock"}, 0);
  std::this_thread::sleep_for(300ms);
  const auto stacks = CollectPythonStacks(dir_.path() + "/dumps", 10s, 64 * 1024);
  ASSERT_EQ(stacks.size(), 2u);
  std::set<std::string> innermost;
  for (const auto& stack : stacks) {
    EXPECT_TRUE(stack.answered) << stack.pid;
    innermost.insert(InnermostFrames(stack.dump, 1).substr(0, InnermostFrames(stack.dump, 1).find(' ')));
  }
  EXPECT_EQ(innermost, (std::set<std::string>{"hold_the_lock", "wait_for_the_lock"}));
}

// Markers of processes that are gone (every DataLoader worker leaves one) are removed with
// their dumps; a live process keeps its own.
TEST_F(PythonStacksTest, MarkersOfProcessesThatAreGoneArePruned) {
  StartRank("collective", 0);
  const std::string dumps = dir_.path() + "/dumps";
  std::ofstream(dumps + "/999999999.armed") << R"({"pid": 999999999, "start_time": "1"})";
  std::ofstream(dumps + "/999999999.stack") << "old dump";
  std::ofstream(dumps + "/torn.armed") << "{";
  PruneStaleMarkers(dumps);
  size_t armed = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dumps)) {
    EXPECT_NE(entry.path().stem(), "999999999") << entry.path();
    EXPECT_NE(entry.path().stem(), "torn") << entry.path();
    armed += entry.path().extension() == ".armed";
  }
  EXPECT_EQ(armed, 1u);
}

// A forked child (a DataLoader worker) arms nothing (a fork costs no Python code and leaves
// no file): it inherited the handler, is asked after its parent, and its dump is its own.
TEST_F(PythonStacksTest, AForkedChildAnswersOnItsOwnAndLeavesNoFile) {
  pid_t parent = StartRank("forker", 0);
  std::this_thread::sleep_for(300ms);
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir_.path() + "/dumps")) files.push_back(entry.path().filename());
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{std::to_string(parent) + ".armed", std::to_string(parent) + ".stack"}));
  const auto stacks = CollectPythonStacks(dir_.path() + "/dumps", 10s, 64 * 1024);
  ASSERT_EQ(stacks.size(), 2u);
  std::set<std::string> innermost;
  for (const auto& stack : stacks) {
    EXPECT_TRUE(stack.answered) << stack.pid;
    innermost.insert(InnermostFrames(stack.dump, 1).substr(0, InnermostFrames(stack.dump, 1).find(' ')));
    if (stack.pid == parent) continue;
    EXPECT_EQ(stack.labels.at("forked_from"), std::to_string(parent));
    EXPECT_EQ(stack.labels.at("RANK"), "0");
  }
  EXPECT_EQ(innermost, (std::set<std::string>{"all_reduce", "worker_loop"}));
  EXPECT_TRUE(stacks[0].pid == parent || stacks[1].pid == parent);
}

// Only armed processes are signalled: the shell beside the ranks would die of a real-time
// signal's default action. A stale marker (a process gone) is skipped.
TEST_F(PythonStacksTest, ProcessesThatDidNotArmAreNeverSignalled) {
  pid_t shell = Start({"/bin/sh", "-c", "echo ready; exec sleep 3600"}, 0);
  StartRank("collective", 1);
  std::ofstream(dir_.path() + "/dumps/999999999.armed") << R"({"pid": 999999999, "start_time": "1"})";
  const auto stacks = CollectPythonStacks(dir_.path() + "/dumps", 10s, 64 * 1024);
  ASSERT_EQ(stacks.size(), 1u);
  EXPECT_TRUE(stacks[0].answered);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(kill(shell, 0), 0) << "the shell was signalled";
  EXPECT_EQ(waitpid(shell, nullptr, WNOHANG), 0) << "the shell died";
}

// The image's or the user's sitecustomize still runs, after the hook armed.
TEST_F(PythonStacksTest, TheUsersSitecustomizeStillRuns) {
  const std::string user_dir = dir_.path() + "/user";
  fs::create_directories(user_dir);
  dir_.Write("user/sitecustomize.py", "import os\nopen(os.environ['USER_MARK'], 'w').write('ran')\n");
  hook_env_ = InstallPythonStackHook(dir_.path() + "/hook", dir_.path() + "/dumps", user_dir);
  const std::string mark = dir_.path() + "/user-ran";
  setenv("USER_MARK", mark.c_str(), 1);
  StartRank("collective", 0);
  unsetenv("USER_MARK");
  EXPECT_TRUE(fs::exists(mark)) << "the user's sitecustomize did not run";
  const auto stacks = CollectPythonStacks(dir_.path() + "/dumps", 10s, 64 * 1024);
  ASSERT_EQ(stacks.size(), 1u);
  EXPECT_TRUE(stacks[0].answered);
}

TEST(StackReport, InnermostFramesAreTheMainThreadsWhicheverThreadHandledTheSignal) {
  const std::string dump =
      "Current thread 0x00007f0000000002 (most recent call first):\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 320 in wait\n"
      "  File \"/usr/lib/python3.11/threading.py\", line 1002 in _bootstrap\n"
      "\n"
      "Thread 0x00007f0000000001 (most recent call first):\n"
      "  File \"/opt/torch/distributed/distributed_c10d.py\", line 1536 in all_reduce\n"
      "  File \"/job/train.py\", line 30 in main\n"
      "  File \"/job/train.py\", line 40 in <module>\n";
  EXPECT_EQ(InnermostFrames(dump), "all_reduce (distributed_c10d.py:1536) < main (train.py:30)");
  EXPECT_EQ(InnermostFrames(dump, 1), "all_reduce (distributed_c10d.py:1536)");
  EXPECT_EQ(InnermostFrames("garbage\n"), "");
}

}  // namespace
}  // namespace bt::launcher::watchdog
