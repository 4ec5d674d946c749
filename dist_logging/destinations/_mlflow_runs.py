"""The MLFlowLogger's dealings with MLflow's run bookkeeping: the tracking URI check, finding or creating
the run to log to (resuming its own or Composer's), model versions, and the system-metrics sampler."""

from __future__ import annotations

import os
import re
from typing import Any, Optional

from dist_logging._values import format_log_data_value

RUN_NAME_TAG = 'dist_logging.run_name'
COMPOSER_RUN_NAME_TAG = 'run_name'  # the tag Composer's MLFlowLogger sets (and resumes by)
DEFAULT_EXPERIMENT_NAME = 'my-mlflow-experiment'  # Composer's documented default, so both find the same runs
# The default before dist_logging took Composer's: its runs there are still resumed when no experiment is named.
EARLIER_DEFAULT_EXPERIMENT_NAME = 'dist_logging'
# A tag value a search filter can hold as one quoted literal: MLflow strips the quotes and unescapes nothing,
# so a quote or a backslash in a value cannot be written into a filter (see find_run_tagged).
_FILTER_SAFE_VALUE = re.compile(r"[^'\"\\]*")
# Pages of runs read when looking for the run to resume (500 runs each): a bound, so a store (or a mocked
# client) whose page token never empties cannot keep the lookup going forever.
MAX_SEARCH_PAGES = 200


def check_file_store_allowed(tracking_uri: str) -> None:
    """A folder (MLflow's file store) is refused by recent MLflow unless opted in: say so at construction.

    Raises:
        ValueError: ``tracking_uri`` is a folder and this MLflow refuses file stores (suggests a database).
    """
    if tracking_uri == 'databricks' or (
        re.match(r'^[A-Za-z][A-Za-z0-9+.-]+:', tracking_uri) and not tracking_uri.startswith('file:')
    ):
        return  # sqlite:, http(s):, databricks, ... (a Windows drive letter is one character, never a scheme)
    try:
        from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE
    except ImportError:  # an MLflow that has no such switch takes folders
        return
    if not MLFLOW_ALLOW_FILE_STORE.get():
        folder = tracking_uri[len('file://') :] if tracking_uri.startswith('file://') else tracking_uri
        raise ValueError(
            f'MLFlowLogger: tracking_uri {tracking_uri!r} is a folder (MLflow\'s file store), which '
            f'this MLflow refuses unless MLFLOW_ALLOW_FILE_STORE=true is set; use a database instead, '
            f'e.g. tracking_uri=\'sqlite:///{os.path.join(folder, "mlflow.db")}\''
        )


def open_run(
    client: Any,
    *,
    run_id: Optional[str],
    experiment_name: str,
    artifact_location: Optional[str],
    resume: bool,
    key: str,
    run_name: Optional[str],
    tags: dict[str, str],
    job_run: bool,
    default_experiment: bool,
) -> tuple[Any, bool]:
    """The run to log to, and whether it was created now.

    Args:
        client: an ``MlflowClient``.
        run_id: a run to continue (it is set RUNNING again), or None.
        experiment_name: the experiment (created when missing) unless ``$MLFLOW_EXPERIMENT_ID`` names one.
        artifact_location: for a new experiment.
        resume: look for a run tagged ``dist_logging.run_name=key`` (and Composer's runs, see ``job_run``) first.
        key: the value of the ``dist_logging.run_name`` tag that tells the runs of one job apart.
        run_name: the new run's name.
        tags: the new run's tags (``tags['run_name']`` is Composer's tag for the job).
        job_run: one run for the whole job: a run Composer's MLFlowLogger created for it is resumed too.
        default_experiment: no experiment was named: the earlier default experiment (``dist_logging``) is
            searched too.

    Raises:
        ValueError: ``run_id`` is not in the store.
        mlflow.exceptions.MlflowException: the store refused a call.
    """
    from mlflow.exceptions import MlflowException

    if run_id:
        try:
            run = client.get_run(run_id)
        except MlflowException as exc:
            raise ValueError(f'MLFlowLogger: run_id {run_id!r} not found in {client.tracking_uri!r}: {exc}') from exc
        if run.info.status != 'RUNNING':
            client.update_run(run.info.run_id, status='RUNNING')
        return run, False
    experiment_id = os.environ.get('MLFLOW_EXPERIMENT_ID') or None  # as in Composer: wins over the name
    if experiment_id is None:
        experiment = client.get_experiment_by_name(name=experiment_name)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            try:
                experiment_id = client.create_experiment(experiment_name, artifact_location=artifact_location)
            except MlflowException:  # created meanwhile by another job
                experiment_id = client.get_experiment_by_name(name=experiment_name).experiment_id
    if resume:
        searches = [(experiment_id, RUN_NAME_TAG, key)]
        if job_run:  # a run Composer's MLFlowLogger created for this job
            searches.append((experiment_id, COMPOSER_RUN_NAME_TAG, tags[COMPOSER_RUN_NAME_TAG]))
        if default_experiment and 'MLFLOW_EXPERIMENT_ID' not in os.environ:
            # A job that an earlier dist_logging started in its earlier default experiment continues there.
            earlier = client.get_experiment_by_name(name=EARLIER_DEFAULT_EXPERIMENT_NAME)
            if earlier is not None:
                searches.append((earlier.experiment_id, RUN_NAME_TAG, key))
        for search_experiment, tag, value in searches:
            run = find_run_tagged(client, search_experiment, tag, value)
            if run is not None:
                if run.info.status != 'RUNNING':
                    client.update_run(run.info.run_id, status='RUNNING')
                return run, False
    return client.create_run(experiment_id, run_name=run_name, tags={RUN_NAME_TAG: key, **tags}), True


