// The real binary supervising real processes: zombies, signals, grace, exit codes.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/launcher_process.h"

namespace bt::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::vector<std::string> RunArgs(const TempDir& dir, const std::vector<std::string>& command) {
  std::vector<std::string> args = {"run", "--root", dir.path() + "/root", "--"};
  args.insert(args.end(), command.begin(), command.end());
  return args;
}

std::string ConfigWithCommands(const TempDir& dir, const std::string& commands_json, const std::string& extra = "") {
  return dir.Write("job.json", R"({"enable_baseten_workdir": false, "runtime": {"start_commands": )" + commands_json +
                                   "}" + extra + "}");
}

TEST(Supervision, ExitCodePropagates) {
  TempDir dir;
  ProcessResult result = RunLauncher({RunArgs(dir, {"sh", "-c", "exit 7"})});
  EXPECT_EQ(result.exit_code, 7) << result.err;
  EXPECT_EQ(RunLauncher({RunArgs(dir, {"/bin/true"})}).exit_code, 0);
}

TEST(Supervision, DeathBySignalBecomes128PlusSignal) {
  TempDir dir;
  EXPECT_EQ(RunLauncher({RunArgs(dir, {"sh", "-c", "kill -SEGV $$"})}).exit_code, 128 + SIGSEGV);
  EXPECT_EQ(RunLauncher({RunArgs(dir, {"sh", "-c", "kill -KILL $$"})}).exit_code, 128 + SIGKILL);
}

TEST(Supervision, MissingProgramExits127) {
  TempDir dir;
  ProcessResult result = RunLauncher({RunArgs(dir, {"/nonexistent/trainer"})});
  EXPECT_EQ(result.exit_code, 127);
  EXPECT_NE(result.err.find("cannot execute /nonexistent/trainer"), std::string::npos) << result.err;
}

TEST(Supervision, FirstFailingStartCommandStopsTheRest) {
  TempDir dir;
  std::string a = dir.path() + "/a", c = dir.path() + "/c";
  std::string config = ConfigWithCommands(dir, R"(["touch )" + a + R"(", "exit 4", "touch )" + c + R"("])");
  ProcessResult result = RunLauncher({{"run", "--config", config, "--root", dir.path() + "/root"}});
  EXPECT_EQ(result.exit_code, 4) << result.err;
  EXPECT_TRUE(fs::exists(a));
  EXPECT_FALSE(fs::exists(c));
  EXPECT_NE(result.err.find("start command 2 exited with code 4"), std::string::npos) << result.err;
}

