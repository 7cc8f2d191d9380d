// Tokenizer: special-token splitting, BOS/EOS, and dispatch to the model.
#include "pagedattn/tokenizer.h"

#include <algorithm>
#include <optional>
#include <variant>

#include "model/tokenizer_models.h"
#include "model/utf8.h"
#include "pagedattn/errors.h"

namespace pagedattn {
using tokenizer_detail::ByteLevelBpe;
using tokenizer_detail::SentencePieceBpe;

struct Tokenizer::Impl {
  struct ByteRange {
    std::size_t begin;
    std::size_t end;  // exclusive
  };
  TokenizerVocab vocab;
  tokenizer_detail::TokenIndex index;
  // Special tokens by first byte, longest first: control/unknown ones (matched
  // only in text parsed for them) and user-defined ones (always matched).
  struct Special {
    std::string_view text;
    std::int32_t id;
    bool always;
  };
  std::array<std::vector<Special>, 256> specials_by_first_byte;
  std::optional<ByteLevelBpe> byte_level;
  std::optional<SentencePieceBpe> sentencepiece;

  TokenType type(std::int32_t id) const {
    return vocab.token_type.empty() ? TokenType::kNormal
                                    : static_cast<TokenType>(vocab.token_type[id]);
  }
  bool is_special_text(std::int32_t id) const {
    const TokenType t = type(id);
    return t == TokenType::kControl || t == TokenType::kUnknown;
  }
  // `text` starts at byte `offset` of the input; every piece either starts
  // the input or follows a special token.
  void encode_text(std::string_view text, std::size_t offset,
                   std::vector<std::int32_t>& out) const {
    if (byte_level) {
      byte_level->encode(text, out);
      return;
    }
    bool prefix = vocab.add_space_prefix;
    if (prefix && !vocab.space_prefix_after_special) {
      prefix = offset == 0 && !text.starts_with(' ');  // Metaspace, prepend_scheme "first"
    }
    sentencepiece->encode(text, prefix, out);
  }
  // The special token matching at text[pos], longest first; nullptr if none.
  // A control token matches only when it ends by `control_end` (the end of
  // the trusted region holding pos, or 0 outside any).
  const Special* special_at(std::string_view text, std::size_t pos, std::size_t control_end) const {
    for (const Special& s : specials_by_first_byte[static_cast<unsigned char>(text[pos])]) {
      const bool allowed = s.always || pos + s.text.size() <= control_end;
      if (allowed && text.compare(pos, s.text.size(), s.text) == 0) return &s;
    }
    return nullptr;
  }
  // `trusted`: the sorted, disjoint byte ranges of `text` in which control
  // tokens are parsed.
  std::vector<std::int32_t> encode(std::string_view text, std::span<const ByteRange> trusted,
                                   bool add_special) const;
};

std::vector<std::int32_t> Tokenizer::Impl::encode(std::string_view text,
                                                  std::span<const ByteRange> trusted,
                                                  bool add_special) const {
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_special && vocab.add_bos) out.push_back(vocab.bos_id);
  // Text between special tokens goes to the model piece by piece.
  std::size_t piece_begin = 0;
  std::size_t range = 0;  // the first trusted range not wholly before pos
  for (std::size_t pos = 0; pos < text.size();) {
    while (range < trusted.size() && trusted[range].end <= pos) ++range;
    const bool in_trusted = range < trusted.size() && trusted[range].begin <= pos;
    const Special* special = special_at(text, pos, in_trusted ? trusted[range].end : 0);
    if (special == nullptr) {
      ++pos;
      continue;
    }
    encode_text(text.substr(piece_begin, pos - piece_begin), piece_begin, out);
    out.push_back(special->id);
    pos += special->text.size();
    piece_begin = pos;
  }
  encode_text(text.substr(piece_begin), piece_begin, out);
  if (add_special && vocab.add_eos) out.push_back(vocab.eos_id);
  return out;
}

