// The overlap checker (see alloc_check.h). It deliberately does not use the
// allocator's internals: owners are found by following src[0] of VIEW/ALIAS
// nodes, lifetimes from the node order and the flags.
#include "alloc_check.h"

#include <algorithm>
#include <climits>
#include <sstream>
#include <unordered_map>
#include "kiln/ext/tensor_node.h"

using namespace kiln;

namespace alloc_test {

namespace {

constexpr uint32_t kKeep = kFlagInput | kFlagOutput | kFlagParam | kFlagLoss | kFlagGradAcc;

TensorNode* resolve(TensorNode* t) {
  while (op_kind(t->op) == OpKind::VIEW || op_kind(t->op) == OpKind::ALIAS) t = t->src[0];
  return t;
}

std::string label(const TensorNode* t) {
  std::ostringstream os;
  os << "#" << t->id << " " << op_name(t->op) << t->shape.str();
  if (!t->name.empty()) os << " '" << t->name << "'";
  return os.str();
}

struct Life {
  int birth = 0, death = 0;
  bool keep = false;
};

}  // namespace

std::string check_overlaps(const Graph& g, const Buffer& buf) {
  const char* lo = static_cast<const char*>(const_cast<Buffer&>(buf).base());
  const char* hi = lo + buf.size();
  const int n = int(g.nodes().size());
  std::unordered_map<TensorNode*, Life> life;
  std::unordered_map<const TensorNode*, int> step;
  for (TensorNode* l : g.leafs()) life[l] = {-1, -1, true};
  for (int k = 0; k < n; ++k) {
    TensorNode* t = g.nodes()[size_t(k)];
    step[t] = k;
    TensorNode* o = resolve(t);
    if (o == t) life[t] = {k, k, false};
    if (o != t && t->data != static_cast<char*>(o->data) + t->view_offs)
      return "view " + label(t) + " does not point into " + label(o) + " at its offset";
  }
  for (int k = 0; k < n; ++k) {
    TensorNode* t = g.nodes()[size_t(k)];
    if (t->flags & kKeep) life[resolve(t)].keep = true;
    for (int i = 0; i < t->n_src; ++i) {
      Life& l = life[resolve(t->src[i])];
      l.death = std::max(l.death, k);
    }
  }
  struct Item {
    TensorNode* t;
    int birth, death;
  };
  std::vector<Item> items;
  for (auto& [t, l] : life) {
    if (!t->data) return "tensor " + label(t) + " has no memory";
    const char* d = static_cast<const char*>(t->data);
    if (t->buffer != &buf) continue;  // pre-allocated elsewhere
    if (d < lo || d + t->nbytes() > hi) return "tensor " + label(t) + " lies outside the buffer";
    items.push_back({t, l.birth, l.keep ? INT_MAX : l.death});
  }
  auto inplace_pair = [&](const Item& src, const Item& dst) {
    TensorNode* t = dst.t;
    if (src.death != dst.birth || !op_can_inplace(t->op) || t->n_src < 1) return false;
    if (resolve(t->src[0]) != src.t || t->src[0]->data != t->data) return false;
    if (!t->src[0]->is_contiguous() || t->src[0]->nbytes() != t->nbytes()) return false;
    for (int i = 1; i < t->n_src; ++i)
      if (resolve(t->src[i]) == src.t) return false;
    return true;
  };
  for (size_t a = 0; a < items.size(); ++a)
    for (size_t b = a + 1; b < items.size(); ++b) {
      const Item &x = items[a], &y = items[b];
      if (x.birth > y.death || y.birth > x.death) continue;  // never live at the same step
      const char *xs = static_cast<const char*>(x.t->data),
                 *ys = static_cast<const char*>(y.t->data);
      if (xs + x.t->nbytes() <= ys || ys + y.t->nbytes() <= xs) continue;
      if (inplace_pair(x, y) || inplace_pair(y, x)) continue;
      std::ostringstream os;
      os << label(x.t) << " live [" << x.birth << ", " << x.death << "] and " << label(y.t)
         << " live [" << y.birth << ", " << y.death << "] overlap in memory";
      return os.str();
    }
  return "";
}

std::vector<uint8_t> bytes_of(Tensor t) {
  std::vector<uint8_t> out;
  auto append = [&](const auto& v) {
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    out.insert(out.end(), p, p + v.size() * sizeof(v[0]));
  };
  switch (t.dtype()) {
    case DType::f32: append(t.get<float>()); break;
    case DType::i32: append(t.get<int32_t>()); break;
    default: append(t.get<uint16_t>()); break;
  }
  return out;
}

}  // namespace alloc_test