TEST(Supervision, StartCommandsRunInOrderWithTheJobEnvironment) {
  TempDir dir;
  std::string log = dir.path() + "/log";
  std::string config = ConfigWithCommands(
      dir, R"(["echo one:$BT_NODE_RANK >> )" + log + R"(", "echo two:$BT_GROUP_SIZE:$NNODES >> )" + log + R"("])");
  ProcessResult result = RunLauncher({{"run", "--config", config, "--root", dir.path() + "/root"}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(ReadFile(log), "one:0\ntwo:1:1\n");
}

TEST(Supervision, OrphanedGrandchildrenLeaveNoZombie) {
  TempDir dir;
  // The subshell exits at once, so `sleep 0.3` is orphaned and re-parented to the
  // launcher (PID 1 or subreaper), which must reap it when it exits.
  LauncherProcess launcher({RunArgs(dir, {"sh", "-c", "(sleep 0.3 &); echo spawned; sleep 2"})});
  ASSERT_TRUE(launcher.WaitForOutput("spawned", 5s));
  std::this_thread::sleep_for(100ms);
  bool orphan_adopted = false;
  for (pid_t child : ChildrenOf(launcher.pid())) {
    orphan_adopted |= ReadFile("/proc/" + std::to_string(child) + "/comm") == "sleep\n";
  }
  EXPECT_TRUE(orphan_adopted) << "the orphan was not re-parented to the launcher";
  std::this_thread::sleep_for(700ms);  // the orphan has exited by now
  EXPECT_TRUE(ZombieChildrenOf(launcher.pid()).empty());
  EXPECT_EQ(launcher.Finish().exit_code, 0);
}

TEST(Supervision, SignalReachesAGrandchild) {
  TempDir dir;
  std::string marker = dir.path() + "/grandchild-got-term";
  std::string grandchild = "trap 'echo term > " + marker + "; exit 0' TERM; echo ready; while :; do sleep 0.05; done";
  LauncherProcess launcher({RunArgs(dir, {"sh", "-c", "sh -c \"" + grandchild + "\" & wait"})});
  ASSERT_TRUE(launcher.WaitForOutput("ready", 5s));
  launcher.Signal(SIGTERM);
  ProcessResult result = launcher.Finish();
  EXPECT_TRUE(fs::exists(marker)) << result.err;
  EXPECT_EQ(result.exit_code, 128 + SIGTERM);
}

TEST(Supervision, UserSignalsAreForwardedWithoutStoppingTheJob) {
  TempDir dir;
  std::string marker = dir.path() + "/usr1";
  std::string script = "trap 'echo usr1 > " + marker + "' USR1; trap 'echo hup >> " + marker +
                       "' HUP; echo ready; while [ ! -s " + marker + " ] || ! grep -q hup " + marker +
                       "; do sleep 0.05; done; exit 5";
  LauncherProcess launcher({RunArgs(dir, {"sh", "-c", script})});
  ASSERT_TRUE(launcher.WaitForOutput("ready", 5s));
  launcher.Signal(SIGUSR1);
  std::this_thread::sleep_for(200ms);
  launcher.Signal(SIGHUP);
  ProcessResult result = launcher.Finish();
  EXPECT_EQ(result.exit_code, 5) << result.err;
  EXPECT_EQ(ReadFile(marker), "usr1\nhup\n");
}

// Slurm's --signal=USR1@90 and Lightning's auto-requeue: the trainer checkpoints on USR1
// and goes on. Its compound command's `/bin/sh -c` wrapper and the `tee` beside it must not
// die of a signal they do not handle.
TEST(Supervision, RequestSignalsReachTheTrainerAndSpareTheWrapperShellAndThePipeline) {
  TempDir dir;
  dir.Write("train.py", "import signal, sys, time\n"
                        "requests = []\n"
                        "for number in (signal.SIGUSR1, signal.SIGHUP, signal.SIGUSR2):\n"
                        "    signal.signal(number, lambda n, frame: requests.append(signal.Signals(n).name))\n"
                        "print('ready', flush=True)\n"
                        "while len(requests) < 3:\n"
                        "    time.sleep(0.05)\n"
                        "print('checkpointed on ' + ','.join(requests), flush=True)\n");
  const std::string command = "cd " + dir.path() + " && python3 train.py | tee " + dir.path() + "/train.log";
  std::string config = ConfigWithCommands(dir, nlohmann::json::array({command}).dump());
  LauncherProcess launcher({{"run", "--config", config, "--root", dir.path() + "/root"}});
  ASSERT_TRUE(launcher.WaitForOutput("ready", 10s));
  for (int signal_number : {SIGUSR1, SIGHUP, SIGUSR2}) {
    launcher.Signal(signal_number);
    std::this_thread::sleep_for(150ms);
  }
  ProcessResult result = launcher.Finish();
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("checkpointed on SIGUSR1,SIGHUP,SIGUSR2"), std::string::npos) << result.out << result.err;
  EXPECT_EQ(ReadFile(dir.path() + "/train.log"), "ready\ncheckpointed on SIGUSR1,SIGHUP,SIGUSR2\n");
}

TEST(Supervision, ARequestSignalNoProcessHandlesGoesToTheWholeGroup) {
  TempDir dir;
  LauncherProcess launcher({RunArgs(dir, {"sh", "-c", "echo ready; sleep 30 | cat"})});
  ASSERT_TRUE(launcher.WaitForOutput("ready", 5s));
  std::this_thread::sleep_for(100ms);
  launcher.Signal(SIGUSR1);
  ProcessResult result = launcher.Finish();
  EXPECT_EQ(result.exit_code, 128 + SIGUSR1) << result.err;
  EXPECT_LT(result.elapsed, 20s);
}

TEST(Supervision, ChildIgnoringSigtermIsKilledAfterTheGrace) {
  TempDir dir;
  std::string config = ConfigWithCommands(dir, R"(["trap '' TERM; echo ready; while :; do sleep 0.05; done"])",
                                          R"(, "launcher": {"grace_period_s": 1})");
  LauncherProcess launcher({{"run", "--config", config, "--root", dir.path() + "/root"}});
  ASSERT_TRUE(launcher.WaitForOutput("ready", 5s));
  auto sent = std::chrono::steady_clock::now();
  launcher.Signal(SIGTERM);
  ProcessResult result = launcher.Finish();
  auto took = std::chrono::steady_clock::now() - sent;
  EXPECT_EQ(result.exit_code, 128 + SIGKILL) << result.err;
  EXPECT_GE(took, 900ms);
  EXPECT_LT(took, 10s);
  EXPECT_NE(result.err.find("grace period of 1000 ms is over"), std::string::npos) << result.err;
}

TEST(Supervision, GracefulExitAfterSigtermKeepsTheChildsCode) {
  TempDir dir;
  LauncherProcess launcher({RunArgs(dir, {"sh", "-c", "trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done"})});
  ASSERT_TRUE(launcher.WaitForOutput("ready", 5s));
  launcher.Signal(SIGTERM);
  EXPECT_EQ(launcher.Finish().exit_code, 0);
}

TEST(Supervision, SigtermSkipsTheRemainingStartCommands) {
  TempDir dir;
  std::string second = dir.path() + "/second";
  std::string config = ConfigWithCommands(
      dir, R"(["trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done", "touch )" + second + R"("])");
  LauncherProcess launcher({{"run", "--config", config, "--root", dir.path() + "/root"}});
  ASSERT_TRUE(launcher.WaitForOutput("ready", 5s));
  launcher.Signal(SIGTERM);
  EXPECT_EQ(launcher.Finish().exit_code, 128 + SIGTERM);
  EXPECT_FALSE(fs::exists(second));
}

TEST(Supervision, LeftoverGroupMembersAreStoppedWhenTheCommandEnds) {
  TempDir dir;
  std::string pid_file = dir.path() + "/bg.pid";
  ProcessResult result = RunLauncher({RunArgs(dir, {"sh", "-c", "sleep 60 & echo $! > " + pid_file + "; exit 0"})});
  EXPECT_EQ(result.exit_code, 0);
  pid_t background = std::atoi(ReadFile(pid_file).c_str());
  ASSERT_GT(background, 0);
  EXPECT_NE(kill(background, 0), 0) << "background process " << background << " survived the launcher";
  EXPECT_LT(result.elapsed, 20s);
}

TEST(Supervision, SigtermDuringTheCleanupOfLeftoversStillStopsTheJob) {
  TempDir dir;
  // Command 1 exits 0 leaving a member that ignores TERM: the launcher cleans up its group
  // for the grace period. A TERM then must stop the job, not be dropped.
  std::string config = ConfigWithCommands(dir, R"(["(trap '' TERM; exec sleep 30) & echo first-done", "echo second-ran"])",
                                          R"(, "launcher": {"grace_period_s": 3})");
  LauncherProcess launcher({{"run", "--config", config, "--root", dir.path() + "/root"}});
  ASSERT_TRUE(launcher.WaitForOutput("first-done", 10s));
  ASSERT_TRUE(launcher.WaitForLog("processes remain in its group", 10s));
  launcher.Signal(SIGTERM);
  ProcessResult result = launcher.Finish();
  EXPECT_EQ(result.exit_code, 143) << result.err;
  EXPECT_EQ(result.out.find("second-ran"), std::string::npos) << "the next command ran after SIGTERM";
}

TEST(Supervision, CleanupDoesNotWaitForAZombieWhoseParentEscapedTheGroup) {
  TempDir dir;
  // The child stays in the job's group and exits; its parent moves to a new session and
  // never reaps it: only a zombie is left in the group.
  const std::string script =
      "import os, time\n"
      "if os.fork() == 0:\n"
      "    time.sleep(0.2); os._exit(0)\n"
      "os.setsid()\n"
      "open('" + dir.path() + "/escaped.pid', 'w').write(str(os.getpid()))\n"
      "time.sleep(30)\n";
  dir.Write("escape.py", script);
  ProcessResult result = RunLauncher({RunArgs(dir, {"sh", "-c", "python3 " + dir.path() + "/escape.py & sleep 1; exit 0"})});
  kill(std::atoi(ReadFile(dir.path() + "/escaped.pid").c_str()), SIGKILL);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_LT(result.elapsed, 10s) << "the cleanup waited on a zombie";
}

TEST(Supervision, CommandAfterDashDashIsFoundInTheJobsPath) {
  TempDir dir;
  dir.Write("tools/only-in-job-path", "#!/bin/sh\necho found-in-job-path\n");
  fs::permissions(dir.path() + "/tools/only-in-job-path", fs::perms::owner_all);
  std::string config = dir.Write("job.json", R"({"runtime": {"environment_variables": {"PATH": ")" + dir.path() +
                                                 R"(/tools:/usr/bin:/bin"}}})");
  ProcessResult result = RunLauncher({{"run", "--config", config, "--root", dir.path() + "/root", "--", "only-in-job-path"}});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("found-in-job-path"), std::string::npos);
}

