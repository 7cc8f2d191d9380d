// Tokenizer on small hand-built vocabularies: merges and their priority,
// pre-tokenizer splits, special tokens, BOS/EOS, byte fallback, exact round
// trips of arbitrary bytes, StreamingDecoder, and vocabulary validation.
#include "pagedattn/tokenizer.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "model/pretokenizer.h"
#include "model/tokenizer_models.h"
#include "pagedattn/errors.h"

namespace pagedattn {
namespace {

using tokenizer_detail::byte_level_table;

// A byte-level vocabulary: 3 control tokens, one user-defined token, the 256
// byte symbols, then the results of `merges` in order.
TokenizerVocab byte_level_vocab(std::vector<std::string> merges, std::string pre = "default") {
  TokenizerVocab v;
  v.model = "gpt2";
  v.pre = std::move(pre);
  v.tokens = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool>"};
  v.token_type = {3, 3, 3, 4};
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(byte_level_table().byte_to_text[b]);
    v.token_type.push_back(1);
  }
  for (const std::string& m : merges) {
    const std::size_t space = m.find(' ');
    v.tokens.push_back(m.substr(0, space) + m.substr(space + 1));
    v.token_type.push_back(1);
  }
  v.merges = std::move(merges);
  v.bos_id = 1;
  v.eos_id = 2;
  return v;
}

std::vector<std::string> pieces(const Tokenizer& t, const std::vector<std::int32_t>& ids) {
  std::vector<std::string> out;
  for (std::int32_t id : ids) out.push_back(t.vocab().tokens[id]);
  return out;
}

std::vector<std::string> words(tokenizer_detail::PreTokenizer kind, std::string_view text) {
  std::vector<tokenizer_detail::WordSpan> spans;
  tokenizer_detail::pre_tokenize(kind, text, spans);
  std::vector<std::string> out;
  for (auto s : spans) out.emplace_back(text.substr(s.begin, s.end - s.begin));
  return out;
}

using Words = std::vector<std::string>;

TEST(PreTokenizer, Gpt2Rules) {
  using tokenizer_detail::PreTokenizer;
  EXPECT_EQ(words(PreTokenizer::kGpt2, "I'm  fine, 1234 ok\n\n x"),
            (Words{"I", "'m", " ", " fine", ",", " 1234", " ok", "\n\n", " x"}));
  EXPECT_EQ(words(PreTokenizer::kGpt2, "a   "), (Words{"a", "   "}));
  EXPECT_EQ(words(PreTokenizer::kGpt2, "héllo wörld"), (Words{"héllo", " wörld"}));
}

TEST(PreTokenizer, SmolLmSplitsEveryDigit) {
  using tokenizer_detail::PreTokenizer;
  EXPECT_EQ(words(PreTokenizer::kSmolLm, "x 1234  5"),
            (Words{"x", " ", "1", "2", "3", "4", "  ", "5"}));
}

TEST(PreTokenizer, Llama3AndQwen2Rules) {
  using tokenizer_detail::PreTokenizer;
  EXPECT_EQ(words(PreTokenizer::kLlama3, "I'M 12345 (hi)\r\n\n  y"),
            (Words{"I", "'M", " ", "123", "45", " (", "hi", ")\r\n\n", " ", " y"}));
  EXPECT_EQ(words(PreTokenizer::kQwen2, "ab 123"), (Words{"ab", " ", "1", "2", "3"}));
  EXPECT_EQ(words(PreTokenizer::kLlama3, "a \n\t b"), (Words{"a", " \n", "\t", " b"}));
}

TEST(PreTokenizer, TekkenSplitsAtCaseChanges) {
  using tokenizer_detail::PreTokenizer;
  EXPECT_EQ(
      words(PreTokenizer::kTekken, "HelloWorld ABC def's 123 a/b\n/x"),
      (Words{"Hello", "World", " ABC", " def", "'s", " ", "1", "2", "3", " a", "/b", "\n", "/x"}));
  // Marks and other letters count as both cases; "!!\n/" keeps its newline and slash.
  EXPECT_EQ(words(PreTokenizer::kTekken, "e\u0301t\u00c9T \u4e2d\u6587!!\n/"),
            (Words{"e\u0301t", "\u00c9T", " \u4e2d\u6587", "!!\n/"}));
}

TEST(ByteLevelBpe, AppliesMergesByRank) {
  Tokenizer t(
      byte_level_vocab({"h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"}));
  EXPECT_EQ(pieces(t, t.encode("hello world")), (Words{"hello", "Ġworld"}));
  // "b c" outranks "a b": abc -> a + bc.
  Tokenizer ranked(byte_level_vocab({"b c", "a b"}));
  EXPECT_EQ(pieces(ranked, ranked.encode("abc")), (Words{"a", "bc"}));
  Tokenizer reversed(byte_level_vocab({"a b", "b c"}));
  EXPECT_EQ(pieces(reversed, reversed.encode("abc")), (Words{"ab", "c"}));
}

TEST(ByteLevelBpe, RoundTripsArbitraryBytes) {
  Tokenizer t(byte_level_vocab({"h e", "l l", "Ġ Ġ", "Ã ©"}));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text(rng() % 40, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 256);
    const auto ids = t.encode(text, {.add_special = false});
    EXPECT_EQ(t.decode(ids), text);
  }
  EXPECT_EQ(t.decode(t.encode("\xff\xfe h\xc3\xa9llo \xe2\x82")), "\xff\xfe h\xc3\xa9llo \xe2\x82");
}

