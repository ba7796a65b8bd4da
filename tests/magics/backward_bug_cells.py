"""A port bug in backward only, shared by the ``--layers`` tests.

``GRAD_CLIP`` is cell text for a namespace that imported ``torch`` and ``torch.nn as nn``: the
module ``GradClip`` passes its input through, and on a device other than the CPU its gradient is
scaled by 1.5, so the forward pass matches and the gradient does not.
"""

GRAD_CLIP = """
class DeviceScaledGrad(torch.autograd.Function):
    # a port bug in backward only: the forward pass matches, the gradient does not
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * 1.5 if grad.device.type != "cpu" else grad

class GradClip(nn.Module):
    def forward(self, x):
        return DeviceScaledGrad.apply(x)
"""
