// Where a model step's wall time goes, phase by phase, measured on the
// thread that steps (bench-serve reports it beside the roofline, and
// bench/scaling.sh at each thread count: the phase that stops scaling is the
// one whose time stays). Off unless a StepProfileScope is alive on that
// thread; a PhaseTimer then costs two clock reads.
#pragma once

#include <array>
#include <cstdint>

namespace pagedattn::engine {

enum class StepPhase : std::uint8_t {
  kForward,    // the model's whole forward pass (the others are parts of it)
  kProducts,   // the layers' weight products (expert layers included)
  kAttention,  // paged attention (latent attention with its own projections)
  kLmHead,     // the final norm's rows through the LM head
  // Not a part of the step beside the others but within products and the
  // rest of the forward pass: the layers' team threads' mean time waiting
  // at the barriers after each piece (core/team.h, TeamWaitScope).
  kTeamWait,
  kCount
};
inline constexpr std::size_t kStepPhases = std::size_t(StepPhase::kCount);

struct StepProfile {
  std::array<double, kStepPhases> seconds{};  // wall time in each phase

  double of(StepPhase phase) const { return seconds[std::size_t(phase)]; }
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

// Where the calling thread's profile keeps `phase`'s seconds, or null
// without a profile (for times that are not one PhaseTimer's: kTeamWait).
double* profile_seconds(StepPhase phase);

// Adds the wall time of its life to the calling thread's profile, if any.
class PhaseTimer {
 public:
  explicit PhaseTimer(StepPhase phase);
  ~PhaseTimer();
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  StepProfile* profile_;
  StepPhase phase_;
  double start_ = 0.0;
};

}  // namespace pagedattn::engine