// encode keeps a word cache: several threads encoding at once must agree
// with one thread (and run clean under the sanitizers).
TEST(ByteLevelBpe, EncodesFromSeveralThreads) {
  Tokenizer t(byte_level_vocab({"h e", "l l", "he ll", "hell o", "Ġ w", "o r"}));
  std::string text;
  for (int i = 0; i < 400; ++i) text += "hello world " + std::to_string(i % 37) + " ";
  const auto expected = t.encode(text);
  std::vector<std::vector<std::int32_t>> results(4);
  std::vector<std::thread> threads;
  for (auto& r : results) threads.emplace_back([&t, &text, &r] { r = t.encode(text); });
  for (auto& th : threads) th.join();
  for (const auto& r : results) EXPECT_EQ(r, expected);
}

TEST(Tokenizer, SpecialTokensOnlyWithParseSpecial) {
  Tokenizer t(byte_level_vocab({}));
  const std::string text = "<|im_start|>user<tool>x<|im_end|>";
  const auto parsed = t.encode(text, {.add_special = false, .parse_special = true});
  EXPECT_EQ(parsed.front(), 1);
  EXPECT_EQ(parsed.back(), 2);
  const auto plain = t.encode(text, {.add_special = false, .parse_special = false});
  EXPECT_NE(plain.front(), 1);
  // User-defined tokens are matched either way.
  EXPECT_NE(std::find(plain.begin(), plain.end(), 3), plain.end());
  EXPECT_EQ(t.decode(parsed), text);
  EXPECT_EQ(t.decode(plain), text);
  EXPECT_EQ(t.decode(parsed, {.render_special = false}), "user<tool>x");
}

TEST(Tokenizer, AddsBosAndEosAsTheFlagsSay) {
  TokenizerVocab v = byte_level_vocab({});
  v.add_bos = true;
  v.add_eos = true;
  Tokenizer t(v);
  const auto ids = t.encode("a");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[2], 2);
  EXPECT_EQ(t.encode("a", {.add_special = false}).size(), 1u);
}

TEST(StreamingDecoder, HoldsBackIncompleteUtf8) {
  Tokenizer t(byte_level_vocab({}));
  const std::string text = "a\xc3\xa9\xf0\x9f\x99\x82 \xff";  // a é 🙂 space, invalid 0xff
  const auto ids = t.encode(text);
  ASSERT_EQ(ids.size(), text.size());  // no merges: one token per byte
  StreamingDecoder stream(t);
  std::vector<std::string> outputs;
  for (std::int32_t id : ids) outputs.push_back(stream.push(id));
  EXPECT_EQ(outputs, (Words{"a", "", "\xc3\xa9", "", "", "", "\xf0\x9f\x99\x82", " ", "\xff"}));
  EXPECT_EQ(stream.flush(), "");
  // A truncated character at the end comes out on flush.
  EXPECT_EQ(stream.push(ids[3]), "");
  EXPECT_EQ(stream.push(ids[4]), "");
  EXPECT_EQ(stream.flush(), "\xf0\x9f");
  // A lead byte followed by a non-continuation is released at once.
  EXPECT_EQ(stream.push(ids[1]), "");
  EXPECT_EQ(stream.push(ids[0]),
            "\xc3"
            "a");
}

