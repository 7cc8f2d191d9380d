#include "support/shadow_model.h"

#include <algorithm>
#include <set>
#include <stdexcept>

namespace pagedattn::test {

namespace {

void model_require(bool ok, const char* what) {
  if (!ok) throw std::logic_error(std::string("ShadowModel misuse: ") + what);
}

}  // namespace

std::int64_t ShadowModel::total_length() const {
  std::int64_t total = 0;
  for (const auto& [id, s] : seqs_) total += s.length();
  return total;
}

std::int32_t ShadowModel::refcount(std::int64_t page_id) const {
  auto it = refs_.find(page_id);
  return it == refs_.end() ? 0 : it->second;
}

std::int64_t ShadowModel::new_page() {
  refs_[next_page_id_] = 1;
  return next_page_id_++;
}

void ShadowModel::release(std::int64_t page_id) {
  auto it = refs_.find(page_id);
  model_require(it != refs_.end(), "release of a free page");
  if (--it->second == 0) refs_.erase(it);
}

void ShadowModel::drop_empty_pages(Seq& s) {
  std::set<std::int64_t> used;
  for (const Token& t : s.tokens) used.insert(t.abs_slot / page_size_);
  std::vector<Page> kept;
  for (const Page& p : s.pages) {
    if (used.contains(p.abs_page))
      kept.push_back(p);
    else
      release(p.id);
  }
  s.pages = std::move(kept);
}

std::int64_t ShadowModel::page_index(const Seq& s, std::int64_t abs_page) const {
  auto it = std::lower_bound(s.pages.begin(), s.pages.end(), abs_page,
                             [](const Page& p, std::int64_t a) { return p.abs_page < a; });
  model_require(it != s.pages.end() && it->abs_page == abs_page, "token without a page");
  return it - s.pages.begin();
}

void ShadowModel::add(SeqId id) {
  model_require(!has(id), "add of an existing id");
  seqs_.emplace(id, Seq{});
}

void ShadowModel::remove(SeqId id) {
  for (const Page& p : seqs_.at(id).pages) release(p.id);
  seqs_.erase(id);
}

void ShadowModel::fork(SeqId parent_id, SeqId child_id, std::int64_t fork_pos) {
  const Seq& parent = seqs_.at(parent_id);
  model_require(!has(child_id), "bad fork");
  model_require(fork_pos >= 0 && fork_pos <= parent.length(), "bad fork_pos");
  Seq child;  // no window; past a windowed parent's sinks it keeps their gap
  child.tokens.assign(parent.tokens.begin(), parent.tokens.begin() + fork_pos);
  if (parent.evicted && fork_pos > parent.sink) {
    child.evicted = true;
    child.sink = parent.sink;
    ++counters_.gap_forks;
  }
  const std::int64_t end_slot = child.next_abs_slot();
  for (const Page& p : parent.pages) {
    if (p.abs_page >= end_slot / page_size_) break;
    child.pages.push_back(p);
    ++refs_[p.id];
  }
  if (end_slot % page_size_ != 0) {
    child.pages.push_back(Page{end_slot / page_size_, new_page()});
    ++counters_.fork_copies;
  }
  seqs_.emplace(child_id, std::move(child));
}

void ShadowModel::pop(SeqId id, std::int64_t n) {
  Seq& s = seqs_.at(id);
  model_require(n >= 0 && n <= s.poppable(), "bad pop");
  if (s.evicted && n > 0) ++counters_.pops_after_eviction;
  s.tokens.resize(static_cast<std::size_t>(s.length() - n));
  drop_empty_pages(s);
}

void ShadowModel::append(SeqId id, std::span<const std::uint64_t> uids) {
  Seq& s = seqs_.at(id);
  if (uids.empty()) return;
  std::int64_t slot = s.next_abs_slot();
  if (slot % page_size_ != 0) {  // the last page is partial: copy it first if shared
    Page& last = s.pages.back();
    model_require(last.abs_page == slot / page_size_, "partial page is not the last");
    if (refcount(last.id) > 1) {
      release(last.id);
      last.id = new_page();
      ++counters_.copies_on_write;
    }
  }
  for (std::uint64_t uid : uids) {
    if (slot % page_size_ == 0) s.pages.push_back(Page{slot / page_size_, new_page()});
    s.tokens.push_back(Token{uid, slot++});
  }
}

void ShadowModel::slide(SeqId id) {
  Seq& s = seqs_.at(id);
  if (s.window == 0 || s.length() <= s.window) return;
  const auto first = s.tokens.begin() + s.sink;
  counters_.evicted_tokens += s.length() - s.window;
  s.tokens.erase(first, first + (s.length() - s.window));
  s.evicted = true;
  drop_empty_pages(s);
}

void ShadowModel::enable_window(SeqId id, std::int64_t window, std::int64_t sink) {
  Seq& s = seqs_.at(id);
  model_require(s.window == 0 && !s.evicted && window >= 1 && sink >= 0 && sink < window,
                "bad window");
  s.window = window;
  s.sink = sink;
  slide(id);
}

void ShadowModel::overwrite(SeqId id, std::int64_t start, std::span<const std::uint64_t> uids) {
  Seq& s = seqs_.at(id);
  for (std::size_t i = 0; i < uids.size(); ++i)
    s.tokens.at(static_cast<std::size_t>(start) + i).uid = uids[i];
}

std::int64_t ShadowModel::append_cost(std::span<const SeqId> ids,
                                      std::span<const std::int64_t> lens) const {
  ShadowModel after = *this;
  for (std::size_t i = 0; i < ids.size(); ++i)
    after.append(ids[i], std::vector<std::uint64_t>(static_cast<std::size_t>(lens[i]), 0));
  return after.pages_in_use() - pages_in_use();
}

std::int64_t ShadowModel::physical_slot(SeqId id, std::int64_t token) const {
  const Seq& s = seq(id);
  const std::int64_t abs = s.tokens.at(static_cast<std::size_t>(token)).abs_slot;
  return page_index(s, abs / page_size_) * page_size_ + abs % page_size_;
}

std::int64_t ShadowModel::gap(SeqId id) const {
  const Seq& s = seq(id);
  return s.length() > s.sink ? physical_slot(id, s.sink) - s.sink : 0;
}

bool ShadowModel::token_in_shared_page(SeqId id, std::int64_t token) const {
  const Seq& s = seq(id);
  const std::int64_t abs = s.tokens.at(static_cast<std::size_t>(token)).abs_slot;
  return refcount(s.pages[static_cast<std::size_t>(page_index(s, abs / page_size_))].id) > 1;
}

std::vector<std::uint64_t> ShadowModel::uids(SeqId id, std::int64_t start, std::int64_t end) const {
  const Seq& s = seq(id);
  std::vector<std::uint64_t> out;
  for (std::int64_t t = start; t < end; ++t)
    out.push_back(s.tokens.at(static_cast<std::size_t>(t)).uid);
  return out;
}

}  // namespace pagedattn::test
