// llama.cpp's quantization recipes ("file types" of llama-quantize: Q4_K_M, Q6_K,
// ...): which type each tensor of a model gets. The rules are those of
// llama.cpp's src/llama-quant.cpp (llama_tensor_get_type and its helpers) as of
// the llama.cpp that node-llama-cpp 3.21.1 ships, restated for the tensors kiln
// writes (dense Llama-family and GPT-2 models: no experts, no Falcon, no
// importance matrix, no overrides).
#include <algorithm>
#include <cstdio>
#include <numeric>

#include "kiln/error.h"
#include "kiln/models.h"

namespace kiln::models {
namespace {

// One recipe: its name, llama.cpp's file type number (general.file_type) and
// the block type most matrices get.
struct Recipe {
  const char* name;
  uint32_t file_type;
  DType base;
};

constexpr Recipe kRecipes[] = {
    {"q2_k", 10, q2_k},   {"q3_k_m", 12, q3_k}, {"q4_0", 2, q4_0},  {"q4_1", 3, q4_1},
    {"q4_k_s", 14, q4_k}, {"q4_k_m", 15, q4_k}, {"q5_0", 8, q5_0},  {"q5_1", 9, q5_1},
    {"q5_k_s", 16, q5_k}, {"q5_k_m", 17, q5_k}, {"q6_k", 18, q6_k}, {"q8_0", 7, q8_0},
};

const Recipe& recipe_named(std::string_view name) {
  for (const Recipe& r : kRecipes)
    if (name == r.name) return r;
  std::string known;
  for (const Recipe& r : kRecipes) known += std::string(known.empty() ? "" : ", ") + r.name;
  fail("models", "unknown quantization recipe '", name, "' (known: ", known, ")");
}

// What llama.cpp treats alike (its tensor categories), from the GGUF name.
enum class Role { output, token_embd, attn_v, attn_output, ffn_down, other };

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
bool contains(const std::string& s, std::string_view part) {
  return s.find(part) != std::string::npos;
}

Role role_of(const std::string& name) {
  if (name == "output.weight") return Role::output;
  if (name == "token_embd.weight") return Role::token_embd;
  // GPT-2's fused q/k/v counts as attn_v (llama.cpp's category_is_attn_v).
  if (contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight")) return Role::attn_v;
  if (contains(name, "attn_output.weight")) return Role::attn_output;
  if (contains(name, "ffn_down")) return Role::ffn_down;
  return Role::other;
}

// Quantized at all: matrices named *weight, except norms and position
// embeddings; 1-D tensors (norms, biases, rope_freqs) are kept as they are.
bool quantized_at_all(const RecipeTensor& t) {
  return t.shape.ndim() >= 2 && ends_with(t.name, "weight") && !contains(t.name, "_norm.weight") &&
         t.name != "position_embd.weight" && t.name != "token_types.weight";
}

// llama.cpp's "use more bits" layers: the first and last eighth, and every
// third layer in between.
bool use_more_bits(int64_t i, int64_t n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

// The type a recipe picks for a tensor before the row-length fallback. `i`:
// the tensor's index among its role's tensors (layer order), `n`: their count
// (attn_v) or the layer count (ffn_down).
DType pick(const Recipe& r, Role role, const RecipeTensor& t, const RecipeModel& m, int64_t i,
           int64_t n) {
  const std::string_view R = r.name;
  const DType base = r.base;
  switch (role) {
    case Role::output:
      // The head (and a tied embedding, which is the head): Q8_0 when its rows
      // are not whole blocks of the recipe's type, else at least Q6_K.
      if (t.shape[t.shape.ndim() - 1] % dtype_block_elems(base) != 0) return q8_0;
      return base == q8_0 ? q8_0 : q6_k;
    case Role::token_embd: return base;  // an untied embedding: the recipe's type
    case Role::attn_v: {
      DType v = base;
      if (R == "q2_k") v = m.n_gqa >= 4 ? q4_k : q3_k;  // grouped-query v is small
      else if (R == "q3_k_m") v = i < 2 ? q5_k : q4_k;  // the first two layers more
      else if ((R == "q4_k_m" || R == "q5_k_m") && use_more_bits(i, n)) v = q6_k;
      else if (R == "q4_k_s" && i < 4) v = q5_k;           // the first four layers
      if (m.is_70b && (v == q3_k || v == q4_k)) v = q5_k;  // 70B: v is 8x smaller than q
      return v;
    }
    case Role::ffn_down:
      if (R == "q2_k") return q3_k;
      if (R == "q3_k_m") return i < n / 16 ? q5_k : q4_k;
      if ((R == "q4_k_m" || R == "q5_k_m") && use_more_bits(i, n)) return q6_k;
      if (R == "q4_k_s" && i < n / 8) return q5_k;
      return base;
    case Role::attn_output:
      if (R == "q2_k") return q3_k;
      if (R == "q3_k_m") return q4_k;
      return base;
    case Role::other: return base;
  }
  return base;
}

// A row that is not whole blocks of the picked type: the k-quants fall back to
// a 32-value type of about as many bits (Q2_K and Q3_K to Q4_0, Q4_K to Q5_0,
// Q5_K to Q5_1, Q6_K to Q8_0); a row that is not whole blocks of 32 either is
// stored F16.
DType fall_back(DType picked, int64_t row) {
  if (row % dtype_block_elems(picked) == 0) return picked;
  DType t = picked;
  if (picked == q2_k || picked == q3_k) t = q4_0;
  else if (picked == q4_k) t = q5_0;
  else if (picked == q5_k) t = q5_1;
  else if (picked == q6_k) t = q8_0;
  return row % dtype_block_elems(t) == 0 ? t : f16;
}

// llama.cpp's order of tensors (its loader's map): by layer number ("blk.N.";
// others first), then by name. The role counters advance in this order.
int64_t layer_of(const std::string& name) {
  int layer = -1;
  std::sscanf(name.c_str(), "blk.%d.", &layer);
  return layer;
}

}  // namespace

std::vector<std::string> quant_recipe_names() {
  std::vector<std::string> out;
  for (const Recipe& r : kRecipes) out.emplace_back(r.name);
  return out;
}

bool is_quant_recipe(std::string_view name) {
  for (const Recipe& r : kRecipes)
    if (name == r.name) return true;
  return false;
}

uint32_t quant_recipe_file_type(std::string_view recipe) { return recipe_named(recipe).file_type; }

DType quant_recipe_base_type(std::string_view recipe) { return recipe_named(recipe).base; }

std::vector<DType> quant_recipe_types(std::string_view recipe, const RecipeModel& model,
                                      const std::vector<RecipeTensor>& tensors) {
  const Recipe& r = recipe_named(recipe);
  // Tied when there is no output tensor: the embedding is then the head.
  const bool tied = std::none_of(tensors.begin(), tensors.end(),
                                 [](const RecipeTensor& t) { return t.name == "output.weight"; });
  std::vector<size_t> order(tensors.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const int64_t la = layer_of(tensors[a].name), lb = layer_of(tensors[b].name);
    return la != lb ? la < lb : tensors[a].name < tensors[b].name;
  });
  int64_t n_attn_v = 0;
  for (const RecipeTensor& t : tensors) n_attn_v += role_of(t.name) == Role::attn_v;
  int64_t i_attn_v = 0, i_ffn_down = 0;
  std::vector<DType> out(tensors.size(), f32);
  for (size_t k : order) {
    const RecipeTensor& t = tensors[k];
    if (!quantized_at_all(t)) continue;  // kept f32
    Role role = role_of(t.name);
    if (role == Role::token_embd && tied) role = Role::output;
    int64_t i = 0, n = 0;
    if (role == Role::attn_v) i = i_attn_v++, n = n_attn_v;
    if (role == Role::ffn_down) i = i_ffn_down++, n = model.n_layer;
    out[k] = fall_back(pick(r, role, t, model, i, n), t.shape[t.shape.ndim() - 1]);
  }
  return out;
}

}  // namespace kiln::models
