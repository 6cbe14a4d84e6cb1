"""Key numbers a chapter reports to `make solutions` (re-exported from `dpc_runtime.metrics`; used from chapter 7 on)."""
from dpc_runtime.metrics import record

__all__ = ["record"]
