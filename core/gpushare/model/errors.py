"""The one error tree of the model.

    GpuShareError                 every error the model raises (never a bare ValueError)
    ├── InvalidQuantity           a GPU resource quantity that is not a whole, non-negative number
    ├── InvalidRequest            a pod whose GPU request cannot be served as written
    ├── InvalidAnnotation         a volcano.sh/* annotation that does not parse
    └── InvalidInventory          a node's GPU inventory (capacity or GPUNode) is unusable

Each message names the object it is about and says what to change.
"""

from __future__ import annotations


class GpuShareError(Exception):
    """Base of every error raised by the gpushare model."""


class InvalidQuantity(GpuShareError):
    """A quantity of volcano.sh/gpu-memory or volcano.sh/gpu-number that is not usable."""


class InvalidRequest(GpuShareError):
    """A pod's GPU request that cannot be served (for example both resources at once)."""


class InvalidAnnotation(GpuShareError):
    """A malformed volcano.sh/* annotation, or one that names a card that cannot be used."""


class InvalidInventory(GpuShareError):
    """A node whose GPU inventory contradicts itself or cannot be read."""
