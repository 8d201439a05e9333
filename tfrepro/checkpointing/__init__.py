"""Live with it: exact resume after a crash.

``ReproCheckpoint`` (``callback``), the Keras callback; ``LoopCheckpoint`` (``loop``), the same for a
custom training loop; ``model_state`` (every variable training changes, found through the object
graph), ``kernel_random`` (random ops whose state no checkpoint can hold, found and refused),
``callback_states`` (what built-in callbacks remember), ``storage`` (atomic, pickle-free checkpoint
files), ``arguments`` (the arguments both take, by Keras's names, and their deprecated names),
``resuming`` (``tfrepro run --checkpoint``: a ``ReproCheckpoint`` on every ``Model.fit`` of an
unmodified script). Sits on ``determinism`` (RNG state, the patch seed) and ``launching`` (the child
process).
"""
