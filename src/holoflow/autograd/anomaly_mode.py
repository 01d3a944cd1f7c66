"""``holoflow.autograd.anomaly_mode``: torch.autograd's anomaly detection on holoflow's engine
(core/anomaly.py). While it is on, grad nodes keep the traceback of the forward call that made
them; an error in a backward rule warns with it, and with ``check_nan`` a rule returning NaN
raises ``RuntimeError("holoflow.autograd: Function '<MulBackward>' returned nan values in its
0th output.")``. The switch is one for the process, as torch's.
"""
from __future__ import annotations

import warnings

from ..core.anomaly import is_anomaly_check_nan_enabled, is_anomaly_enabled, set_anomaly_enabled

__all__ = ["detect_anomaly", "set_detect_anomaly", "is_anomaly_enabled", "is_anomaly_check_nan_enabled",
           "set_anomaly_enabled"]


class detect_anomaly:
    """Context manager that turns anomaly detection on (``check_nan``: a backward rule returning
    NaN raises); it warns that this slows the program down, as torch's does."""

    def __init__(self, check_nan: bool = True) -> None:
        self.prev = is_anomaly_enabled()
        self.check_nan = check_nan
        self.prev_check_nan = is_anomaly_check_nan_enabled()
        warnings.warn("Anomaly Detection has been enabled. This mode will increase the runtime and should "
                      "only be enabled for debugging.", stacklevel=2)

    def __enter__(self) -> None:
        set_anomaly_enabled(True, self.check_nan)

    def __exit__(self, *args: object) -> None:
        set_anomaly_enabled(self.prev, self.prev_check_nan)


class set_detect_anomaly:
    """Sets anomaly detection on or off (``mode``) from construction; as a context manager it
    restores the previous setting on exit."""

    def __init__(self, mode: bool, check_nan: bool = True) -> None:
        self.prev = is_anomaly_enabled()
        self.prev_check_nan = is_anomaly_check_nan_enabled()
        set_anomaly_enabled(mode, check_nan)

    def __enter__(self) -> None:
        pass

    def __exit__(self, *args: object) -> None:
        set_anomaly_enabled(self.prev, self.prev_check_nan)
