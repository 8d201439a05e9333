"""Figures (matplotlib: the ``plot`` extra): training curves of several runs with their first
divergence marked, and the seed distributions of one or more sweeps. Each function returns a
``matplotlib.figure.Figure`` built without pyplot (no global state), for a notebook to show or a
script to ``savefig``; ``tfrepro compare --plot`` and ``tfrepro sweep --plot`` write them.

This floor sits on ``proof`` (traces, comparisons) and ``sweeps`` (their results).
"""
