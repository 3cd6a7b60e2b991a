"""Activation codes shared by both backends.

Kernels take the activation as a small integer so that one compiled kernel
serves every activation; the backward passes need only the activation's
*output* (relu' = y > 0, tanh' = 1 - y^2, sigmoid' = y(1 - y)), so no
pre-activation buffer is kept.
"""

NONE = 0
RELU = 1
TANH = 2
SIGMOID = 3

ACTIVATIONS = {"none": NONE, "relu": RELU, "tanh": TANH, "sigmoid": SIGMOID}
