// Where a model step's wall time goes, phase by phase, measured on the
// thread that steps (bench-serve reports it beside the roofline, and
// bench/scaling.sh at each thread count: the phase that stops scaling is the
// one whose time stays). Off unless a StepProfileScope is alive on that
// thread; a PhaseTimer then costs two clock reads.
#pragma once

#include <array>
#include <cstdint>

#include "core/team.h"

namespace pagedattn::engine {

enum class StepPhase : std::uint8_t {
  kForward,    // the model's whole forward pass (the others are parts of it)
  kProducts,   // the layers' weight products (expert layers included)
  kAttention,  // paged attention (latent attention with its own projections)
  kLmHead,     // the final norm's rows through the LM head
  kCount
};
inline constexpr std::size_t kStepPhases = std::size_t(StepPhase::kCount);
// A phase is also the kind of the team pieces run in it (core/team.h).
static_assert(kStepPhases == std::size_t(core::kWaitKinds));

struct StepProfile {
  std::array<double, kStepPhases> seconds{};  // wall time in each phase
  // Within those: the layer teams' threads' mean time waiting at the
  // barriers after the pieces of each phase (core/team.h, TeamWaitScope);
  // kForward's are the rest of the forward pass (norms, RoPE, activations).
  std::array<double, kStepPhases> team_waits{};

  double of(StepPhase phase) const { return seconds[std::size_t(phase)]; }
  double team_wait_in(StepPhase phase) const { return team_waits[std::size_t(phase)]; }
  double team_wait() const;  // in every phase
};

// Makes `profile` the calling thread's: PhaseTimers on this thread add to it
// while the scope lives (the previous one, if any, comes back after).
class StepProfileScope {
 public:
  explicit StepProfileScope(StepProfile* profile);
  ~StepProfileScope();
  StepProfileScope(const StepProfileScope&) = delete;
  StepProfileScope& operator=(const StepProfileScope&) = delete;

 private:
  StepProfile* previous_;
};

// Where the calling thread's profile keeps its team waits (team_waits, a
// TeamWaitScope's sinks), or null without a profile.
double* profile_team_waits();

// Adds the wall time of its life to the calling thread's profile, if any,
// and (on every thread, a team's too) counts the waits after the team
// pieces it runs meanwhile as its phase's.
class PhaseTimer {
 public:
  explicit PhaseTimer(StepPhase phase);
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  core::WaitKindScope kind_;
  StepProfile* profile_;
  StepPhase phase_;
  double start_ = 0.0;
};

}  // namespace pagedattn::engine
