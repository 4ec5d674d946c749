"""The Logger's private parts, each its own job, so that ``logger.py`` reads as the API:

- ``routing``: the rank policy and routing table, decided once, and calling destinations so that one
  failing never takes the others down;
- ``handover``: files and folders handed to the destinations that take them;
- ``run_name``: the run's name, identical on every rank (also used by ``setup_logging``);
- ``resume``: the state ``Logger.state_dict`` saves, and a resume waiting for its first step;
- ``consistency``: the ``check_consistency=True`` comparison of ranks' hyperparameters;
- ``config_load``: the config machinery under :mod:`dist_logging.config`, which takes the Logger class
  as an argument (``Logger.from_config`` uses it too, without an import circle).

Nothing here is public; import from :mod:`dist_logging`.
"""
