#include "optim/optim.h"

void grad_clip_to_norm(const KernelOps *k, float *grad, size_t n, double norm, double max_norm) {
    if (max_norm <= 0) return;
    double coef = max_norm / (norm + 1e-6);
    if (coef < 1) k->scale(grad, n, (float)coef);
}
