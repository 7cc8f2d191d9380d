#include "core/cpu_load.h"

#include <sched.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/placement.h"
#include "core/seconds_since.h"

namespace pagedattn::core {
namespace {

bool may_run_on(const cpu_set_t& set, int cpu) {
  return cpu >= 0 && cpu < CPU_SETSIZE && CPU_ISSET(cpu, &set);
}

// Sums the aggregate "cpu" line, or the "cpuN" lines of the CPUs in `only`.
bool read_proc_stat(const cpu_set_t* only, CpuSample& s) {
  std::ifstream f("/proc/stat");
  std::string line;
  bool any = false;
  while (std::getline(f, line) && line.rfind("cpu", 0) == 0) {
    std::istringstream in(line);
    std::string name;
    std::int64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0,
                 steal = 0;
    if (!(in >> name >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal))
      continue;
    const bool aggregate = name == "cpu";
    if (aggregate != (only == nullptr)) continue;
    if (!aggregate && !may_run_on(*only, std::atoi(name.c_str() + 3))) continue;
    s.busy_ticks += user + nice + system + irq + softirq;
    s.steal_ticks += steal;
    any = true;
  }
  return any;
}

// Fields 14 and 15 (utime, stime) follow the parenthesised command name.
bool read_self_stat(CpuSample& s) {
  std::ifstream f("/proc/self/stat");
  std::string line;
  std::getline(f, line);
  const std::size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 > line.size()) return false;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  std::int64_t utime = 0, stime = 0;
  for (int i = 3; i <= 13; ++i) rest >> field;
  if (!(rest >> utime >> stime)) return false;
  s.self_ticks = utime + stime;
  return true;
}

}  // namespace

CpuSample sample_cpu(bool allowed_cpus_only) {
  CpuSample s;
  s.wall_seconds = steady_seconds();
  cpu_set_t set;
  CPU_ZERO(&set);
  const std::vector<int> cpus = allowed_cpus_only ? process_cpus() : std::vector<int>{};
  for (int cpu : cpus) CPU_SET(cpu, &set);
  const bool masked = !cpus.empty();
  const bool stat = read_proc_stat(masked ? &set : nullptr, s);
  s.valid = read_self_stat(s) && stat;
  return s;
}

double other_cores_between(const CpuSample& a, const CpuSample& b) {
  const double wall = b.wall_seconds - a.wall_seconds;
  const double hz = double(sysconf(_SC_CLK_TCK));
  if (!a.valid || !b.valid || wall <= 0.0 || hz <= 0.0) return 0.0;
  const double others = double((b.busy_ticks - a.busy_ticks) - (b.self_ticks - a.self_ticks)) +
                        double(b.steal_ticks - a.steal_ticks);
  return std::max(0.0, others / hz / wall);
}

int allowed_cpus() {
  return std::max(1, static_cast<int>(process_cpus().size()));
}

bool openmp_waits_passively() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  return policy != nullptr && strcasecmp(policy, "passive") == 0;
}

}  // namespace pagedattn::core
