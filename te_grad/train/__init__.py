"""Training with te_grad: layers, initializers, optimizers written in the DSL, and a Trainer
whose whole step (forward, loss, backward, update) is one compiled kernel.

See :class:`~te_grad.train.trainer.Trainer`, and ``python -m te_grad train-digits`` for a
complete run on scikit-learn's handwritten digits.
"""
from .init import (Initializer, glorot_normal, glorot_uniform, kaiming_normal, kaiming_uniform, xavier_normal,
                   xavier_uniform, zeros)
from .layers import (GELU, AvgPool2d, BatchNorm2d, Context, Conv1d, Conv2d, Dropout, Embedding, Flatten, LayerNorm,
                     Linear, MaxPool2d, Module, Param, ReLU, RMSNorm, Sequential, SiLU, State, Tanh)
from .optim import SGD, Adam, AdamW, Hyper, Optimizer
from .trainer import Trainer

__all__ = ["Trainer", "Module", "Param", "State", "Context", "Sequential", "Linear", "Conv1d", "Conv2d",
           "BatchNorm2d", "LayerNorm", "RMSNorm", "Embedding", "ReLU", "GELU", "SiLU", "Tanh", "Flatten",
           "MaxPool2d", "AvgPool2d", "Dropout", "Optimizer", "SGD", "Adam", "AdamW", "Hyper", "Initializer", "zeros",
           "xavier_uniform", "xavier_normal", "kaiming_uniform", "kaiming_normal", "glorot_uniform", "glorot_normal"]
