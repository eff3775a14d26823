// kiln: tensors, lazy graphs, reverse-mode autodiff and compute backends in C++20.
#pragma once
#include "kiln/backend.h"
#include "kiln/context.h"
#include "kiln/cpu.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/graph.h"
#include "kiln/ops.h"
#include "kiln/tensor.h"
