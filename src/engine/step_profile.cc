#include "engine/step_profile.h"

#include "core/seconds_since.h"

namespace pagedattn::engine {
namespace {
thread_local StepProfile* active_profile = nullptr;
}  // namespace

StepProfileScope::StepProfileScope(StepProfile* profile) : previous_(active_profile) {
  active_profile = profile;
}

StepProfileScope::~StepProfileScope() {
  active_profile = previous_;
}

double StepProfile::team_wait() const {
  double total = 0.0;
  for (double w : team_waits) total += w;
  return total;
}

double* profile_team_waits() {
  return active_profile != nullptr ? active_profile->team_waits.data() : nullptr;
}

PhaseTimer::PhaseTimer(StepPhase phase)
    : kind_(static_cast<int>(phase)), profile_(active_profile), phase_(phase) {
  if (profile_ != nullptr) start_ = steady_seconds();
}

PhaseTimer::~PhaseTimer() {
  if (profile_ == nullptr) return;
  profile_->seconds[std::size_t(phase_)] += steady_seconds() - start_;
}

}  // namespace pagedattn::engine
