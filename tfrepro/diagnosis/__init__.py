"""Find the cause: ``tfrepro.diagnose`` and ``tfrepro doctor``.

``findings`` (``Finding``, ``Diagnosis``), ``batches`` (the one batch, and the model built for it as
``fit`` builds it), ``layer_calls`` (which layer made which op and tensor), ``graph_walk`` (every op
of a traced graph, nested functions included), ``scanning`` (the static risk scan against
``tfrepro.ops.kernel_facts``), ``pipelines`` (tf.data risks, and the dataset copy the batch is read
from), ``restoring`` (every variable and RNG a step can change, saved and put back), ``recording``
(what the model's own ``train_step`` does: tapes, optimizers, metrics), ``bisection`` (repeats of that
step, compared bit for bit), ``diagnosing`` (``diagnose``), ``doctoring`` (``tfrepro doctor``: the first
``Model.fit`` of an unmodified script). Sits on ``proof`` (fingerprints), ``determinism`` (RNG
state, status) and ``launching`` (the child process).
"""
