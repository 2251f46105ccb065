"""Every error roost defines sits in the one tree of daemon/core/errors.py."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import daemon.core.errors as errors
from daemon.core.errors import RoostError

PACKAGES = ("daemon", "channels", "automations")


def _exception_classes() -> list[type[BaseException]]:
    """Every exception class defined (not just imported) in roost's packages."""
    found: list[type[BaseException]] = []
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        modules = [package_name] + [
            info.name for info in pkgutil.walk_packages(package.__path__, f"{package_name}.")
            if not info.name.endswith("__main__")  # running it is its only job
        ]
        for name in modules:
            module = importlib.import_module(name)
            found += [cls for _, cls in inspect.getmembers(module, inspect.isclass)
                      if issubclass(cls, BaseException) and cls.__module__ == name]
    return found


def test_the_walk_finds_the_errors_defined_outside_errors_py() -> None:
    names = {cls.__name__ for cls in _exception_classes()}
    assert {"GraphError", "NoState", "NotAnUpdate", "RoostError"} <= names


def test_every_exception_class_roost_defines_derives_from_roost_error() -> None:
    outside = [f"{cls.__module__}.{cls.__qualname__}" for cls in _exception_classes()
               if not issubclass(cls, RoostError)]
    assert outside == []


def test_every_public_error_is_drawn_in_the_tree() -> None:
    drawn = set(re.findall(r"[├└]── (\w+)", errors.__doc__ or ""))
    public = {cls.__name__ for cls in _exception_classes() if not cls.__name__.startswith("_")}
    assert public - {"RoostError"} <= drawn, public - drawn
    assert drawn <= public, drawn - public  # nor a name that no longer exists
