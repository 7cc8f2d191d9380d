// SentencePiece-style BPE: spaces become U+2581 ("▁"), a dummy prefix ▁ goes
// in front, characters are merged pairwise choosing the pair whose joined
// text is the highest-scoring token (leftmost on ties), and characters with
// no token fall back to their bytes' <0xXX> tokens.
#include <cstdio>
#include <queue>

#include "model/tokenizer_models.h"
#include "model/utf8.h"

namespace pagedattn::tokenizer_detail {
namespace {
constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581
}  // namespace

SentencePieceBpe::SentencePieceBpe(const TokenizerVocab& vocab, const TokenIndex& index)
    : vocab_(&vocab), index_(&index) {
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto it = index.find(name);
    byte_token_[b] = it != index.end() ? it->second : -1;
  }
}

bool SentencePieceBpe::is_piece(std::int32_t id) const {
  if (vocab_->token_type.empty()) return true;
  const auto type = static_cast<TokenType>(vocab_->token_type[id]);
  return type == TokenType::kNormal || type == TokenType::kUserDefined;
}

void SentencePieceBpe::encode(std::string_view text, bool space_prefix,
                              std::vector<std::int32_t>& out) const {
  if (text.empty()) return;
  std::string normalized;
  normalized.reserve(text.size() + 8);
  if (space_prefix) normalized += kSpaceMarker;
  for (char c : text) {
    if (c == ' ')
      normalized += kSpaceMarker;
    else
      normalized += c;
  }
  // Symbols: [begin, end) byte ranges of `normalized` in a linked list.
  struct Symbol {
    std::size_t begin, end;
    int prev, next;
  };
  std::vector<Symbol> symbols;
  for (std::size_t pos = 0; pos < normalized.size();) {
    const std::size_t length = utf8::decode_at(normalized, pos).length;
    const int i = static_cast<int>(symbols.size());
    symbols.push_back({pos, pos + length, i - 1, i + 1});
    pos += length;
  }
  symbols.back().next = -1;
  struct Candidate {
    float score;
    int left;
    std::size_t length;  // joined length when pushed: stale if the symbols changed
    std::int32_t token;
    bool operator<(const Candidate& o) const {  // max-heap: higher score, then leftmost
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::priority_queue<Candidate> heap;
  const auto consider = [&](int left) {
    if (left < 0 || symbols[left].next < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[l.next];
    auto it = index_->find(normalized.substr(l.begin, r.end - l.begin));
    if (it == index_->end() || !is_piece(it->second)) return;
    heap.push({vocab_->scores[it->second], left, r.end - l.begin, it->second});
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& l = symbols[c.left];
    if (l.end == l.begin || l.next < 0) continue;  // merged away
    Symbol& r = symbols[l.next];
    if (r.end - l.begin != c.length) continue;  // stale: a side grew since
    l.end = r.end;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = c.left;
    r.begin = r.end;  // empty marks it dead
    consider(l.prev);
    consider(c.left);
  }
  for (int i = 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece(normalized.data() + symbols[i].begin,
                                 symbols[i].end - symbols[i].begin);
    if (auto it = index_->find(std::string(piece)); it != index_->end() && is_piece(it->second)) {
      out.push_back(it->second);
      continue;
    }
    for (unsigned char b : piece) {
      const std::int32_t byte_token = byte_token_[b];
      if (byte_token >= 0)
        out.push_back(byte_token);
      else if (vocab_->unk_id >= 0)
        out.push_back(vocab_->unk_id);
    }
  }
}

std::string SentencePieceBpe::piece(std::int32_t id) const {
  const std::string& text = vocab_->tokens[id];
  if (!vocab_->token_type.empty() &&
      vocab_->token_type[id] == static_cast<std::int32_t>(TokenType::kByte)) {
    unsigned value = 0;
    if (std::sscanf(text.c_str(), "<0x%02X>", &value) == 1)
      return std::string(1, static_cast<char>(value));
  }
  std::string out;
  for (std::size_t pos = 0; pos < text.size();) {
    if (text.compare(pos, kSpaceMarker.size(), kSpaceMarker) == 0) {
      out += ' ';
      pos += kSpaceMarker.size();
    } else {
      out += text[pos++];
    }
  }
  return out;
}

}  // namespace pagedattn::tokenizer_detail
