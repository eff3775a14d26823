// Fixture of the layer_check_catches_planted_ext test: a program including an
// extension header must be reported (programs use the user API only).
#include "kiln/ext/tensor_node.h"
