// Fixture of the layer_check_catches_planted test: core including the training
// layer must be reported.
#include "kiln/opt.h"
