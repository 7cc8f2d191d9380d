#include "pagedattn/stop_matcher.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace pagedattn::serve {
namespace {

// Feeds `chunks`, returns what was sent and whether it stopped.
std::pair<std::string, bool> run(std::vector<std::string> stops,
                                 const std::vector<std::string>& chunks) {
  StopMatcher m(std::move(stops));
  std::string sent;
  for (const std::string& c : chunks) {
    const StopMatcher::Result r = m.feed(c);
    sent += r.text;
    if (r.stopped) return {sent, true};
  }
  return {sent + m.finish(), false};
}

TEST(StopMatcher, FindsAStopStringSplitAcrossChunksAndNeverSendsIt) {
  EXPECT_EQ(run({"END"}, {"abc E", "N", "D tail"}), std::make_pair(std::string("abc "), true));
  EXPECT_EQ(run({"END"}, {"E", "N", "D"}), std::make_pair(std::string(), true));
}

TEST(StopMatcher, ReleasesHeldTextWhenItTurnsOutNotToBeAStop) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.feed("abcE").text, "abc");  // "E" may start END
  EXPECT_EQ(m.feed("N").text, "");
  EXPECT_EQ(m.feed("x").text, "ENx");
  EXPECT_EQ(m.finish(), "");
  EXPECT_EQ(run({"END"}, {"xEN"}), std::make_pair(std::string("xEN"), false));
}

TEST(StopMatcher, TheEarliestOfSeveralStopsWins) {
  EXPECT_EQ(run({"cd", "b"}, {"abcd"}), std::make_pair(std::string("a"), true));
  EXPECT_EQ(run({"bcx", "c"}, {"ab", "cx"}), std::make_pair(std::string("a"), true));
}

TEST(StopMatcher, NoStopsPassesEverythingAndEmptyStopsAreIgnored) {
  EXPECT_EQ(run({}, {"a", "b"}), std::make_pair(std::string("ab"), false));
  EXPECT_EQ(run({""}, {"a", "b"}), std::make_pair(std::string("ab"), false));
}

TEST(StopMatcher, KeepStopEndsTheTextWithTheStopStringFound) {
  StopMatcher m({"cd", "b"}, /*keep_stop=*/true);
  const StopMatcher::Result r = m.feed("abcd tail");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "ab");
  EXPECT_EQ(r.matched, "b");
  StopMatcher split({"END"}, /*keep_stop=*/true);
  EXPECT_EQ(split.feed("x E").text, "x ");
  EXPECT_EQ(split.feed("ND y").text, "END");
}

TEST(StopMatcher, NothingAfterAStop) {
  StopMatcher m({"x"});
  EXPECT_TRUE(m.feed("axb").stopped);
  EXPECT_EQ(m.feed("more").text, "");
  EXPECT_EQ(m.finish(), "");
}

}  // namespace
}  // namespace pagedattn::serve
