"""The Prometheus endpoint: an HTTP server thread of its own serving values read at scrape time.

``prometheus_client`` renders the text exposition format from a :class:`CollectorRegistry` of
its own (never the process-global one, so a user's own metrics and ours do not mix), whose one
collector asks a callback for the current values at each scrape. The server binds in the
constructor, so a port in use fails there, with the address named.
"""

from __future__ import annotations

import http.server
import threading
from typing import Any, Callable, Iterable, NamedTuple, Optional

__all__ = ['Sample', 'MetricsExporter', 'import_prometheus_client', 'check_port', 'check_host']


class Sample(NamedTuple):
    """One value of one metric family.

    Attributes:
        name: the family's name (``dist_logging_step``).
        help: what it means, with its unit.
        labels: label name -> value.
        value: the value.
    """

    name: str
    help: str
    labels: dict[str, str]
    value: float


def import_prometheus_client() -> Any:
    """Import prometheus_client, with an install hint.

    Raises:
        ImportError: it is not installed (names the extra).
    """
    try:
        import prometheus_client
    except ImportError as exc:
        raise ImportError(
            'metrics_port= serves Prometheus metrics with prometheus_client: pip install "dist-logging[prometheus]"'
        ) from exc
    return prometheus_client


def check_port(port: Any) -> Optional[int]:
    """Validate ``metrics_port``: None, or an int in 0..65535 (0: any free port).

    Raises:
        ValueError: anything else.
    """
    if port is None:
        return None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f'metrics_port must be an int in 0..65535 (0: any free port) or None, got {port!r}')
    return port


def check_host(host: Any) -> str:
    """Validate ``metrics_host``: the address to bind (``'0.0.0.0'``: every interface, ``'127.0.0.1'``: this host).

    Raises:
        ValueError: not a non-empty str.
    """
    if not isinstance(host, str) or not host.strip():
        raise ValueError(f"metrics_host must be an address to bind such as '0.0.0.0' or '127.0.0.1', got {host!r}")
    return host.strip()


def _collector(prometheus_client: Any, read: Callable[[], Iterable[Sample]]) -> Any:
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector

    class _Collector(Collector):
        def collect(self) -> Iterable[Any]:
            families: dict[str, Any] = {}
            for sample in read():
                family = families.get(sample.name)
                if family is None:
                    family = families[sample.name] = GaugeMetricFamily(
                        sample.name, sample.help, labels=list(sample.labels)
                    )
                family.add_metric(list(sample.labels.values()), sample.value)
            return list(families.values())

        def describe(self) -> Iterable[Any]:
            return []  # values are read at scrape time only

    return _Collector()


class MetricsExporter:
    """Serves ``http://<host>:<port>/metrics`` from the thread ``dist_logging-metrics-http``.

    Args:
        host: the address to bind.
        port: the port (0: a free one; see :attr:`port`).
        read: returns the current :class:`Sample` list; called on a server thread at each scrape
            (it must bound its own waits: Prometheus gives up after its scrape timeout).

    Raises:
        ImportError: prometheus_client is not installed.
        OSError: the address cannot be bound (e.g. the port is in use); the message names it.
    """

    def __init__(self, host: str, port: int, read: Callable[[], Iterable[Sample]]):
        prometheus_client = import_prometheus_client()
        self.registry = prometheus_client.CollectorRegistry(auto_describe=False)
        self.registry.register(_collector(prometheus_client, read))
        self.scrape_errors = 0
        registry, exporter = self.registry, self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split('?')[0] not in ('/metrics', '/'):
                    self.send_error(404, 'only /metrics is served')
                    return
                try:
                    body = prometheus_client.generate_latest(registry)
                except Exception as exc:  # noqa: BLE001 - reported to the scraper, counted
                    exporter.scrape_errors += 1
                    self.send_error(500, f'collecting metrics failed: {exc!r}')
                    return
                self.send_response(200)
                self.send_header('Content-Type', prometheus_client.CONTENT_TYPE_LATEST)
                self.send_header('Content-Length', str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

        server_class: type = http.server.ThreadingHTTPServer
        if ':' in host:
            import socket

            server_class = type(
                'ThreadingHTTPServer6', (http.server.ThreadingHTTPServer,), {'address_family': socket.AF_INET6}
            )
        try:
            self._server = server_class((host, port), Handler)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f'the Prometheus endpoint (metrics_port={port}, metrics_host={host!r}) '
                f'cannot bind {host}:{port}: {exc.strerror or exc}; pick a free port or '
                'metrics_port=0 for any',
            ) from exc
        self._server.daemon_threads = True
        self.host, self.port = host, self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={'poll_interval': 0.2},
            name='dist_logging-metrics-http',
            daemon=True,
        )
        self._thread.start()

    @property
    def url(self) -> str:
        """Where the endpoint answers (with this host's name when bound to every interface)."""
        import socket

        host = socket.gethostname() if self.host in ('0.0.0.0', '::', '') else self.host
        return f'http://{host}:{self.port}/metrics'

    def close(self, timeout: float = 2.0) -> None:
        """Stop serving and release the port (waits at most ``timeout`` seconds for the thread)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout)