TEST(Supervision, ShortSecretsAreNamedAsNotRedacted) {
  TempDir dir;
  dir.Write("root/secrets/pin", "42");
  std::string config = dir.Write("short.json", R"({"runtime": {"start_commands": ["true"], "environment_variables": {"PIN": {"name": "pin"}}}})");
  ProcessResult result = RunLauncher({{"run", "--config", config, "--root", dir.path() + "/root"}});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("secret variable PIN is shorter than 4 bytes: it is not redacted"), std::string::npos) << result.err;
}

TEST(Supervision, RendezvousTokenIsNotInTheLaunchersOwnEnvironment) {
  TempDir dir;
  ProcessResult result = RunLauncher({RunArgs(dir, {"sh", "-c", "tr '\\0' '\\n' < /proc/$PPID/environ"}),
                                      {{"BT_RENDEZVOUS_TOKEN", "token-TOPSECRET-value"}}});
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out.find("TOPSECRET"), std::string::npos) << "the job can read the token from its parent";
}

bool Alive(pid_t pid) {
  if (pid <= 0 || kill(pid, 0) != 0) return false;
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  return close != std::string::npos && stat[close + 2] != 'Z';
}

TEST(Supervision, ProcessThatLeftTheGroupAndIgnoresSigtermDoesNotOutliveTheLauncher) {
  TempDir dir;
  std::string config = ConfigWithCommands(
      dir, R"(["setsid sh -c 'trap \"\" TERM; echo $$ > )" + dir.path() + R"(/escaped.pid; exec sleep 300' & sleep 0.5; echo done"])",
      R"(, "launcher": {"grace_period_s": 2})");
  ProcessResult result = RunLauncher({{"run", "--config", config, "--root", dir.path() + "/root"}});
  pid_t escaped = std::atoi(ReadFile(dir.path() + "/escaped.pid").c_str());
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("outlived the job's commands: sending SIGTERM"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("still running after the grace period: sending SIGKILL"), std::string::npos) << result.err;
  EXPECT_FALSE(Alive(escaped)) << "pid " << escaped << " outlived the launcher";
  if (Alive(escaped)) kill(escaped, SIGKILL);
}

