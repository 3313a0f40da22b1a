"""deepspeed.ops.adam: DeepSpeedCPUAdam and FusedAdam with DeepSpeed's constructor arguments.
Passed as initialize(optimizer=...), their type, mode (adamw_mode / adam_w_mode) and per-group
hyper-parameters become the daemons' Adam or AdamW; used alone, step() runs the same Adam in
fp32 in torch (DeepSpeed's run compiled kernels)."""
import math

import torch


class _DeepSpeedAdam(torch.optim.Optimizer):
    def __init__(self, params, lr, bias_correction, betas, eps, weight_decay, amsgrad,
                 adam_w_mode):
        if amsgrad:
            raise ValueError("zerod: %s does not support the AMSGrad variant, as DeepSpeed's"
                             % type(self).__name__)
        self.adam_w_mode = bool(adam_w_mode)
        super().__init__(params, dict(lr=lr, bias_correction=bias_correction, betas=betas,
                                      eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for g in self.param_groups:
            b1, b2 = g["betas"]
            lr, wd, eps = g["lr"], g["weight_decay"], g["eps"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    st["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                st["step"] += 1
                master, grad = p.float(), p.grad.float()
                if wd and not self.adam_w_mode:
                    grad = grad.add(master, alpha=wd)  # Adam: L2 in the gradient
                st["exp_avg"].mul_(b1).add_(grad, alpha=1 - b1)
                st["exp_avg_sq"].mul_(b2).addcmul_(grad, grad, value=1 - b2)
                bc1 = 1 - b1 ** st["step"] if g["bias_correction"] else 1.0
                bc2 = 1 - b2 ** st["step"] if g["bias_correction"] else 1.0
                denom = (st["exp_avg_sq"].sqrt() / math.sqrt(bc2)).add_(eps)
                if wd and self.adam_w_mode:
                    master.mul_(1 - lr * wd)  # AdamW: decoupled decay
                master.addcdiv_(st["exp_avg"], denom, value=-lr / bc1)
                p.copy_(master)
        return loss


class DeepSpeedCPUAdam(_DeepSpeedAdam):
    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999),
                 eps=1e-8, weight_decay=0, amsgrad=False, adamw_mode=True,
                 fp32_optimizer_states=True):
        del fp32_optimizer_states  # the daemons keep fp32 state
        super().__init__(model_params, lr, bias_correction, betas, eps, weight_decay, amsgrad,
                         adamw_mode)


class FusedAdam(_DeepSpeedAdam):
    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0.0, amsgrad=False, set_grad_none=True):
        del set_grad_none
        super().__init__(params, lr, bias_correction, betas, eps, weight_decay, amsgrad,
                         adam_w_mode)
