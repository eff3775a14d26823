// The BPE model: a word's units (bytes or characters) merged pair by pair, the
// lowest merge rank first and the leftmost of equal ranks first (Hugging Face
// tokenizers' BPE::merge_word), with a per-thread cache of recent words.
#include <queue>

#include "tokenizer/model.h"
#include "tokenizer/utf8.h"

namespace kiln::tok {

void MergeTable::build(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap *= 2;
  slots.assign(cap, Slot{});
  mask = cap - 1;
  shift = 64 - __builtin_ctzll(cap);
}

void MergeTable::insert(int32_t a, int32_t b, int32_t rank, int32_t id) {
  uint64_t key = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  for (uint64_t i = slot_of(key);; i = (i + 1) & mask) {
    Slot& s = slots[i];
    if (s.key == key) return;  // a repeated merge keeps its first (lowest) rank
    if (s.key == ~uint64_t(0)) {
      s = {key, rank, id};
      return;
    }
  }
}

namespace {

// Words shorter than this are cached; longer ones (a SentencePiece-style
// section is one word) are rarely seen twice.
constexpr size_t kMaxCachedWord = 256;
constexpr size_t kMaxCachedIds = size_t(1) << 22;

struct WordCache {
  uint64_t owner = 0;
  FlatMap index;  // word -> (offset into ids) << 32 | count
  std::vector<int32_t> ids;
};

WordCache& word_cache(uint64_t serial) {
  thread_local WordCache c;
  if (c.owner != serial || c.ids.size() > kMaxCachedIds) {
    c.owner = serial;
    c.index.clear();
    c.ids.clear();
  }
  return c;
}

}  // namespace

int32_t Bpe::whole_word(std::string_view piece) const {
  return int32_t(byte_level ? vocab->get(byte_level_encode(piece)) : vocab->get(piece));
}

void Bpe::tokenize(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (piece.size() >= kMaxCachedWord) {
    int32_t id = ignore_merges ? whole_word(piece) : -1;
    if (id >= 0) out.push_back(id);
    else merge_word(piece, out);
    return;
  }
  WordCache& c = word_cache(serial);
  int64_t hit = c.index.get(piece);
  if (hit >= 0) {
    auto first = c.ids.begin() + (hit >> 32);
    out.insert(out.end(), first, first + (hit & 0xFFFFFFFF));
    return;
  }
  size_t before = out.size();
  int32_t id = ignore_merges ? whole_word(piece) : -1;
  if (id >= 0) out.push_back(id);
  else merge_word(piece, out);
  auto start = int64_t(c.ids.size());
  c.ids.insert(c.ids.end(), out.begin() + before, out.end());
  c.index.put(piece, (start << 32) | int64_t(out.size() - before));
}

void Bpe::merge_word(std::string_view piece, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id, prev, next;
  };
  std::vector<Sym> sym;
  sym.reserve(piece.size());
  auto push = [&](int32_t id) {
    int32_t k = int32_t(sym.size());
    sym.push_back({id, k - 1, -1});
    if (k > 0) sym[k - 1].next = k;
  };
  for (size_t i = 0; i < piece.size();) {
    size_t n = byte_level ? 1 : utf8_len(static_cast<unsigned char>(piece[i]));
    if (i + n > piece.size()) n = piece.size() - i;
    int32_t id = -1;
    if (byte_level) {
      id = byte_id[static_cast<unsigned char>(piece[i])];
    } else {
      id = int32_t(vocab->get(piece.substr(i, n)));
    }
    if (id < 0 && byte_fallback) {
      bool all = true;
      for (size_t k = i; k < i + n; ++k)
        all = all && fallback_id[static_cast<unsigned char>(piece[k])] >= 0;
      if (all) {
        for (size_t k = i; k < i + n; ++k) push(fallback_id[static_cast<unsigned char>(piece[k])]);
        i += n;
        continue;
      }
    }
    if (id < 0) {
      i += n;
      if (unk_id < 0) continue;  // no unknown token: the unit is dropped, as the reference does
      if (fuse_unk && !sym.empty() && sym.back().id == unk_id) continue;
      id = unk_id;
    }
    push(id);
    i += n;
  }

  struct Cand {
    int32_t rank, pos, left, right, id;
    bool operator<(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand> heap;
  auto consider = [&](int32_t pos) {
    int32_t nx = sym[pos].next;
    if (nx < 0) return;
    if (const MergeTable::Slot* m = merges.find(sym[pos].id, sym[nx].id))
      heap.push({m->rank, pos, sym[pos].id, sym[nx].id, m->id});
  };
  for (int32_t k = 0; k + 1 < int32_t(sym.size()); ++k) consider(k);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    Sym& s = sym[c.pos];
    // Stale: the left symbol was merged away or changed, or its right neighbour did.
    if (s.id != c.left || s.next < 0 || sym[s.next].id != c.right) continue;
    int32_t nx = s.next;
    s.id = c.id;
    s.next = sym[nx].next;
    if (s.next >= 0) sym[s.next].prev = c.pos;
    sym[nx].id = -1;  // dead
    if (s.prev >= 0) consider(s.prev);
    consider(c.pos);
  }
  for (int32_t k = sym.empty() ? -1 : 0; k >= 0; k = sym[k].next) out.push_back(sym[k].id);
}

}  // namespace kiln::tok
