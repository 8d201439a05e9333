"""Figures (matplotlib: the ``plot`` extra): training curves of several runs with their first
divergence marked, the seed distributions of one or more sweeps, and a tuning race's
configurations over seeds. Each function returns a
``matplotlib.figure.Figure`` built without pyplot (no global state), for a notebook to show or a
script to ``savefig``; ``tfrepro compare --plot`` and ``tfrepro sweep --plot`` write them.

This floor sits on ``proof`` (traces, comparisons), ``sweeps`` and ``tuning`` (their results).
"""
