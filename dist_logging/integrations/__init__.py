"""Adapters that plug dist_logging into training frameworks, one module per framework.

* :mod:`dist_logging.integrations.lightning`: ``DistLoggingLogger``, a PyTorch Lightning ``Logger``.
* :mod:`dist_logging.integrations.transformers`: ``DistLoggingCallback``, a Hugging Face ``TrainerCallback``
  (importing the module also registers ``report_to=['dist_logging']``).
* :mod:`dist_logging.integrations.accelerate`: ``DistLoggingTracker``, an Accelerate tracker
  (importing the module also registers ``log_with='dist_logging'``).

This package imports nothing heavy: each module imports its framework when it is imported,
and raises ImportError naming the extra to install (``pip install "dist-logging[lightning]"``)
when the framework is missing. Adapters hold no rank logic: the Logger applies rank policy.
"""

__all__: list[str] = []
