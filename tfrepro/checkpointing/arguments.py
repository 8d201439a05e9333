"""The arguments both checkpointers take, by Keras's and TensorFlow's names, checked.

``backup_dir`` and ``save_freq`` are what Keras's ``BackupAndRestore`` calls them, ``max_to_keep`` what
``tf.train.CheckpointManager`` calls it. Their names before 0.1.0 (``directory=``, ``every=``,
``keep=``) still work for this release: ``renamed`` passes them on under the new names with a
``DeprecationWarning`` at the caller's line. Importing this module does not import TensorFlow.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tfrepro.errors import warn

# old keyword -> (new keyword, whose name it is, what it takes: checked where a class also takes **objects)
RENAMED = {
    "directory": ("backup_dir", "Keras's BackupAndRestore's name", (str, os.PathLike, type(None))),
    "every": ("save_freq", "Keras's BackupAndRestore's name", (str, int, type(None))),
    "keep": ("max_to_keep", "tf.train.CheckpointManager's name", (int, type(None))),
}
LAST_RELEASE_WITH_OLD_NAMES = "0.1.0"

_Init = TypeVar("_Init", bound=Callable[..., None])


def renamed(owner: str, *, objects_too: bool = False) -> Callable[[_Init], _Init]:
    """A decorator for ``owner``'s ``__init__`` that takes the deprecated keywords of ``RENAMED``.

    Each one given is passed on under its new name, with a ``DeprecationWarning`` attributed to the
    caller's line; given together with its new name (as a keyword or positionally), it raises
    ``TypeError``, as Python does for an argument given twice. With ``objects_too`` (an ``__init__``
    that also takes ``**objects`` to save, by name), an old name is always the argument, never an
    object: given a value the argument does not take (a model, a variable), it raises ``TypeError``
    saying so, rather than saving it or failing on it as a number. The signature and docstring stay
    ``__init__``'s own, with the new names only.
    """

    def decorate(init: _Init) -> _Init:
        parameters = list(inspect.signature(init).parameters.values())
        positional = {p.name: i for i, p in enumerate(parameters)
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)}  # self included, at 0

        @functools.wraps(init)
        def init_with_old_names(*args: Any, **kwargs: Any) -> None:
            for old, (new, origin, takes) in RENAMED.items():
                if old not in kwargs:
                    continue
                if new in kwargs or positional.get(new, len(args)) < len(args):
                    raise TypeError(f"{owner}() got both {new!r} and {old!r}, its deprecated name: pass {new}= only")
                if objects_too and not isinstance(kwargs[old], takes):
                    raise TypeError(f"{owner}({old}=...) is the deprecated name of {new}=, not an object to save; "
                                    f"got {type(kwargs[old]).__name__}: save it under another name")
                warn(f"{owner}({old}=...) is deprecated: pass {new}=... ({origin}); {old}= will be removed after "
                     f"tfrepro {LAST_RELEASE_WITH_OLD_NAMES}", DeprecationWarning)
                kwargs[new] = kwargs.pop(old)
            init(*args, **kwargs)

        return init_with_old_names  # type: ignore[return-value]

    return decorate


def checked(backup_dir: Any, save_freq: Any, max_to_keep: Any) -> Path:
    """``backup_dir`` as a ``Path``, once the three arguments are what a checkpointer takes: a path
    that is not a file, ``"epoch"`` or a positive number of batches, a positive number of files.

    Raises:
        TypeError: ``backup_dir`` is not a path.
        ValueError: ``backup_dir`` is a file, or ``save_freq`` or ``max_to_keep`` is out of range.
    """
    if not isinstance(backup_dir, (str, os.PathLike)):
        raise TypeError(f"backup_dir must be a path; got {type(backup_dir).__name__}")
    batches = isinstance(save_freq, int) and not isinstance(save_freq, bool) and save_freq >= 1
    if not (save_freq == "epoch" or batches):
        raise ValueError(f'save_freq must be "epoch" or a positive number of batches; got {save_freq!r}')
    if isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1:
        raise ValueError(f"max_to_keep must be a positive int; got {max_to_keep!r}")
    path = Path(backup_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(f"backup_dir is a file: {path}")
    return path