Tokenizer::Tokenizer(TokenizerVocab vocab) : impl_(std::make_unique<Impl>()) {
  validate_tokenizer_vocab(vocab);
  Impl& m = *impl_;
  m.vocab = std::move(vocab);
  m.index.reserve(m.vocab.tokens.size());
  for (std::size_t i = 0; i < m.vocab.tokens.size(); ++i) {
    m.index.emplace(m.vocab.tokens[i], static_cast<std::int32_t>(i));
  }
  for (std::size_t i = 0; i < m.vocab.tokens.size(); ++i) {
    const auto id = static_cast<std::int32_t>(i);
    const std::string& text = m.vocab.tokens[i];
    const bool user_defined = m.type(id) == TokenType::kUserDefined;
    if (text.empty() || !(user_defined || m.is_special_text(id))) continue;
    m.specials_by_first_byte[static_cast<unsigned char>(text[0])].push_back(
        {text, id, user_defined});
  }
  for (auto& list : m.specials_by_first_byte) {
    std::stable_sort(list.begin(), list.end(), [](const Impl::Special& a, const Impl::Special& b) {
      return a.text.size() > b.text.size();
    });
  }
  if (m.vocab.model == "gpt2")
    m.byte_level.emplace(m.vocab, m.index);
  else
    m.sentencepiece.emplace(m.vocab, m.index);
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<std::int32_t> Tokenizer::encode(std::string_view text,
                                            const EncodeOptions& options) const {
  const Impl::ByteRange whole{0, text.size()};
  const std::span<const Impl::ByteRange> trusted =
      options.parse_special ? std::span(&whole, 1) : std::span<const Impl::ByteRange>();
  return impl_->encode(text, trusted, options.add_special);
}

std::vector<std::int32_t> Tokenizer::encode_segments(std::span<const TextSegment> segments,
                                                     const EncodeOptions& options) const {
  std::string text;
  std::vector<Impl::ByteRange> trusted;
  for (const TextSegment& segment : segments) {
    const std::size_t begin = text.size();
    text += segment.text;
    if (!segment.parse_special || segment.text.empty()) continue;
    // Consecutive trusted segments are one range: a token may span them.
    if (!trusted.empty() && trusted.back().end == begin) {
      trusted.back().end = text.size();
    } else {
      trusted.push_back({begin, text.size()});
    }
  }
  return impl_->encode(text, trusted, options.add_special);
}

std::string Tokenizer::token_to_piece(std::int32_t id, const DecodeOptions& options) const {
  const Impl& m = *impl_;
  require(id >= 0 && id < vocab_size(), "Tokenizer::token_to_piece: id ", id, " is outside [0, ",
          vocab_size(), ")");
  if (m.is_special_text(id)) return options.render_special ? m.vocab.tokens[id] : std::string();
  if (m.type(id) == TokenType::kUserDefined) return m.vocab.tokens[id];
  return m.byte_level ? m.byte_level->piece(m.vocab.tokens[id]) : m.sentencepiece->piece(id);
}

bool Tokenizer::strips_leading_space() const {
  return impl_->sentencepiece.has_value() && impl_->vocab.add_space_prefix;
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids,
                              const DecodeOptions& options) const {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    require(ids[i] >= 0 && ids[i] < vocab_size(), "Tokenizer::decode: ids[", i, "] = ", ids[i],
            " is outside [0, ", vocab_size(), ")");
  }
  std::string out;
  for (std::int32_t id : ids) out += token_to_piece(id, options);
  // SentencePiece: the dummy prefix added at encoding goes away.
  if (strips_leading_space() && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

const TokenizerVocab& Tokenizer::vocab() const {
  return impl_->vocab;
}
std::int32_t Tokenizer::vocab_size() const {
  return static_cast<std::int32_t>(impl_->vocab.tokens.size());
}
std::int32_t Tokenizer::bos_id() const {
  return impl_->vocab.bos_id;
}
std::int32_t Tokenizer::eos_id() const {
  return impl_->vocab.eos_id;
}
bool Tokenizer::is_control(std::int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->is_special_text(id);
}
std::int32_t Tokenizer::token_id(std::string_view token_text) const {
  auto it = impl_->index.find(std::string(token_text));
  return it == impl_->index.end() ? -1 : it->second;
}

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, DecodeOptions options)
    : tokenizer_(&tokenizer), options_(options) {}

std::string StreamingDecoder::push(std::int32_t id) {
  pending_ += tokenizer_->token_to_piece(id, options_);
  if (at_start_ && !pending_.empty()) {
    at_start_ = false;
    if (tokenizer_->strips_leading_space() && pending_[0] == ' ') pending_.erase(0, 1);
  }
  const std::size_t complete = utf8::complete_prefix_length(pending_);
  std::string ready = pending_.substr(0, complete);
  pending_.erase(0, complete);
  return ready;
}

std::string StreamingDecoder::flush() {
  std::string rest = std::move(pending_);
  pending_.clear();
  at_start_ = true;
  return rest;
}

}  // namespace pagedattn
