"""Live with it: exact resume after a crash.

``ReproCheckpoint`` (``callback``), the Keras callback; ``model_state`` (every variable training
changes), ``callback_states`` (what built-in callbacks remember), ``storage`` (atomic, pickle-free checkpoint files), ``resuming`` (``tfrepro run
--checkpoint``: a ``ReproCheckpoint`` on every ``Model.fit`` of an unmodified script). Sits on
``determinism`` (RNG state, the patch seed) and ``launching`` (the child process).
"""
