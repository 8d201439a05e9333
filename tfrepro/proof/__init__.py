"""Prove it: fingerprints, traces, the recording callback, comparisons, the environment
fingerprint, and the "N runs against run 0" core under ``verify()`` and ``tfrepro check``.

Modules, lowest first: ``fingerprints``, ``traces``, ``environment_info``, ``comparison``, ``runs``;
the callback's pieces ``recorder``, ``live_comparison``, ``gradient_hook`` and ``callback``;
``fit_recording`` (attach the callback to every ``Model.fit``) and ``verification``. May import
``determinism`` (for the seed and status in trace headers) and the ground floor; never
``launching`` or ``cli``.
"""
