#include "model/pretokenizer.h"

#include <unicode/uchar.h>

#include <array>
#include <string>

#include "model/utf8.h"
#include "pagedattn/errors.h"

namespace pagedattn::tokenizer_detail {
namespace {

enum class CharClass : std::uint8_t { kLetter, kNumber, kSpace, kOther };

// Letter case and marks, for the tekken expression's classes.
enum CaseBits : std::uint8_t {
  kUpperish = 1,  // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
  kLowerish = 2,  // [\p{Ll}\p{Lm}\p{Lo}\p{M}]
};

struct Char {
  std::size_t offset;  // byte offset of the character in the text
  char32_t value;      // code point (the raw byte for invalid UTF-8)
  CharClass cls;
  std::uint8_t case_bits;  // CaseBits
};

std::uint8_t case_bits_of(char32_t cp) {
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_UPPERCASE_LETTER:
    case U_TITLECASE_LETTER:
      return kUpperish;
    case U_LOWERCASE_LETTER:
      return kLowerish;
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
      return kUpperish | kLowerish;
    default:
      return 0;
  }
}

CharClass classify_code_point(char32_t cp) {
  // \s in the reference engines is Unicode White_Space; \p{L}, \p{N} the general categories.
  if (u_isUWhiteSpace(static_cast<UChar32>(cp))) return CharClass::kSpace;
  switch (u_charType(static_cast<UChar32>(cp))) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return CharClass::kLetter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return CharClass::kNumber;
    default:
      return CharClass::kOther;
  }
}

const std::array<CharClass, 128>& ascii_classes() {
  static const std::array<CharClass, 128> table = [] {
    std::array<CharClass, 128> t{};
    for (char32_t c = 0; c < 128; ++c) t[c] = classify_code_point(c);
    return t;
  }();
  return table;
}

// `with_case`: also fill Char::case_bits (only the tekken scanner reads them).
void decode_chars(std::string_view text, std::vector<Char>& chars, bool with_case) {
  const auto& ascii = ascii_classes();
  chars.clear();
  for (std::size_t pos = 0; pos < text.size();) {
    const utf8::CodePoint cp = utf8::decode_at(text, pos);
    CharClass cls = CharClass::kOther;
    std::uint8_t case_bits = 0;
    if (cp.valid) {
      cls = cp.value < 128 ? ascii[cp.value] : classify_code_point(cp.value);
      if (with_case) {
        if (cp.value < 128)
          case_bits = (cp.value >= U'A' && cp.value <= U'Z')   ? kUpperish
                      : (cp.value >= U'a' && cp.value <= U'z') ? kLowerish
                                                               : 0;
        else
          case_bits = case_bits_of(cp.value);
      }
    }
    chars.push_back({pos, cp.valid ? cp.value : 0xFFFFFFFFu, cls, case_bits});
    pos += cp.length;
  }
}

// Scans chars[begin, end) (one regex "subject") and returns where the word
// starting at `i` ends.
class Scanner {
 public:
  Scanner(const std::vector<Char>& chars, std::size_t end) : c_(chars), end_(end) {}

  std::size_t gpt2_word(std::size_t i) const {
    if (std::size_t n = contraction(i, /*ignore_case=*/false)) return i + n;
    const bool space_prefix = at(i) == U' ' && i + 1 < end_;
    for (CharClass cls : {CharClass::kLetter, CharClass::kNumber, CharClass::kOther}) {
      if (is(i, cls)) return run(i, cls);
      if (space_prefix && is(i + 1, cls)) return run(i + 1, cls);
    }
    return whitespace_word(i, /*newline_rule=*/false);
  }

  std::size_t llama3_word(std::size_t i, std::size_t max_digits, bool fold_long_s) const {
    if (std::size_t n = contraction(i, /*ignore_case=*/true, fold_long_s)) return i + n;
    if (is(i, CharClass::kLetter)) return run(i, CharClass::kLetter);
    if (!is(i, CharClass::kNumber) && !is_newline(i) && is(i + 1, CharClass::kLetter)) {
      return run(i + 1, CharClass::kLetter);
    }
    if (is(i, CharClass::kNumber)) {
      std::size_t j = i;
      while (j < end_ && j - i < max_digits && is(j, CharClass::kNumber)) ++j;
      return j;
    }
    std::size_t other_start = 0;
    if (is(i, CharClass::kOther))
      other_start = i;
    else if (at(i) == U' ' && is(i + 1, CharClass::kOther))
      other_start = i + 1;
    else
      return whitespace_word(i, /*newline_rule=*/true);
    std::size_t j = run(other_start, CharClass::kOther);
    while (j < end_ && is_newline(j)) ++j;
    return j;
  }

  std::size_t tekken_word(std::size_t i) const {
    // The first two alternatives, each with its optional prefix tried first.
    const bool prefix =
        i < end_ && !is(i, CharClass::kLetter) && !is(i, CharClass::kNumber) && !is_newline(i);
    if (prefix) {
      if (std::size_t e = upper_then_lower(i + 1); e != kNone) return e;
    }
    if (std::size_t e = upper_then_lower(i); e != kNone) return e;
    if (prefix && has_case(i + 1, kUpperish))
      return case_run(case_run(i + 1, kUpperish), kLowerish);
    if (has_case(i, kUpperish)) return case_run(case_run(i, kUpperish), kLowerish);
    if (is(i, CharClass::kNumber)) return i + 1;
    std::size_t other_start = 0;
    if (is(i, CharClass::kOther))
      other_start = i;
    else if (at(i) == U' ' && is(i + 1, CharClass::kOther))
      other_start = i + 1;
    else
      return whitespace_word(i, /*newline_rule=*/true);
    std::size_t j = run(other_start, CharClass::kOther);
    while (j < end_ && (is_newline(j) || at(j) == U'/')) ++j;
    return j;
  }

