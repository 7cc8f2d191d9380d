// `pagedattn serve` itself: SIGTERM lets the in-flight stream finish, then
// the process exits 0.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "socket_client.h"

namespace pagedattn::serve {
namespace {

using namespace std::chrono_literals;

struct Child {
  pid_t pid = -1;
  int port = -1;
};

// Starts the CLI on a free port and reads the port from its first line.
Child start_server() {
  int out[2];
  EXPECT_EQ(pipe(out), 0);
  Child c;
  c.pid = fork();
  if (c.pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    close(out[1]);
    execl(PAGEDATTN_CLI, PAGEDATTN_CLI, "serve", "--model", "tiny", "--port", "0",
          "--kv-memory-mib", "4", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  std::FILE* f = fdopen(out[0], "r");
  char line[512] = {};
  if (std::fgets(line, sizeof line, f) != nullptr) {
    const std::string s = line;
    const auto colon = s.rfind(':');
    if (colon != std::string::npos) c.port = std::atoi(s.c_str() + colon + 1);
  }
  std::fclose(f);
  return c;
}

TEST(ServeCli, SigtermFinishesTheStreamAndExitsZero) {
  const Child server = start_server();
  ASSERT_GT(server.pid, 0);
  ASSERT_GT(server.port, 0) << "no 'listening' line from " << PAGEDATTN_CLI;
  testing::SocketClient s(server.port);
  s.send(testing::http_post("/v1/completions",
                            R"({"prompt": "x", "max_tokens": 64, "stream": true})"));
  ASSERT_NE(s.read_until("data: ", 60s).find("data: "), std::string::npos);
  ASSERT_EQ(kill(server.pid, SIGTERM), 0);
  EXPECT_NE(s.read_until("data: [DONE]", 30s).find("data: [DONE]"), std::string::npos);
  int status = 0;
  ASSERT_EQ(waitpid(server.pid, &status, 0), server.pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace pagedattn::serve
