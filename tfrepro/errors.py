"""Exceptions and warning categories raised by tfrepro."""


class ReproducibilityWarning(UserWarning):
    """Something may make runs differ: a setting came too late, conflicts, or cannot be applied.

    Filter it like any warning, e.g. ``warnings.simplefilter("error", tfrepro.ReproducibilityWarning)``.
    """
