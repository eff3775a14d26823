// The backend registry's extension side: how an out-of-tree backend (or a test)
// adds itself, and how the backends layer lists the built-in ones. Programs pick
// backends with kiln/registry.h.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "kiln/registry.h"

namespace kiln {

// Adds a backend (out-of-tree backends, tests). A backend of the same name is
// replaced. `preferred`: listed before the built-in ones instead of after them.
void register_backend(BackendInfo info, bool preferred = false);

namespace detail {
// The built-in backends, most preferred first; defined by the backends layer
// (src/backends/builtin_backends.cpp) so that this layer names none of them.
std::vector<BackendInfo> builtin_backends();
// Why a built-in backend of that (lower-case) name is not in the list ("" when it
// is, or when no built-in backend has the name): e.g. "cuda" without a device.
std::string builtin_unavailable_reason(std::string_view name);
}  // namespace detail

}  // namespace kiln
