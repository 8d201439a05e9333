"""Example training scripts that run unmodified under ``tfrepro run`` and ``tfrepro check``."""
