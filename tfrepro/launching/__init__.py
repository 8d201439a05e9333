"""Launch an unmodified Python command under tfrepro: ``tfrepro run`` and ``tfrepro check``.

``config`` holds ``LaunchConfig``, the one description of the launcher/child protocol (the
``TFREPRO_*`` variables: ``to_env``/``from_env``); ``command`` rewrites the user's command to run
through ``bootstrap``, the child side; ``checking`` runs a command N times in fresh interpreters and
compares the runs. May import ``determinism``, ``proof`` and the ground floor; never ``cli``.
"""
