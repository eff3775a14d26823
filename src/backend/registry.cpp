// The backend registry (kiln/registry.h). It starts from detail::builtin_backends(),
// which the backends layer defines (src/backends/builtin_backends.cpp): the list is
// explicit rather than each backend registering itself from a static initialiser,
// which a static libkiln.a would drop at link time, and this layer names no
// concrete backend.
#include "kiln/ext/registry.h"

#include <algorithm>
#include <cctype>
#include <mutex>

namespace kiln {

namespace {

std::string lower(std::string_view s) {
  std::string r(s);
  for (char& c : r) c = char(std::tolower(static_cast<unsigned char>(c)));
  return r;
}

struct Registry {
  std::mutex mu;
  std::vector<BackendInfo> list;  // most preferred first

  Registry() : list(detail::builtin_backends()) {}
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string joined_names(const std::vector<BackendInfo>& list) {
  std::string s;
  for (const BackendInfo& b : list) s += (s.empty() ? "" : ", ") + b.name;
  return s;
}

}  // namespace

std::vector<BackendInfo> backend_list() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.list;
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const BackendInfo& b : backend_list()) names.push_back(b.name);
  return names;
}

bool has_backend(std::string_view name) {
  const std::string want = lower(name);
  for (const BackendInfo& b : backend_list())
    if (lower(b.name) == want) return true;
  return false;
}

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& opt) {
  const std::vector<BackendInfo> list = backend_list();
  const std::string want = lower(name);
  for (const BackendInfo& b : list)
    if (lower(b.name) == want) return b.make(opt);
  const std::string why = detail::builtin_unavailable_reason(want);
  if (!why.empty())
    fail("make_backend", "backend '", name, "' is not available: ", why,
         " (available: ", joined_names(list), ")");
  fail("make_backend", "unknown backend '", name, "' (available: ", joined_names(list), ")");
}

std::vector<std::unique_ptr<Backend>> make_backends(const std::vector<std::string>& names,
                                                    const BackendOptions& opt) {
  if (names.empty()) fail("make_backends", "no backend names given");
  std::vector<std::unique_ptr<Backend>> out;
  bool host = false;
  for (const std::string& n : names) {
    out.push_back(make_backend(n, opt));
    host |= out.back()->buffer_type().is_host();
  }
  if (opt.host_fallback && !host) out.push_back(make_backend("cpu", opt));
  return out;
}

std::vector<std::unique_ptr<Backend>> make_backends(std::string_view names,
                                                    const BackendOptions& opt) {
  std::vector<std::string> list;
  std::string cur;
  for (char c : names) {
    if (c == ',' || std::isspace(static_cast<unsigned char>(c))) {
      if (!cur.empty()) list.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) list.push_back(cur);
  return make_backends(list, opt);
}

void register_backend(BackendInfo info, bool preferred) {
  if (info.name.empty() || !info.make)
    fail("register_backend", "a backend needs a name and a factory");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const std::string key = lower(info.name);
  std::erase_if(r.list, [&](const BackendInfo& b) { return lower(b.name) == key; });
  // Preferred: tried first (an accelerator); otherwise a fallback after the rest.
  if (preferred) r.list.insert(r.list.begin(), std::move(info));
  else r.list.push_back(std::move(info));
}

}  // namespace kiln
