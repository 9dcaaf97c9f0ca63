"""The package surface other components rely on, and the stdlib-shadowing trap."""

from __future__ import annotations

import operator
import sysconfig
from pathlib import Path

import gpushare.model


def test_the_model_exports_exactly_its_public_names() -> None:
    public = {name for name in vars(gpushare.model) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(gpushare.model, name)).__name__ == "module"}
    assert set(gpushare.model.__all__) == (public - modules) | {"contract"}


def test_operator_still_means_the_standard_library() -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert operator.__file__ is not None
    assert Path(operator.__file__).resolve().parent == stdlib


def test_the_operator_folder_is_not_a_package() -> None:
    root = Path(__file__).resolve().parents[2]
    assert not (root / "operator" / "__init__.py").exists()
