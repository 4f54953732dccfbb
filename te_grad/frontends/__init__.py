"""What te_grad's framework frontends share: :mod:`te_grad.frontends.base` (free of any framework).

The frontends themselves are the public modules ``te_grad.torch`` (``torch.library`` custom
ops) and ``te_grad.jax`` (``jax.custom_vjp``); each subclasses
:class:`te_grad.frontends.base.FrontendOp` and holds only what its framework needs. Neither
this package nor its base imports torch or jax.
"""
