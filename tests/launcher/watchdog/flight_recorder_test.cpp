// PyTorch's NCCL flight recorder at a hang (watchdog/flight_recorder.h), against a stand-in
// for PyTorch's side written in Python: a FIFO per rank, read without blocking by a thread
// that writes the rank's dump (a pickle, as PyTorch's DebugInfoWriter does) when asked. On
// a GPU host the real one runs in tests/integration/gpu_hang_test.sh.
#include "launcher/watchdog/flight_recorder.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "tests/support/launcher_process.h"

namespace bt::launcher::watchdog {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using bt::testing::ReadFile;
using bt::testing::TempDir;

constexpr const char* kPython = "/usr/bin/python3";

// A rank's side: makes <pipe prefix><rank>.pipe, and when a byte arrives writes
// <dump prefix><rank>, whose last collective is `last_state`.
constexpr const char* kRank = R"PY(
import os, pickle, sys, time
pipe_prefix, dump_prefix, rank, last_state = sys.argv[1:5]
pipe = f"{pipe_prefix}{rank}.pipe"
os.mkfifo(pipe)
fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
open(pipe + ".ready", "w").close()
while True:
    try:
        if os.read(fd, 128):
            break
    except BlockingIOError:
        pass
    time.sleep(0.05)
entries = [{"collective_seq_id": n, "profiling_name": "nccl:all_reduce", "state": "completed",
            "process_group": ("0", "default_pg"), "input_sizes": [[1024, 1024]], "input_dtypes": ["Float"]}
           for n in range(1, 21)]
entries[-1]["state"] = last_state
with open(f"{dump_prefix}{rank}", "wb") as dump:
    pickle.dump({"version": "2.10", "entries": entries}, dump)
)PY";

class FlightRecorderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access(kPython, X_OK) != 0) GTEST_SKIP() << "SKIPPED: " << kPython << " is not installed";
    files_ = {dir_.path() + "/dumps/rank_", dir_.path() + "/pipes/rank_"};
    fs::create_directories(dir_.path() + "/dumps");
    fs::create_directories(dir_.path() + "/pipes");
  }
  void TearDown() override {
    for (pid_t rank : ranks_) {
      kill(rank, SIGKILL);
      waitpid(rank, nullptr, 0);
    }
  }

  // Starts rank `rank`'s side and waits until its FIFO is open.
  void StartRank(int rank, const std::string& last_state) {
    const std::string script = dir_.Write("rank.py", kRank);
    const std::string rank_text = std::to_string(rank);
    const pid_t pid = fork();
    if (pid == 0) {
      execl(kPython, kPython, script.c_str(), files_.pipe_prefix.c_str(), files_.dump_prefix.c_str(), rank_text.c_str(),
            last_state.c_str(), nullptr);
      _exit(127);
    }
    ranks_.push_back(pid);
    const std::string ready = files_.pipe_prefix.string() + rank_text + ".pipe.ready";
    for (int i = 0; i < 200 && access(ready.c_str(), F_OK) != 0; ++i) std::this_thread::sleep_for(25ms);
    ASSERT_EQ(access(ready.c_str(), F_OK), 0) << "rank " << rank << " never opened its FIFO";
  }

  std::string Describe(const std::vector<AskedDump>& asked) {
    return DescribeDumps(files_, asked, std::chrono::steady_clock::now() + 10s, {});
  }

  TempDir dir_;
  FlightRecorderFiles files_;
  std::vector<pid_t> ranks_;
};

TEST_F(FlightRecorderTest, EveryRankIsAskedAndItsLastCollectivesAreInTheNote) {
  StartRank(0, "completed");
  StartRank(1, "scheduled");
  const std::vector<AskedDump> asked = RequestDumps(files_);
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_EQ(asked[0].path, files_.dump_prefix.string() + "0");
  const std::string note = Describe(asked);
  EXPECT_NE(note.find("2 rank(s) asked for a dump; 2 dump(s)"), std::string::npos) << note;
  // The dump's age is whole seconds by the clock: on a loaded machine it may read 1 or 2.
  const size_t dump = note.find(files_.dump_prefix.string() + "1 (written ");
  ASSERT_NE(dump, std::string::npos) << note;
  EXPECT_NE(note.find(" s ago): 20 collectives recorded; the last:", dump), std::string::npos) << note;
  EXPECT_NE(note.find("#20 nccl:all_reduce scheduled (group 0, inputs [1024x1024] Float)"), std::string::npos) << note;
  EXPECT_NE(note.find("#20 nccl:all_reduce completed"), std::string::npos) << note;
}

