// Byte-level BPE: pre-tokenize, map each byte of a word to its byte-level
// symbol token, then apply merges lowest rank first (leftmost on ties), as
// GPT-2 and Hugging Face `tokenizers` do.
#include <queue>

#include "model/tokenizer_models.h"
#include "model/utf8.h"

namespace pagedattn::tokenizer_detail {

const ByteLevelTable& byte_level_table() {
  static const ByteLevelTable table = [] {
    ByteLevelTable t;
    const auto printable = [](int b) {
      return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next_extra = 0x100;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = printable(b) ? static_cast<char32_t>(b) : next_extra++;
      utf8::append(t.byte_to_text[b], cp);
      t.code_point_to_byte[cp] = static_cast<std::uint8_t>(b);
    }
    return t;
  }();
  return table;
}

ByteLevelBpe::ByteLevelBpe(const TokenizerVocab& vocab, const TokenIndex& index)
    : pre_(pre_tokenizer_from_name(vocab.pre)),
      ignore_merges_(pre_ == PreTokenizer::kLlama3 || pre_ == PreTokenizer::kTekken),
      index_(&index) {
  const ByteLevelTable& table = byte_level_table();
  for (int b = 0; b < 256; ++b) {
    auto it = index.find(table.byte_to_text[b]);
    byte_token_[b] = it != index.end() ? it->second : vocab.unk_id;
  }
  merges_.reserve(vocab.merges.size());
  for (std::size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string& merge = vocab.merges[rank];
    const std::size_t space = merge.find(' ', 1);
    const std::string left = merge.substr(0, space);
    const std::string right = merge.substr(space + 1);
    const std::uint64_t key = (static_cast<std::uint64_t>(index.at(left)) << 32) |
                              static_cast<std::uint32_t>(index.at(right));
    // A repeated pair keeps its first (highest-priority) rank.
    merges_.emplace(key, Merge{static_cast<std::int32_t>(rank), index.at(left + right)});
  }
}

void ByteLevelBpe::encode(std::string_view text, std::vector<std::int32_t>& out) const {
  thread_local std::vector<WordSpan> words;
  thread_local std::string key;
  words.clear();
  pre_tokenize(pre_, text, words);
  for (const WordSpan& w : words) {
    const std::string_view word = text.substr(w.begin, w.end - w.begin);
    if (word.size() > kCachedWordMaxBytes) {
      encode_word(word, out);
      continue;
    }
    key.assign(word);
    {
      std::lock_guard lock(cache_mutex_);
      if (auto it = cache_.find(key); it != cache_.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    const std::size_t first = out.size();
    encode_word(word, out);
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() >= kCacheCapacity) cache_.clear();
    cache_.emplace(key, std::vector<std::int32_t>(out.begin() + first, out.end()));
  }
}

void ByteLevelBpe::encode_word(std::string_view word, std::vector<std::int32_t>& out) const {
  if (ignore_merges_) {
    std::string mapped;
    for (unsigned char b : word) mapped += byte_level_table().byte_to_text[b];
    if (auto it = index_->find(mapped); it != index_->end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Symbols in a doubly linked list; candidate merges in a heap, re-checked
  // when popped (a symbol may have merged since).
  const int n = static_cast<int>(word.size());
  thread_local std::vector<std::int32_t> id, prev, next;
  id.resize(n), prev.resize(n), next.resize(n);
  for (int i = 0; i < n; ++i) {
    id[i] = byte_token_[static_cast<unsigned char>(word[i])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    std::int32_t rank;
    int left;
    std::int32_t left_id, right_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  const auto consider = [&](int left) {
    if (left < 0 || next[left] < 0) return;
    const int right = next[left];
    if (id[left] < 0 || id[right] < 0) return;
    const std::uint64_t key =
        (static_cast<std::uint64_t>(id[left]) << 32) | static_cast<std::uint32_t>(id[right]);
    if (auto it = merges_.find(key); it != merges_.end()) {
      heap.push({it->second.rank, left, id[left], id[right]});
    }
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int right = next[c.left];
    if (id[c.left] != c.left_id || right < 0 || id[right] != c.right_id) continue;  // stale
    const std::uint64_t key =
        (static_cast<std::uint64_t>(c.left_id) << 32) | static_cast<std::uint32_t>(c.right_id);
    id[c.left] = merges_.at(key).result;
    id[right] = -2;  // dead
    next[c.left] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.left;
    consider(prev[c.left]);
    consider(c.left);
  }
  for (int i = 0; i >= 0 && i < n; i = next[i]) {
    if (id[i] >= 0) out.push_back(id[i]);  // -1: a byte with no token and no <unk>
  }
}

std::string ByteLevelBpe::piece(const std::string& token_text) const {
  const ByteLevelTable& table = byte_level_table();
  std::string bytes;
  for (std::size_t pos = 0; pos < token_text.size();) {
    const utf8::CodePoint cp = utf8::decode_at(token_text, pos);
    auto it = cp.valid ? table.code_point_to_byte.find(cp.value) : table.code_point_to_byte.end();
    if (it != table.code_point_to_byte.end()) {
      bytes += static_cast<char>(it->second);
    } else {
      bytes.append(token_text, pos, cp.length);  // not a byte symbol: kept as written
    }
    pos += cp.length;
  }
  return bytes;
}

}  // namespace pagedattn::tokenizer_detail
