#include "phase.h"

_Atomic int ta_current_phase = TA_PHASE_DEFAULT;