// A FIFO left by a rank that is gone has no reader: it is skipped at once, never waited on.
TEST_F(FlightRecorderTest, AFifoNobodyReadsIsSkipped) {
  ASSERT_EQ(mkfifo((files_.pipe_prefix.string() + "7.pipe").c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(RequestDumps(files_).empty());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
}

// A dump from an earlier hang is not taken for this one's: the note waits for the new one.
TEST_F(FlightRecorderTest, AnEarlierDumpIsNotTakenForTheNewOne) {
  bt::testing::WriteFile(files_.dump_prefix.string() + "0", "stale");
  fs::last_write_time(files_.dump_prefix.string() + "0", fs::file_time_type::clock::now() - 1h);
  StartRank(0, "started");
  const std::vector<AskedDump> asked = RequestDumps(files_);
  ASSERT_EQ(asked.size(), 1u);
  const std::string note = Describe(asked);
  EXPECT_NE(note.find("#20 nccl:all_reduce started"), std::string::npos) << note;
}

// A dump is data: a pickle that would call a function is refused, never run.
TEST_F(FlightRecorderTest, APickleThatNamesAFunctionIsRefusedNotRun) {
  const std::string marker = dir_.path() + "/ran";
  const std::string make = "import os, pickle\nclass Evil:\n    def __reduce__(self):\n        return (os.system, ('touch " +
                           marker + "',))\nopen('" + files_.dump_prefix.string() + "0', 'wb').write(pickle.dumps(Evil()))\n";
  ASSERT_EQ(bt::testing::RunLauncher({{"-c", make}}, kPython).exit_code, 0);
  const std::string note = Describe({});
  EXPECT_NE(note.find("not a readable dump (UnpicklingError: it names posix.system)"), std::string::npos) << note;
  EXPECT_FALSE(fs::exists(marker));
}

// Writes `script` (Python, given the dump prefix as argv[1]) and runs it.
void MakeDumps(const TempDir& dir, const FlightRecorderFiles& files, const std::string& script) {
  const std::string path = dir.Write("make.py", "import pickle, sys\nprefix = sys.argv[1]\n" + script);
  ASSERT_EQ(bt::testing::RunLauncher({{path, files.dump_prefix.string()}}, kPython).exit_code, 0);
}

// A dump whose fields are not what PyTorch writes is said to be so; the other ranks' are read.
TEST_F(FlightRecorderTest, AnOddDumpHidesNoOtherRanks) {
  MakeDumps(dir_, files_,
            "pickle.dump({'entries': [{'input_sizes': 5, 'collective_seq_id': 3}]}, open(prefix + '0', 'wb'))\n"
            "pickle.dump({'entries': [[1, 2]]}, open(prefix + '1', 'wb'))\n"
            "pickle.dump({'entries': [{'collective_seq_id': 9, 'profiling_name': 'nccl:broadcast', 'state': 'completed'}]},"
            " open(prefix + '2', 'wb'))\n");
  const std::string note = Describe({});
  EXPECT_NE(note.find("#3 None None (group None, inputs [5] )"), std::string::npos) << note;
  EXPECT_NE(note.find(files_.dump_prefix.string() + "1 (written"), std::string::npos) << note;
  EXPECT_NE(note.find("#9 nccl:broadcast completed"), std::string::npos) << note;
}

// A small crafted dump that would print without end (one long string referenced in every
// field of many entries): what the report holds, and the launcher reads, stays bounded.
TEST_F(FlightRecorderTest, WhatADumpCanPrintIsBounded) {
  MakeDumps(dir_, files_,
            "big = 'x' * (1 << 20)\n"
            "entry = {'collective_seq_id': big, 'profiling_name': big, 'state': big, 'input_sizes': [[big] * 300] * 300}\n"
            "pickle.dump({'entries': [entry] * 1000}, open(prefix + '0', 'wb'))\n"
            "for rank in range(1, 200):\n"
            "    pickle.dump({'entries': [entry] * 10}, open(prefix + str(rank), 'wb'))\n");
  const auto start = std::chrono::steady_clock::now();
  const std::string note = Describe({});
  EXPECT_LT(note.size(), 40u << 10) << note.substr(0, 2000);
  EXPECT_NE(note.find("... (the rest is cut)"), std::string::npos) << note.substr(note.size() - std::min<size_t>(note.size(), 500));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

// A directory named python3 early in PATH is no python3.
TEST_F(FlightRecorderTest, ADirectoryNamedPython3IsNotRun) {
  MakeDumps(dir_, files_, "pickle.dump({'entries': []}, open(prefix + '0', 'wb'))\n");
  fs::create_directories(dir_.path() + "/bin/python3");
  const std::string path = getenv("PATH") != nullptr ? getenv("PATH") : "";
  setenv("PATH", (dir_.path() + "/bin:/usr/bin:/bin").c_str(), 1);
  const std::string note = Describe({});
  setenv("PATH", path.c_str(), 1);
  EXPECT_NE(note.find("rank_0 (written"), std::string::npos) << note;
}

TEST_F(FlightRecorderTest, NothingToAskOrReadIsSaidPlainly) {
  const std::string note = Describe({});
  if (HasGpu()) {
    EXPECT_NE(note.find("no process group of the job armed it"), std::string::npos) << note;
  } else {
    EXPECT_EQ(note, "NCCL flight recorder: SKIPPED (no GPU on this node)");
  }
}

TEST(ArmFlightRecorder, TheJobsOwnValuesWinAndTheFifosHaveAFolderOfTheirOwn) {
  TempDir dir;
  env::JobEnvironment environment;
  environment.variables["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = "/mine/trace_";
  environment.variables["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "50";
  const FlightRecorderFiles files = ArmFlightRecorder(dir.path() + "/nccl-trace", environment);
  EXPECT_EQ(files.dump_prefix, "/mine/trace_");
  EXPECT_EQ(files.pipe_prefix, dir.path() + "/nccl-trace/pipes/rank_");
  EXPECT_TRUE(fs::is_directory(dir.path() + "/nccl-trace/pipes"));
  EXPECT_EQ(environment.variables.at("TORCH_NCCL_TRACE_BUFFER_SIZE"), "50");
  EXPECT_EQ(environment.variables.at("TORCH_NCCL_DUMP_ON_TIMEOUT"), "1");
  EXPECT_EQ(environment.variables.at("TORCH_NCCL_DEBUG_INFO_PIPE_FILE"), dir.path() + "/nccl-trace/pipes/rank_");
}

TEST(ArmFlightRecorder, AFolderItCannotMakeIsNamed) {
  TempDir dir;
  bt::testing::WriteFile(dir.path() + "/nccl-trace", "a file where the folder goes");
  env::JobEnvironment environment;
  try {
    ArmFlightRecorder(dir.path() + "/nccl-trace", environment);
    ADD_FAILURE() << "no error";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find(dir.path() + "/nccl-trace/pipes"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace bt::launcher::watchdog
