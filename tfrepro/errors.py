"""Exceptions and warning categories raised by tfrepro."""


class ReproducibilityWarning(UserWarning):
    """Something may make runs differ: a setting came too late, conflicts, or cannot be applied.

    Filter it like any warning, e.g. ``warnings.simplefilter("error", tfrepro.ReproducibilityWarning)``.
    """


class DivergenceError(RuntimeError):
    """Raised by ``ReproducibilityCallback(on_divergence="raise")`` at the first divergence from the
    reference. ``.divergence`` holds the details (a ``tfrepro.Divergence``)."""

    def __init__(self, divergence: object):
        self.divergence = divergence
        super().__init__(f"run diverged from the reference at {divergence}")


class NotComparableError(ValueError):
    """Two traces (or a run and its reference) come from different models; ``.mismatch`` lists how."""

    def __init__(self, mismatch: list[str]):
        self.mismatch = mismatch
        super().__init__("not comparable: the models differ: " + "; ".join(mismatch))


class LaunchError(ValueError):
    """A command cannot be launched as given (``tfrepro run``/``check``): a user error that the CLI
    reports in one line with exit code 2."""
