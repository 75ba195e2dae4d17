// A test program run again as "the other process" of a multi-process test: forked and exec'd with
// a gtest filter that selects its child entry point, told its role through an environment
// variable (`ROLE:FD`, FD the write end of a pipe), optionally inside a network namespace
// (tests/two_hosts.hpp). The parent reads the child's lines from the pipe; the destructor kills a
// child still running, so a failed assertion leaves no process behind.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>

namespace mixkv::testing {

class ChildProcess {
 public:
  // `env_var` carries `ROLE:FD` to the child; `child_test` is the gtest filter of its entry point.
  ChildProcess(std::string env_var, std::string child_test)
      : env_var_(std::move(env_var)), filter_("--gtest_filter=" + std::move(child_test)) {}
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  ~ChildProcess() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (from_child_ >= 0) ::close(from_child_);
  }

  // This test program again as `role`, inside network namespace `netns` if given.
  void spawn(const std::string& role, const std::string& netns = "") {
    const std::string exe = self_path();
    int fds[2];
    ASSERT_EQ(::pipe(fds), 0);
    pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      ::close(fds[0]);
      ::setenv(env_var_.c_str(), (role + ":" + std::to_string(fds[1])).c_str(), 1);
      if (netns.empty()) {
        ::execl(exe.c_str(), exe.c_str(), filter_.c_str(), static_cast<char*>(nullptr));
      } else {
        ::execlp("ip", "ip", "netns", "exec", netns.c_str(), exe.c_str(), filter_.c_str(),
                 static_cast<char*>(nullptr));
      }
      std::_Exit(127);
    }
    ::close(fds[1]);
    from_child_ = fds[0];
  }

  // The child's next line, or "" once `limit` has passed (or the child closed the pipe).
  std::string line(std::chrono::milliseconds limit = std::chrono::seconds(30)) {
    std::string text;
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      pollfd p{from_child_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char c = 0;
      if (::read(from_child_, &c, 1) != 1) break;
      if (c == '\n') return text;
      text += c;
    }
    return "";
  }

  // The child's exit status, 128 + the signal for a child killed by one.
  int wait_exit() {
    int status = 0;
    ::waitpid(pid, &status, 0);
    pid = -1;
    return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
  }

  pid_t pid = -1;  // public: a test may kill the child mid-transfer

 private:
  static std::string self_path() {
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
  }

  std::string env_var_, filter_;
  int from_child_ = -1;
};

}  // namespace mixkv::testing
