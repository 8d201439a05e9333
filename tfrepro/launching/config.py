"""``LaunchConfig``: how a launched child runs, and the one place that turns it into the child's
environment (``to_env``) and back (``from_env``, on the child's side in ``bootstrap``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from tfrepro import _tf
from tfrepro.determinism import initialisers, seeding, switches
from tfrepro.errors import LaunchError
from tfrepro.ops.selection import ON_UNCOVERED

# The launcher/child protocol: LaunchConfig field -> environment variable.
ENV_NAMES = {
    "patch": "TFREPRO_PATCH",
    "seed": "TFREPRO_SEED",
    "threads": "TFREPRO_THREADS",
    "onednn": "TFREPRO_ONEDNN",
    "ops": "TFREPRO_OPS",
    "init": "TFREPRO_INIT",
    "on_uncovered": "TFREPRO_ON_UNCOVERED",
    "trace_dir": "TFREPRO_TRACE_DIR",
    "gradients": "TFREPRO_GRADIENTS",
}


OPS_CHOICES = {"auto": "auto", "all": True, "none": False, "exact": "exact"}  # --ops value -> patch(ops=...)


@dataclass(frozen=True)
class LaunchConfig:
    """How the child runs: whether and how to patch (seed, thread pools, oneDNN, op replacements,
    the initialisation scheme),
    and, for ``tfrepro check``, where every ``Model.fit`` writes its trace and whether gradients
    are fingerprinted too."""

    seed: int = 0
    threads: int | None = None
    onednn: bool | None = None
    ops: str = "auto"  # "auto", "all", "exact" or "none" (True/False are read as "all"/"none")
    init: str = "order"  # patch(init=...): "order" or "keyed"
    on_uncovered: str = "raise"  # patch(on_uncovered=...), with ops "exact": "raise" or "warn"
    patch: bool = True
    trace_dir: str | None = None
    gradients: bool = False

    def __post_init__(self) -> None:
        try:
            seeding.validate_seed(self.seed, "--seed")
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        if self.threads is not None and self.threads < 1:
            raise LaunchError(f"--threads must be a positive integer; got {self.threads}")
        if isinstance(self.ops, bool):  # patch()'s spelling: True = all, False = none
            object.__setattr__(self, "ops", "all" if self.ops else "none")
        if self.ops not in OPS_CHOICES:
            raise LaunchError(f"--ops must be one of {', '.join(OPS_CHOICES)}; got {self.ops!r}")
        if self.init not in initialisers.SCHEMES:
            raise LaunchError(f"--init must be one of {', '.join(initialisers.SCHEMES)}; got {self.init!r}")
        if self.on_uncovered not in ON_UNCOVERED:
            raise LaunchError(f"--on-uncovered must be one of {', '.join(ON_UNCOVERED)}; got {self.on_uncovered!r}")
        if self.on_uncovered != "raise" and self.ops != "exact":
            raise LaunchError("--on-uncovered is what the exact tier's audit does with the ops it names: it needs "
                              "--ops exact")

    @property
    def patch_ops(self) -> str | bool:
        """``ops`` as ``patch(ops=...)`` takes it: "auto", True ("all") or False ("none")."""
        return OPS_CHOICES[self.ops]

    def cli_options(self) -> list[str]:
        """The `tfrepro run` options that launch with this configuration (the seed aside)."""
        options = [] if self.threads is None else ["--threads", str(self.threads)]
        options += [] if self.onednn is None else ["--onednn", "on" if self.onednn else "off"]
        options += {"auto": [], "all": ["--ops"], "exact": ["--ops", "exact"], "none": ["--no-ops"]}[self.ops]
        options += [] if self.on_uncovered == "raise" else ["--on-uncovered", self.on_uncovered]
        return options + ([] if self.init == "order" else ["--init", self.init])

    def to_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The child's environment: ``base`` (default ``os.environ``) with the protocol variables
        replaced, plus what must be set before the interpreter starts (``PYTHONHASHSEED``, the
        determinism switches of the installed TF, ``TF_ENABLE_ONEDNN_OPTS``)."""
        env = {k: v for k, v in (os.environ if base is None else base).items() if k not in ENV_NAMES.values()}
        for name, value in asdict(self).items():
            if value is None:
                continue
            env[ENV_NAMES[name]] = ("1" if value else "0") if isinstance(value, bool) else str(value)
        if self.onednn is not None:
            env["TF_ENABLE_ONEDNN_OPTS"] = env[ENV_NAMES["onednn"]]
        if self.patch:
            env["PYTHONHASHSEED"] = str(self.seed)
            env.update(switches.plan_for(_tf.installed_tf_version()).env)
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LaunchConfig:
        """The configuration ``to_env`` wrote (defaults for what is absent)."""
        environ = os.environ if environ is None else environ
        values = {name: environ[variable] for name, variable in ENV_NAMES.items() if variable in environ}
        config = {}
        for name, raw in values.items():
            if name in ("patch", "gradients", "onednn"):
                config[name] = raw == "1"
            elif name in ("seed", "threads"):
                config[name] = int(raw)
            elif name == "ops":
                config[name] = {"1": "all", "0": "none"}.get(raw, raw)  # the values before ops="auto"
            else:
                config[name] = raw
        return cls(**config)
