"""Node sampling and the Prometheus endpoint, fed by the store line's heartbeats (see docs/telemetry.md).

The Logger builds a :class:`Telemetry` on every rank when ``system_metrics_every`` or
``metrics_port`` is set; users need nothing from here but the names of the metrics.
"""

from dist_logging.telemetry.exporter import MetricsExporter, Sample
from dist_logging.telemetry.heartbeats import RankRecord, StoreBoard
from dist_logging.telemetry.hub import Telemetry, TelemetryOptions, check_options
from dist_logging.telemetry.sampler import SYSTEM_METRICS, NodeSampler, sample_once

__all__ = [
    'Telemetry',
    'TelemetryOptions',
    'check_options',
    'MetricsExporter',
    'Sample',
    'RankRecord',
    'StoreBoard',
    'SYSTEM_METRICS',
    'NodeSampler',
    'sample_once',
]
