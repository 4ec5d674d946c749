"""Sampling one node's system metrics (psutil, and NVML when a GPU is present) on a named background thread."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Optional

__all__ = ['NodeSampler', 'NodeSample', 'sample_once', 'import_psutil', 'check_every']

#: The system metrics, their units and meanings (docs/telemetry.md lists the same).
SYSTEM_METRICS = {
    'cpu_percent': 'percent of all cores busy since the previous sample (0-100)',
    'memory_used_bytes': 'bytes of memory in use (total - available)',
    'memory_available_bytes': 'bytes of memory available to new processes without swapping',
    'disk_read_bytes_per_second': 'bytes read from local disks per second since the previous sample',
    'disk_write_bytes_per_second': 'bytes written to local disks per second since the previous sample',
    'network_sent_bytes_per_second': 'bytes sent on all interfaces per second since the previous sample',
    'network_received_bytes_per_second': 'bytes received on all interfaces per second since the previous sample',
    'load_average_1m': "the 1-minute load average (runnable processes; compare with the node's cores)",
    'gpu{i}_utilization_percent': 'percent of time GPU i was busy over the last sample period (NVML)',
    'gpu{i}_memory_used_bytes': 'bytes of GPU i memory in use (NVML)',
    'gpu{i}_temperature_celsius': 'GPU i core temperature in degrees Celsius (NVML)',
    'gpu{i}_power_watts': 'GPU i power draw in watts (NVML)',
}


class NodeSample(dict):
    """One sample: metric name (see :data:`SYSTEM_METRICS`) -> float, with ``wall`` (``time.time()``) and ``host``."""

    wall: float = 0.0
    host: str = ''


def import_psutil() -> Any:
    """Import psutil, with an install hint.

    Raises:
        ImportError: psutil is not installed (names the extra).
    """
    try:
        import psutil
    except ImportError as exc:
        raise ImportError(
            'system_metrics_every= samples the node with psutil: pip install "dist-logging[system]"'
        ) from exc
    return psutil


def check_every(every: Any) -> Optional[float]:
    """Validate ``system_metrics_every``: None, or a positive number of seconds.

    Raises:
        ValueError: not a positive number.
    """
    if every is None:
        return None
    if isinstance(every, bool) or not isinstance(every, (int, float)) or not every > 0 or every != every:
        raise ValueError(f'system_metrics_every must be a positive number of seconds or None, got {every!r}')
    return float(every)


class _Nvml:
    """NVML handles, when a GPU and its library are there (nothing otherwise)."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.lib: Any = None
        try:
            import torch

            if not torch.cuda.is_available():
                return
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self.lib = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # noqa: BLE001 - no GPU, no driver or no nvidia-ml-py: CPU metrics only
            self.handles = []

    def sample(self, out: dict[str, float]) -> None:
        lib = self.lib
        for i, handle in enumerate(self.handles):
            for name, read in (
                ('utilization_percent', lambda h: lib.nvmlDeviceGetUtilizationRates(h).gpu),
                ('memory_used_bytes', lambda h: lib.nvmlDeviceGetMemoryInfo(h).used),
                ('temperature_celsius', lambda h: lib.nvmlDeviceGetTemperature(h, 0)),
                ('power_watts', lambda h: lib.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ):
                try:
                    out[f'gpu{i}_{name}'] = float(read(handle))
                except Exception:  # noqa: BLE001 - a reading this GPU does not support
                    pass

    def close(self) -> None:
        if self.lib is not None:
            try:
                self.lib.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down
                pass


class _Counters:
    """The previous cumulative disk and network counters, for per-second rates."""

    def __init__(self, psutil: Any):
        self.psutil = psutil
        self.at = time.monotonic()
        self.disk = self._disk()
        self.net = self._net()
        psutil.cpu_percent(None)  # the first call only starts the measurement

    def _disk(self) -> tuple[float, float]:
        counters = self.psutil.disk_io_counters()
        return (counters.read_bytes, counters.write_bytes) if counters else (0.0, 0.0)

    def _net(self) -> tuple[float, float]:
        counters = self.psutil.net_io_counters()
        return (counters.bytes_sent, counters.bytes_recv) if counters else (0.0, 0.0)

    def rates(self, out: dict[str, float]) -> None:
        now, disk, net = time.monotonic(), self._disk(), self._net()
        span = max(now - self.at, 1e-6)
        out['disk_read_bytes_per_second'] = max(disk[0] - self.disk[0], 0) / span
        out['disk_write_bytes_per_second'] = max(disk[1] - self.disk[1], 0) / span
        out['network_sent_bytes_per_second'] = max(net[0] - self.net[0], 0) / span
        out['network_received_bytes_per_second'] = max(net[1] - self.net[1], 0) / span
        self.at, self.disk, self.net = now, disk, net


def sample_once(psutil: Any, counters: Any = None, nvml: Any = None) -> dict[str, float]:
    """One reading of the node: the metrics of :data:`SYSTEM_METRICS` this node has.

    Args:
        psutil: the psutil module.
        counters: the previous counters (rates are left out without them).
        nvml: the NVML handles (GPU metrics are left out without them).

    Returns:
        metric name -> value.
    """
    out: dict[str, float] = {'cpu_percent': float(psutil.cpu_percent(None))}
    memory = psutil.virtual_memory()
    out['memory_used_bytes'] = float(memory.total - memory.available)
    out['memory_available_bytes'] = float(memory.available)
    if counters is not None:
        counters.rates(out)
    try:
        out['load_average_1m'] = float(os.getloadavg()[0])
    except OSError:  # not on this platform
        pass
    if nvml is not None:
        nvml.sample(out)
    return out


class NodeSampler:
    """Samples this node every ``every`` seconds on the thread ``dist_logging-system-metrics``.

    Each sample goes to ``on_sample(sample)`` on that thread (keep it short; it must not raise:
    its failure is recorded and raised by :meth:`check`). The thread runs at the lowest CPU
    priority it may set for itself, so it yields to the training step.

    Args:
        every: seconds between samples.
        host: this node's name (the ``host`` of each sample).
        on_sample: called with each :class:`NodeSample`.

    Raises:
        ValueError: a bad ``every``.
        ImportError: psutil is not installed.
    """

    def __init__(self, every: float, host: str, on_sample: Callable[[NodeSample], None]):
        self.every = check_every(every)
        self.host = host
        self._psutil = import_psutil()
        self._on_sample = on_sample
        self._stop = threading.Event()
        self._error: Optional[BaseException] = None
        self.failed = False  # the thread ended on an error (raised by check())
        self.samples_taken = 0
        self._thread = threading.Thread(target=self._run, name='dist_logging-system-metrics', daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # this thread only (Linux)
        except (OSError, AttributeError):
            pass
        nvml = _Nvml()
        try:
            counters = _Counters(self._psutil)
            while not self._stop.wait(self.every):
                sample = NodeSample(sample_once(self._psutil, counters, nvml))
                sample.wall, sample.host = time.time(), self.host
                self.samples_taken += 1
                self._on_sample(sample)
        except BaseException as exc:  # noqa: BLE001 - surfaced by check()
            self._error = exc
            self.failed = True
        finally:
            nvml.close()

    def check(self) -> None:
        """Raise what stopped the sampling thread, once.

        Raises:
            RuntimeError: the thread failed (its error chained).
        """
        error, self._error = self._error, None
        if error is not None:
            raise RuntimeError(f'system metrics sampling on {self.host} failed: {error!r}') from error

    def close(self, timeout: float = 2.0) -> None:
        """Stop the thread and wait for it (at most ``timeout`` seconds)."""
        self._stop.set()
        self._thread.join(timeout)