def find_run_tagged(client: Any, experiment_id: str, tag: str, value: str, max_pages: int = MAX_SEARCH_PAGES) -> Any:
    """The newest run of the experiment whose tag ``tag`` is exactly ``value``, or None.

    MLflow's filter grammar takes a value as one quoted literal and unescapes nothing, so a
    value with a quote or a backslash (``bob's run``) cannot be written into a filter. Such a
    value is searched by the part before its first such character (``LIKE 'bob%'``, wider than
    needed) and compared exactly here, page by page. The pages end at an empty token, at a token
    already seen (a store, or a mocked client, that hands the same page again) or after ``max_pages``.
    """
    if _FILTER_SAFE_VALUE.fullmatch(value):
        search = f"tags.`{tag}` = '{value}'"
    else:
        prefix = _FILTER_SAFE_VALUE.match(value).group(0)  # type: ignore[union-attr]
        search = f"tags.`{tag}` LIKE '{prefix}%'"
    page_token = None
    seen: list[Any] = []  # a list, not a set: a token need not be hashable
    for _ in range(max_pages):
        page = client.search_runs(
            [experiment_id],
            filter_string=search,
            max_results=500,
            order_by=['attributes.start_time DESC'],
            page_token=page_token,
        )
        for run in page:
            if run.data.tags.get(tag) == value:
                return run
        page_token = getattr(page, 'token', None)
        if not page_token or any(page_token is t or page_token == t for t in seen):
            return None
        seen.append(page_token)
    return None


def create_model_version(
    client: Any,
    full_name: str,
    model_uri: str,
    *,
    run_id: Optional[str],
    tags: Optional[dict[str, Any]],
    await_for: int,
    resolve_runs_uri: bool,
) -> Any:
    """Register ``model_uri`` as a new version of ``full_name`` (the registered model is created if missing).

    With ``resolve_runs_uri``, a ``runs:/<run id>/<path>`` URI is resolved to that run's artifacts
    and the version is linked to the run.

    Raises:
        mlflow.exceptions.MlflowException: the registry refused it (e.g. an unknown run).
    """
    from mlflow.exceptions import MlflowException
    from mlflow.store.artifact.runs_artifact_repo import RunsArtifactRepository

    try:
        client.create_registered_model(full_name)
    except MlflowException as exc:
        if exc.error_code not in ('RESOURCE_ALREADY_EXISTS', 'ALREADY_EXISTS'):
            raise
    source = model_uri
    if resolve_runs_uri and RunsArtifactRepository.is_runs_uri(model_uri):
        # runs:/<run id>/<path> -> that run's artifact location, linked to the run.
        run_id, artifact_path = RunsArtifactRepository.parse_runs_uri(model_uri)
        root = client.get_run(run_id).info.artifact_uri.rstrip('/')
        source = f'{root}/{artifact_path}' if artifact_path else root
    return client.create_model_version(
        full_name,
        source,
        run_id=run_id,
        tags={k: format_log_data_value(v) for k, v in (tags or {}).items()},
        await_creation_for=await_for,
    )


def system_metrics_monitor(run_id: str, tracking_uri: str, resume: bool) -> Any:
    """MLflow's system-metrics sampler for ``run_id`` in ``tracking_uri``, with Composer's rhythm (every 5 s, sent
    in groups of 6).

    MLflow 3 takes ``tracking_uri``; MLflow 2 samples into the process-wide tracking URI, which is then set
    to this destination's (``mlflow.set_tracking_uri``, as Composer's MLFlowLogger always does).
    """
    import inspect

    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    kwargs: dict[str, Any] = {'sampling_interval': 5, 'samples_before_logging': 6, 'resume_logging': resume}
    if 'tracking_uri' in inspect.signature(SystemMetricsMonitor.__init__).parameters:
        kwargs['tracking_uri'] = tracking_uri
    else:
        import mlflow

        if mlflow.get_tracking_uri() != tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
    return SystemMetricsMonitor(run_id, **kwargs)
