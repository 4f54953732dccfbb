"""Exception types. Every error te_grad raises derives from :class:`TeGradError`.

``UserError`` means the caller did something wrong (a bad shape, a missing
feed, a float used as an index); its message names the offending tensor, node
or argument. ``InternalError`` means te_grad itself is at fault: please report it.
"""


class TeGradError(Exception):
    """Root of every exception raised by te_grad."""


class UserError(TeGradError, ValueError):
    """A wrong argument, shape, dtype or program from the caller."""


class InternalError(TeGradError, RuntimeError):
    """A bug in te_grad: an invariant that should always hold did not."""


class SimplificationWarning(UserWarning):
    """A simplification could not be verified, so te_grad used a slower form that is
    correct by construction (see ``DifferentiationResult.fallbacks``)."""