// A SentencePiece vocabulary: <unk> <s> </s>, the 256 <0xXX> tokens, then
// pieces with descending scores.
TokenizerVocab sentencepiece_vocab() {
  TokenizerVocab v;
  v.model = "llama";
  v.tokens = {"<unk>", "<s>", "</s>"};
  v.token_type = {2, 3, 3};
  v.scores = {0, 0, 0};
  char name[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    v.tokens.push_back(name);
    v.token_type.push_back(6);
    v.scores.push_back(0);
  }
  const std::vector<std::string> pieces = {"▁h", "ll", "▁he", "▁hell", "▁hello", "ab", "bc", "▁",
                                           "h",  "e",  "l",   "o",     "a",      "b",  "c",  "w"};
  float score = -1;
  for (const std::string& p : pieces) {
    v.tokens.push_back(p);
    v.token_type.push_back(1);
    v.scores.push_back(score--);
  }
  v.unk_id = 0;
  v.bos_id = 1;
  v.eos_id = 2;
  v.add_bos = true;
  return v;
}

TEST(SentencePieceBpe, MergesByScoreWithByteFallback) {
  Tokenizer t(sentencepiece_vocab());
  EXPECT_EQ(pieces(t, t.encode("hello")), (Words{"<s>", "▁hello"}));
  // "ab" scores higher than "bc".
  EXPECT_EQ(pieces(t, t.encode("abc", {.add_special = false})), (Words{"▁", "ab", "c"}));
  // é has no piece: its bytes.
  EXPECT_EQ(pieces(t, t.encode("hello wé", {.add_special = false})),
            (Words{"▁hello", "▁", "w", "<0xC3>", "<0xA9>"}));
  // The dummy-prefix space is dropped only at the very start (as HF's Strip decoder does).
  EXPECT_EQ(t.decode(t.encode("hello wé")), "<s> hello wé");
  EXPECT_EQ(t.decode(t.encode("hello wé"), {.render_special = false}), "hello wé");
}

TEST(SentencePieceBpe, RoundTripsArbitraryBytes) {
  Tokenizer t(sentencepiece_vocab());
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    std::string text(rng() % 30, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 4 == 0 ? ' ' : rng() % 256);
    EXPECT_EQ(t.decode(t.encode(text), {.render_special = false}), text);
  }
}

TEST(SentencePieceBpe, SpecialTokensGetTheDummyPrefixAfter) {
  Tokenizer t(sentencepiece_vocab());
  const auto ids = t.encode("he</s>he", {.add_special = false, .parse_special = true});
  EXPECT_EQ(pieces(t, ids), (Words{"▁he", "</s>", "▁he"}));
  StreamingDecoder stream(t, {.render_special = false});
  std::string streamed;
  for (std::int32_t id : t.encode("hello wé")) streamed += stream.push(id);
  streamed += stream.flush();
  EXPECT_EQ(streamed, "hello wé");
}

// Metaspace's prepend_scheme "first" (Mistral v0.3): a ▁ only at the start of
// the input, and not when it already starts with a space.
TEST(SentencePieceBpe, SpacePrefixOnlyAtTheStart) {
  TokenizerVocab v = sentencepiece_vocab();
  v.space_prefix_after_special = false;
  Tokenizer t(v);
  const EncodeOptions parse{.add_special = false, .parse_special = true};
  EXPECT_EQ(pieces(t, t.encode("he</s>he", parse)), (Words{"▁he", "</s>", "h", "e"}));
  EXPECT_EQ(pieces(t, t.encode(" he", parse)), (Words{"▁he"}));
  EXPECT_EQ(pieces(t, t.encode("</s> he", parse)), (Words{"</s>", "▁he"}));
  Tokenizer every(sentencepiece_vocab());
  EXPECT_EQ(pieces(every, every.encode(" he", parse)), (Words{"▁", "▁he"}));
  EXPECT_EQ(pieces(every, every.encode("</s> he", parse)), (Words{"</s>", "▁", "▁he"}));
}

