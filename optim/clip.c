#include <math.h>

#include "optim/optim.h"

double grad_clip_by_norm(const KernelOps *k, ParamTable *params, double max_norm) {
    double norm = sqrt(k->sum_squares(params->grad, params->numel));
    if (max_norm > 0) {
        double coef = max_norm / (norm + 1e-6);
        if (coef < 1) k->scale(params->grad, params->numel, (float)coef);
    }
    return norm;
}
