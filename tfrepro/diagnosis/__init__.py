"""Find the cause: ``tfrepro.diagnose`` and ``tfrepro doctor``.

``findings`` (``Finding``, ``Diagnosis``), ``batches`` (the one batch, and the model built for it as
``fit`` builds it), ``layer_calls`` (which layer made which op and tensor), ``graph_walk`` (every op
of a traced graph, nested functions included), ``scanning`` (the static risk scan against
``tfrepro.ops.kernel_facts``), ``pipelines`` (tf.data risks), ``bisection`` (repeats of one step,
compared bit for bit), ``diagnosing`` (``diagnose``), ``doctoring`` (``tfrepro doctor``: the first
``Model.fit`` of an unmodified script). Sits on ``proof`` (fingerprints), ``determinism`` (RNG
state, status) and ``launching`` (the child process).
"""
