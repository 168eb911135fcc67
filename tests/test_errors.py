"""Where the library's exceptions live: each package's in its `errors.py` (the top-level modules' in
`online_rl/errors.py`), every one an `OnlineRLError` (which the CLI prints without a traceback)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import online_rl
from online_rl.errors import OnlineRLError


def _defined_exceptions(module: ModuleType) -> list[type[BaseException]]:
    """The public exception classes `module` defines (not those it imports)."""
    return [value for name, value in vars(module).items()
            if inspect.isclass(value) and issubclass(value, BaseException) and not name.startswith("_")
            and value.__module__ == module.__name__]


def test_every_exception_lives_in_an_errors_module_and_is_an_online_rl_error() -> None:
    strays = []
    for info in pkgutil.walk_packages(online_rl.__path__, "online_rl."):
        module = importlib.import_module(info.name)
        in_errors = module.__name__.endswith(".errors")
        strays += [f"{module.__name__}.{kind.__name__}" for kind in _defined_exceptions(module)
                   if not (in_errors and issubclass(kind, OnlineRLError))]
    assert strays == [], "move these into their package's errors.py and derive them from OnlineRLError"