// scancel: the escaped process got the forwarded SIGTERM when the stop began, so its grace
// ran with the group's. A second grace after the group's would outlast Slurm's KillWait.
TEST(Supervision, AStopGivesOneGraceToTheGroupAndToWhatLeftIt) {
  TempDir dir;
  std::string config = ConfigWithCommands(
      dir, R"(["trap '' TERM; setsid sh -c 'echo $$ > )" + dir.path() + R"(/escaped.pid; exec sleep 300' & echo started; exec sleep 300"])",
      R"(, "launcher": {"grace_period_s": 3})");
  LauncherProcess launcher({{"run", "--config", config, "--root", dir.path() + "/root"}});
  ASSERT_TRUE(launcher.WaitForOutput("started", 20s));
  const auto stopped_at = std::chrono::steady_clock::now();
  launcher.Signal(SIGTERM);
  ProcessResult result = launcher.Finish();
  const auto took = std::chrono::steady_clock::now() - stopped_at;
  pid_t escaped = std::atoi(ReadFile(dir.path() + "/escaped.pid").c_str());
  EXPECT_EQ(result.exit_code, 128 + SIGKILL) << "the group ignored SIGTERM: SIGKILLed after the grace\n" << result.err;
  EXPECT_GE(took, 2900ms) << result.err;
  EXPECT_LT(took, 4500ms) << "the escaped process got a second grace:\n" << result.err;
  EXPECT_FALSE(Alive(escaped)) << "pid " << escaped << " outlived the launcher";
  if (Alive(escaped)) kill(escaped, SIGKILL);
}

