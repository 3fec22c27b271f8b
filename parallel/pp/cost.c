// The schedules' cost model (schedule.h): the time each action takes, which the checker's
// clocks (check.c) and the printed table's rows (schedule.c) both count in. Communication is
// free; a full backward costs as much as its two halves, input (I) and weight (W).
#include "parallel/pp/schedule.h"

int pp_action_cost(PpActionKind k) { return k == PP_BACKWARD ? 2 : k <= PP_BACKWARD_WEIGHT; }