// Gemma: no dummy prefix, and user-defined whitespace-run tokens ("  ",
// stored with real spaces) are taken whole wherever they occur.
TEST(SentencePieceBpe, GemmaWhitespaceTokensWithoutPrefix) {
  TokenizerVocab v = sentencepiece_vocab();
  v.add_space_prefix = false;
  v.add_bos = true;
  for (const char* run : {"  ", "   "}) {
    v.tokens.push_back(run);
    v.token_type.push_back(4);
    v.scores.push_back(0);
  }
  Tokenizer t(v);
  EXPECT_EQ(pieces(t, t.encode("he     he")), (Words{"<s>", "h", "e", "   ", "  ", "h", "e"}));
  EXPECT_EQ(t.decode(t.encode("he     he")), "<s>he     he");
  EXPECT_FALSE(t.strips_leading_space());
}

// Regression: merges must not produce a control token whose text the
// characters happen to spell ("</s>" from "</" + "s>").
TEST(SentencePieceBpe, TextNeverBecomesAControlToken) {
  TokenizerVocab v = sentencepiece_vocab();
  for (const char* piece : {"<", "/", "s", ">", "</", "s>"}) {
    v.tokens.push_back(piece);
    v.token_type.push_back(1);
    v.scores.push_back(-100.0f - static_cast<float>(v.scores.size()));
  }
  Tokenizer t(v);
  const auto ids = t.encode("</s>", {.add_special = false});
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 0);
  EXPECT_EQ(t.decode(ids, {.render_special = false}), "</s>");
}

template <typename Mutate>
void expect_invalid(Mutate mutate, const std::string& message_part) {
  TokenizerVocab v = byte_level_vocab({"h e"});
  mutate(v);
  try {
    Tokenizer t(v);
    ADD_FAILURE() << "accepted; expected an error containing " << message_part;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(message_part), std::string::npos) << e.what();
  }
}

TEST(TokenizerVocab, ValidationNamesTheField) {
  expect_invalid([](TokenizerVocab& v) { v.model = "bert"; }, "TokenizerVocab.model");
  expect_invalid([](TokenizerVocab& v) { v.pre = "klingon"; }, "TokenizerVocab.pre");
  expect_invalid([](TokenizerVocab& v) { v.scores = {1.0f}; }, "TokenizerVocab.scores");
  expect_invalid([](TokenizerVocab& v) { v.token_type[5] = 9; }, "TokenizerVocab.token_type[5]");
  expect_invalid([](TokenizerVocab& v) { v.bos_id = 100000; }, "TokenizerVocab.bos_id");
  expect_invalid([](TokenizerVocab& v) { v.merges.push_back("h zz"); }, "TokenizerVocab.merges[1]");
  expect_invalid([](TokenizerVocab& v) { v.merges.push_back("hz"); }, "TokenizerVocab.merges[1]");
  expect_invalid([](TokenizerVocab& v) { v.tokens[7] = v.tokens[8]; }, "TokenizerVocab.tokens[8]");
  expect_invalid([](TokenizerVocab& v) { v.tokens[4 + 'q'] = "qq"; }, "no token for byte 0x71");
  expect_invalid([](TokenizerVocab& v) { v.tokens.clear(); }, "TokenizerVocab.tokens");
  expect_invalid([](TokenizerVocab& v) { v.add_eos = true, v.eos_id = -1; },
                 "TokenizerVocab.add_eos");
  TokenizerVocab spm = sentencepiece_vocab();
  spm.scores.clear();
  EXPECT_THROW(Tokenizer{spm}, InvalidArgument);
}

TEST(Tokenizer, RejectsIdsOutsideTheVocabulary) {
  Tokenizer t(byte_level_vocab({}));
  const std::vector<std::int32_t> ids = {5, t.vocab_size()};
  EXPECT_THROW(t.decode(ids), InvalidArgument);
  EXPECT_THROW(t.token_to_piece(-1), InvalidArgument);
}

}  // namespace
}  // namespace pagedattn
