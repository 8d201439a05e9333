"""Make it deterministic: ``patch``/``unpatch``/``patched``, the switches each TF version reads,
seeding and RNG state, and ``status()``.

Modules, lowest first: ``switches`` (TF-version logic and the one reader of TF's environment
flags), ``seeding``, ``state`` (what the active patch changed), ``reporting`` (``status()``),
``patching``. They import the ground floor (``tfrepro._tf``, ``tfrepro.errors``) and, lazily, the
op rebinding in ``tfrepro.ops``; nothing in here imports ``proof``, ``launching`` or ``cli``.
"""