 private:
  char32_t at(std::size_t i) const { return i < end_ ? c_[i].value : 0xFFFFFFFFu; }
  bool is(std::size_t i, CharClass cls) const { return i < end_ && c_[i].cls == cls; }
  bool is_newline(std::size_t i) const { return at(i) == U'\r' || at(i) == U'\n'; }
  std::size_t run(std::size_t i, CharClass cls) const {
    while (is(i, cls)) ++i;
    return i;
  }
  static constexpr std::size_t kNone = static_cast<std::size_t>(-1);
  bool has_case(std::size_t i, std::uint8_t bits) const {
    return i < end_ && (c_[i].case_bits & bits) != 0;
  }
  std::size_t case_run(std::size_t i, std::uint8_t bits) const {
    while (has_case(i, bits)) ++i;
    return i;
  }
  // U*l+ at i as a backtracking engine matches it: U* greedy, then given back
  // one character at a time until l+ matches; kNone when it cannot.
  std::size_t upper_then_lower(std::size_t i) const {
    const std::size_t k = case_run(i, kUpperish);
    for (std::size_t j = k + 1; j-- > i;) {
      if (has_case(j, kLowerish)) return case_run(j, kLowerish);
    }
    return kNone;
  }

  // Length of 's|'t|'re|'ve|'m|'ll|'d at i, 0 when none.
  std::size_t contraction(std::size_t i, bool ignore_case, bool fold_long_s = false) const {
    if (at(i) != U'\'') return 0;
    const auto lower = [&](std::size_t k) -> char32_t {
      char32_t v = at(k);
      if (!ignore_case) return v;
      if (v >= U'A' && v <= U'Z') return v - U'A' + U'a';
      if (fold_long_s && v == U'\u017F') return U's';  // simple case folding of ſ
      return v;
    };
    const char32_t a = lower(i + 1);
    if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
    const char32_t b = lower(i + 2);
    if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
    return 0;
  }

  // \s*[\r\n]+ (when newline_rule) | \s+(?!\S) | \s+ at a whitespace char.
  std::size_t whitespace_word(std::size_t i, bool newline_rule) const {
    std::size_t j = run(i, CharClass::kSpace);
    if (newline_rule) {
      for (std::size_t k = j; k > i; --k) {
        if (is_newline(k - 1)) return k;
      }
    }
    if (j == end_ || j - i == 1) return j;
    return j - 1;  // leave the last space to prefix the next word
  }

  const std::vector<Char>& c_;
  std::size_t end_;
};

}  // namespace

PreTokenizer pre_tokenizer_from_name(std::string_view name) {
  if (name == "default" || name == "gpt2" || name == "gpt-2" || name == "mpt" || name == "olmo") {
    return PreTokenizer::kGpt2;
  }
  if (name == "smollm" || name == "starcoder" || name == "refact" || name == "codeshell") {
    return PreTokenizer::kSmolLm;
  }
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3" || name == "dbrx" ||
      name == "smaug-bpe") {
    return PreTokenizer::kLlama3;
  }
  if (name == "qwen2" || name == "stablelm2" || name == "deepseek-r1-qwen") {
    return PreTokenizer::kQwen2;
  }
  if (name == "tekken") return PreTokenizer::kTekken;
  throw InvalidArgument(detail::concat(
      "TokenizerVocab.pre: unsupported pre-tokenizer \"", name,
      "\" (known: default, gpt2, smollm, starcoder, llama-bpe, qwen2, tekken, ...)"));
}

void pre_tokenize(PreTokenizer kind, std::string_view text, std::vector<WordSpan>& words) {
  thread_local std::vector<Char> chars;
  decode_chars(text, chars, kind == PreTokenizer::kTekken);
  const auto offset = [&](std::size_t i) {
    return i < chars.size() ? chars[i].offset : text.size();
  };
  const auto scan = [&](std::size_t begin, std::size_t end) {
    const Scanner scanner(chars, end);
    for (std::size_t i = begin; i < end;) {
      std::size_t j = 0;
      switch (kind) {
        case PreTokenizer::kGpt2:
        case PreTokenizer::kSmolLm:
          j = scanner.gpt2_word(i);
          break;
        case PreTokenizer::kLlama3:
          j = scanner.llama3_word(i, 3, /*fold_long_s=*/true);
          break;
        case PreTokenizer::kQwen2:
          j = scanner.llama3_word(i, 1, /*fold_long_s=*/true);
          break;
        case PreTokenizer::kTekken:
          j = scanner.tekken_word(i);
          break;
      }
      words.push_back({offset(i), offset(j)});
      i = j;
    }
  };
  if (kind != PreTokenizer::kSmolLm) {
    scan(0, chars.size());
    return;
  }
  // Digits(individual_digits) first: each number character is a word alone and
  // splits the text into separately scanned pieces.
  std::size_t piece = 0;
  for (std::size_t i = 0; i < chars.size(); ++i) {
    if (chars[i].cls != CharClass::kNumber) continue;
    scan(piece, i);
    words.push_back({offset(i), offset(i + 1)});
    piece = i + 1;
  }
  scan(piece, chars.size());
}

}  // namespace pagedattn::tokenizer_detail