// The command has exited and the launcher is already cleaning up what it left in its
// group when the stop comes: the stop's one grace still covers what left the group too.
TEST(Supervision, AStopDuringTheGroupsCleanUpGivesOneGrace) {
  TempDir dir;
  std::string config = ConfigWithCommands(
      dir, R"(["trap '' TERM; setsid sh -c 'echo $$ > )" + dir.path() + R"(/escaped.pid; exec sleep 300' & (trap '' TERM; exec sleep 300) & echo started; exit 0"])",
      R"(, "launcher": {"grace_period_s": 3})");
  LauncherProcess launcher({{"run", "--config", config, "--root", dir.path() + "/root"}});
  ASSERT_TRUE(launcher.WaitForLog("processes remain in its group", 20s));
  std::this_thread::sleep_for(1s);
  const auto stopped_at = std::chrono::steady_clock::now();
  launcher.Signal(SIGTERM);
  ProcessResult result = launcher.Finish();
  const auto took = std::chrono::steady_clock::now() - stopped_at;
  pid_t escaped = std::atoi(ReadFile(dir.path() + "/escaped.pid").c_str());
  // A second grace would end after 6 s; a busy machine adds up to about 2 s to the one.
  EXPECT_LT(took, 5s) << "the escaped process got a second grace:\n" << result.err;
  EXPECT_FALSE(Alive(escaped)) << "pid " << escaped << " outlived the launcher";
  if (Alive(escaped)) kill(escaped, SIGKILL);
}

TEST(Supervision, ALogReaderTheLauncherInheritedIsNotTreatedAsAnEscapedProcess) {
  TempDir dir;
  // bash forks the process substitution before it execs bt-launch: sed is the launcher's
  // child from the start, and the launcher's own output goes through it.
  const std::string script = std::string("exec ") + BT_LAUNCH_BINARY + " run --root " + dir.path() +
                             "/root -- sh -c 'sleep 0.3; echo from-job' > >(sed -u 's/^/[node 0] /') 2>&1";
  ProcessResult result = RunLauncher({{"-c", script}}, "/bin/bash");
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_EQ(result.out.find("outlived"), std::string::npos) << result.out;
}

TEST(Supervision, WorkerInItsOwnSessionGetsTheShutdownSignalLikeTorchrunsWorkers) {
  TempDir dir;
  // An agent (torchrun's role) starts its worker in a new session and ignores SIGTERM; the
  // worker saves on SIGTERM. The agent is SIGKILLed after the grace: the worker must have
  // been told before that, not orphaned.
  dir.Write("worker.sh", "trap 'echo saved > " + dir.path() + "/worker.saved; exit 0' TERM\necho $$ > " + dir.path() +
                             "/worker.pid\nsleep 300 & wait\n");
  // (The agent ignores SIGTERM only after starting the worker: an ignored signal is
  // inherited, and a shell cannot trap what it was started ignoring.)
  dir.Write("agent.py", "import signal, subprocess, time\n"
                        "subprocess.Popen(['sh', '" + dir.path() + "/worker.sh'], start_new_session=True)\n"
                        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                        "print('agent-started', flush=True)\ntime.sleep(300)\n");
  std::string config = ConfigWithCommands(dir, R"(["python3 )" + dir.path() + R"(/agent.py"])", R"(, "launcher": {"grace_period_s": 2})");
  LauncherProcess launcher({{"run", "--config", config, "--root", dir.path() + "/root"}});
  ASSERT_TRUE(launcher.WaitForOutput("agent-started", 10s));
  for (int i = 0; i < 100 && !fs::exists(dir.path() + "/worker.pid"); ++i) std::this_thread::sleep_for(20ms);
  launcher.Signal(SIGTERM);
  ProcessResult result = launcher.Finish();
  pid_t worker = std::atoi(ReadFile(dir.path() + "/worker.pid").c_str());
  EXPECT_EQ(result.exit_code, 143) << result.err;
  EXPECT_EQ(ReadFile(dir.path() + "/worker.saved"), "saved\n") << result.err;
  EXPECT_FALSE(Alive(worker));
  if (Alive(worker)) kill(worker, SIGKILL);
}

// SIGKILLs the launcher once `started` is printed and expects the process whose pid the job
// wrote to `pid_file` to be gone within 5 s.
void ExpectGoneWithItsKilledLauncher(const TempDir& dir, const std::string& config, const std::string& started,
                                     const std::string& pid_file, const std::string& what) {
  LauncherProcess launcher({{"run", "--config", config, "--root", dir.path() + "/root"}});
  ASSERT_TRUE(launcher.WaitForOutput(started, 10s));
  const pid_t pid = std::atoi(ReadFile(dir.path() + "/" + pid_file).c_str());
  ASSERT_TRUE(Alive(pid));
  launcher.Signal(SIGKILL);
  launcher.Finish();
  for (int i = 0; i < 50 && Alive(pid); ++i) std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(Alive(pid)) << what << " (pid " << pid << ") outlived its SIGKILLed launcher";
  if (Alive(pid)) kill(pid, SIGKILL);
}

// mpirun SIGKILLs a launcher about a second after its SIGTERM, whatever grace_period_s says:
// the job's processes must die with it, not be re-parented and keep their GPUs. Killed as
// soon as the job runs, maybe before the launcher has named the job's group to its guard.
TEST(Supervision, LauncherKilledWithoutWarningTakesItsJobWithIt) {
  TempDir dir;
  // The shell stays the group's leader, with the training as its child: the processes a
  // parent-death signal on the leader alone would leave running.
  std::string config = ConfigWithCommands(
      dir, R"(["sleep 300 & echo $! > )" + dir.path() + R"(/training.pid; echo started; wait"])");
  ExpectGoneWithItsKilledLauncher(dir, config, "started", "training.pid", "the training");
}

// torchrun starts its workers in sessions of their own: a SIGKILLed launcher must not leave
// them running either.
TEST(Supervision, LauncherKilledWithoutWarningTakesWorkersInTheirOwnSessionsWithIt) {
  TempDir dir;
  dir.Write("agent.py", "import subprocess, time\n"
                        "worker = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
                        "open('" + dir.path() + "/worker.pid', 'w').write(str(worker.pid))\n"
                        "print('agent-started', flush=True)\ntime.sleep(300)\n");
  std::string config = ConfigWithCommands(dir, R"(["python3 )" + dir.path() + R"(/agent.py"])");
  ExpectGoneWithItsKilledLauncher(dir, config, "agent-started", "worker.pid", "the worker (its own session)");
}

// A daemon (its own session, its parent gone) is no descendant of the job's group any more
// when the launcher dies: the environment it inherited still says whose it is.
TEST(Supervision, LauncherKilledWithoutWarningTakesADaemonOfTheJobWithIt) {
  TempDir dir;
  // The pid is written from inside the new session, and the subshell that started it has
  // exited by then: the daemon is in no group of the job and no descendant of it.
  const std::string pid_file = dir.path() + "/daemon.pid";
  std::string config = ConfigWithCommands(
      dir, R"(["(setsid sh -c 'echo $$ > )" + pid_file + R"(.tmp && mv )" + pid_file + R"(.tmp )" + pid_file +
               R"(; exec sleep 300' &); while [ ! -f )" + pid_file + R"( ]; do sleep 0.05; done; echo started; sleep 300"])");
  ExpectGoneWithItsKilledLauncher(dir, config, "started", "daemon.pid", "the job's daemon");
}

TEST(Supervision, PrintsATimelineAtExit) {
  TempDir dir;
  ProcessResult result = RunLauncher({RunArgs(dir, {"/bin/true"})});
  EXPECT_NE(result.err.find("timeline: identity"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("run "), std::string::npos);
  EXPECT_NE(result.err.find("(exit 0), total"), std::string::npos);
}

TEST(Supervision, RunsAsANonRootUser) {
  if (geteuid() != 0) {
    TempDir dir;
    EXPECT_EQ(RunLauncher({RunArgs(dir, {"/bin/true"})}).exit_code, 0);
    return;
  }
  TempDir dir;
  const uid_t nobody = 65534;
  ASSERT_EQ(chown(dir.path().c_str(), nobody, nobody), 0);
  // The checkout may sit under a directory `nobody` cannot enter (/root): run copies.
  const std::string binary = dir.path() + "/bt-launch", config = dir.path() + "/single-node.json";
  fs::copy_file(BT_LAUNCH_BINARY, binary);
  fs::copy_file(std::string(BT_SOURCE_DIR) + "/examples/single-node.json", config);
  fs::permissions(config, fs::perms::others_read, fs::perm_options::add);
  LauncherProcess process({{"run", "--config", config, "--root", dir.path() + "/root"}, {{"HOME", dir.path()}}, {}, nobody},
                          binary);
  ProcessResult result = process.Finish();
  EXPECT_EQ(result.exit_code, 0) << result.err << result.out;
  EXPECT_TRUE(fs::is_directory(dir.path() + "/root/node-0/mnt/ckpts"));
}

}  // namespace
}  // namespace bt::testing
