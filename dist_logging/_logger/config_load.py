"""The config machinery under :mod:`dist_logging.config`, which does not know the Logger class.

The public functions live in :mod:`dist_logging.config`; the ones here that need the Logger take its
class as an argument, so that ``Logger.from_config`` (in the logger) and ``config.logger_from_config``
(above the logger) share them without an import circle.
"""

from __future__ import annotations

import builtins
import dataclasses
import difflib
import importlib
import importlib.util
import inspect
import os
import pathlib
import re
from typing import Any, Mapping, Optional, Union

from dist_logging.destination import LoggerDestination, validate_ranks

ConfigSource = Union[str, os.PathLike, Mapping[str, Any]]


@dataclasses.dataclass(frozen=True)
class _Entry:
    target: str  # 'module:Class'
    packages: tuple[tuple[str, str], ...] = ()  # (importable module, pip extra)
    side_effect_free: bool = True  # may be constructed by `dist-logging validate`


# name -> where the class lives; imported only when a config uses it.
DESTINATION_TYPES: dict[str, _Entry] = {
    'console': _Entry('dist_logging.destinations.console:ConsoleLogger'),
    'file': _Entry('dist_logging.destinations.file:FileLogger'),
    'in_memory': _Entry('dist_logging.destinations.in_memory:InMemoryLogger'),
    'tensorboard': _Entry('dist_logging.destinations.tensorboard:TensorboardLogger', (('tensorboard', 'tensorboard'),)),
    'mlflow': _Entry('dist_logging.destinations.mlflow:MLFlowLogger', (('mlflow', 'mlflow'),)),
    'wandb': _Entry('dist_logging.destinations.wandb:WandBLogger', (('wandb', 'wandb'),)),
    'cometml': _Entry('dist_logging.destinations.cometml:CometMLLogger', (('comet_ml', 'comet'),)),
    'neptune': _Entry('dist_logging.destinations.neptune:NeptuneLogger', (('neptune', 'neptune'),)),
    # Starts upload workers when built, so `validate` only checks its keys and URI.
    'remote': _Entry('dist_logging.destinations.remote:RemoteUploaderDownloader', side_effect_free=False),
}

_SPECIAL_TOP_LEVEL = ('destinations', 'upload')


def register_destination(
    name: str, target: Union[str, type], *, packages: tuple[tuple[str, str], ...] = (), side_effect_free: bool = False
) -> None:
    """Make ``type: name`` in configs build ``target``.

    Args:
        name: the type name used in configs.
        target: a :class:`~dist_logging.LoggerDestination` subclass or ``'module:Class'``.
        packages: ``(importable module, pip extra)`` pairs that ``validate`` checks.
        side_effect_free: whether constructing it starts nothing (``validate`` then builds it
            to check values, not just keys).

    Raises:
        ValueError: an empty name or a malformed target string.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f'destination type name must be a non-empty str, got {name!r}')
    if isinstance(target, type):
        target = f'{target.__module__}:{target.__qualname__}'
    if not isinstance(target, str) or ':' not in target:
        raise ValueError(f"destination target must be a class or 'module:Class', got {target!r}")
    DESTINATION_TYPES[name] = _Entry(target, tuple(packages), side_effect_free)


# ---------------------------------------------------------------------------- environment
_ENV_REF = re.compile(r'\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}')


def interpolate_env(value: Any, path: str = '', environ: Optional[Mapping[str, str]] = None) -> Any:
    """Substitute ``${VAR}`` / ``${VAR:-default}`` / ``${VAR-default}`` in every string of ``value``.

    Args:
        value: a config value (mappings and lists are walked).
        path: the key path of ``value``, for messages.
        environ: the variables (default ``os.environ``).

    Returns:
        The value with references replaced; a string that is exactly one reference is
        parsed as a YAML scalar (number, boolean, ``null`` when empty).

    Raises:
        ValueError: a variable that is unset and has no default, naming it and the key path.
    """
    environ = os.environ if environ is None else environ
    if isinstance(value, Mapping):
        return {k: interpolate_env(v, _join(path, k), environ) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate_env(v, f'{path}[{i}]', environ) for i, v in enumerate(value)]
    if not isinstance(value, str) or '$' not in value:
        return value

    def replace(match: re.Match) -> str:
        if match.group(0) == '$${':
            return '${'
        name, op, default = match.group(1), match.group(2), match.group(3)
        current = environ.get(name)
        if op == ':-' and not current:
            return default
        if op == '-' and current is None:
            return default
        if current is None:
            raise ValueError(
                f'{path or "<root>"}: environment variable {name} is not set '
                f'(write ${{{name}:-default}} to give a default)'
            )
        return current

    whole = _ENV_REF.fullmatch(value)
    result = _ENV_REF.sub(replace, value)
    if whole is not None and whole.group(0) != '$${':
        import yaml

        try:
            parsed = yaml.safe_load(result) if result.strip() else None
        except yaml.YAMLError:
            return result
        if parsed is None or isinstance(parsed, (str, int, float, bool)):
            return parsed
    return result


def _join(path: str, key: Any) -> str:
    return f'{path}.{key}' if path else str(key)


# ---------------------------------------------------------------------------- specs
@dataclasses.dataclass
class DestinationSpec:
    """One destination of a config, checked but not built.

    Attributes:
        path: its key path (``'destinations[1]'``, or ``'upload'``).
        type: the type name (``'file'``) or ``'module:Class'``.
        cls: the destination class.
        kwargs: the keyword arguments it is built with.
        packages: ``(module, pip extra)`` pairs it needs.
        side_effect_free: whether building it starts nothing.
    """

    path: str
    type: str
    cls: builtins.type[LoggerDestination]  # builtins: the field above shadows `type` in the class body
    kwargs: dict[str, Any]
    packages: tuple[tuple[str, str], ...] = ()
    side_effect_free: bool = False

    def init_parameters(self) -> dict[str, inspect.Parameter]:
        """The class's ``__init__`` parameters (without ``self`` and ``*args``/``**kwargs``)."""
        return _init_parameters(self.cls)[0]

    def effective_kwargs(self) -> dict[str, Any]:
        """The class's defaults overridden by the configured values."""
        merged = {name: p.default for name, p in self.init_parameters().items() if p.default is not p.empty}
        merged.update(self.kwargs)
        return merged


@dataclasses.dataclass
class LoggerConfig:
    """A checked config: the Logger's keyword arguments and the destination specs.

    Attributes:
        logger_kwargs: keyword arguments for :class:`~dist_logging.Logger` (without ``destinations``).
        destinations: the destinations, in order (the ``upload`` shorthand last).
        source: where the config came from (a path, or ``'<dict>'``).
    """

    logger_kwargs: dict[str, Any]
    destinations: list[DestinationSpec]
    source: str = '<dict>'


def _init_parameters(cls: type[Any]) -> tuple[dict[str, inspect.Parameter], bool]:
    signature = inspect.signature(cls.__init__)
    params, var_kw = {}, False
    for index, (name, param) in enumerate(signature.parameters.items()):
        if index == 0 and name == 'self':
            continue
        if param.kind is param.VAR_KEYWORD:
            var_kw = True
        elif param.kind is not param.VAR_POSITIONAL:
            params[name] = param
    return params, var_kw


def _unknown_key(path: str, key: Any, known: list[str]) -> ValueError:
    close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}?" if close else f'known keys: {", ".join(sorted(known))}'
    return ValueError(f'{_join(path, key)}: unknown key; {hint}')


def _resolve_class(path: str, type_name: Any) -> tuple[str, type, _Entry]:
    if not isinstance(type_name, str) or not type_name:
        raise ValueError(f'{path}.type: expected a destination type name, got {type_name!r}')
    entry = DESTINATION_TYPES.get(type_name)
    if entry is None:
        if ':' not in type_name:
            close = difflib.get_close_matches(type_name, list(DESTINATION_TYPES), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ''
            raise ValueError(
                f'{path}.type: unknown destination type {type_name!r}; {hint}known types: '
                f'{", ".join(sorted(DESTINATION_TYPES))} (or a class as \'package.module:Class\')'
            )
        entry = _Entry(type_name, side_effect_free=False)
    module_name, _, class_name = entry.target.partition(':')
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f'{path}.type: {type_name!r} needs module {module_name!r}, which cannot be imported: {exc}'
        ) from exc
    cls: Any = module
    for part in class_name.split('.'):
        cls = getattr(cls, part, None)
    if not (isinstance(cls, type) and issubclass(cls, LoggerDestination)):
        raise ValueError(f'{path}.type: {entry.target!r} is not a LoggerDestination class')
    return type_name, cls, entry


def _destination_spec(path: str, raw: Any) -> DestinationSpec:
    if isinstance(raw, str):
        raw = {'type': raw}
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path}: expected a mapping with a 'type' key (or a type name), got {type(raw).__name__}")
    if 'type' not in raw:
        raise ValueError(f"{path}: missing key 'type' (one of {', '.join(sorted(DESTINATION_TYPES))})")
    type_name, cls, entry = _resolve_class(path, raw['type'])
    kwargs = {k: v for k, v in raw.items() if k != 'type'}
    params, var_kw = _init_parameters(cls)
    for key in kwargs:
        if not isinstance(key, str):
            raise ValueError(f'{path}: keys must be strings, got {key!r}')
        if key not in params and not var_kw:
            raise _unknown_key(path, key, list(params) + ['type'])
    for name, param in params.items():
        if param.default is param.empty and name not in kwargs:
            raise ValueError(f'{_join(path, name)}: missing required key for {type_name!r}')
    if 'ranks' in kwargs:
        try:
            validate_ranks(kwargs['ranks'], _join(path, 'ranks'))
        except ValueError as exc:
            raise ValueError(str(exc)) from None
    packages = entry.packages
    if type_name == 'remote' or entry.target.endswith(':RemoteUploaderDownloader'):
        packages = packages + _remote_packages(path, kwargs)
    return DestinationSpec(path, type_name, cls, dict(kwargs), packages, entry.side_effect_free)


def _remote_packages(path: str, kwargs: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    uri = kwargs.get('bucket_uri')
    if uri is None:
        if kwargs.get('object_store') is None:
            raise ValueError(
                f'{path}: needs bucket_uri (file:///abs/path, a local path, s3://bucket/prefix, or a '
                'scheme fsspec implements)'
            )
        return ()
    from dist_logging.object_store import split_bucket_uri

    try:
        scheme, _ = split_bucket_uri(uri)
    except (ValueError, TypeError) as exc:
        raise ValueError(f'{_join(path, "bucket_uri")}: {exc}') from None
    if scheme == 's3':
        return (('boto3', 's3'),)
    return () if scheme == 'file' else (('fsspec', 'fsspec'),)  # any other scheme: FsspecObjectStore


def _read(source: ConfigSource) -> tuple[Any, str]:
    if isinstance(source, Mapping):
        return dict(source), '<dict>'
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f'config must be a path or a mapping, got {type(source).__name__}')
    path = pathlib.Path(source)
    if not path.is_file():
        raise FileNotFoundError(f'config file {str(path)!r} does not exist')
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding='utf-8'))
    except yaml.YAMLError as exc:
        raise ValueError(f'{path}: not valid YAML: {exc}') from None
    return ({} if data is None else data), str(path)


def load_config(source: ConfigSource, environ: Optional[Mapping[str, str]], logger_cls: type) -> LoggerConfig:
    """:func:`dist_logging.config.load_config`, with the Logger class whose keyword arguments the top-level
    keys are given as ``logger_cls`` (``environ`` None: ``os.environ``).

    Raises:
        FileNotFoundError, ValueError, ImportError: as :func:`dist_logging.config.load_config`.
    """
    data, where = _read(source)
    if not isinstance(data, Mapping):
        raise ValueError(f'{where}: the config must be a mapping at the top level, got {type(data).__name__}')
    data = interpolate_env(data, '', environ)
    params, _ = _init_parameters(logger_cls)
    logger_keys = [k for k in params if k != 'destinations']
    logger_kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key in _SPECIAL_TOP_LEVEL:
            continue
        if key not in logger_keys:
            raise _unknown_key('', key, logger_keys + list(_SPECIAL_TOP_LEVEL))
        logger_kwargs[key] = value
    if 'flush_every' in logger_kwargs:  # checked here so a bad schedule fails at load, with its key
        from dist_logging._logger.gather import FlushSchedule

        try:
            FlushSchedule(logger_kwargs['flush_every'])
        except ValueError as exc:
            raise ValueError(f'flush_every: {exc}') from None
    if 'rank_report_every' in logger_kwargs or 'rank_report_options' in logger_kwargs:  # also at load, with the key
        from dist_logging.stragglers.reporter import check_report_options

        check_report_options(logger_kwargs.get('rank_report_every'), logger_kwargs.get('rank_report_options'))
    telemetry_keys = ('system_metrics_every', 'metrics_port', 'metrics_host')
    for key in telemetry_keys:  # checked at load too, with the key
        if key in logger_kwargs:
            from dist_logging.telemetry.hub import check_options

            try:
                check_options(**{key: logger_kwargs[key]})
            except ValueError as exc:
                raise ValueError(f'{key}: {exc}') from None
    if logger_kwargs.get('hang_timeout') is not None:  # at load, with the key (docs/postmortem.md)
        from dist_logging._logger.postmortem_link import check_hang_timeout

        check_hang_timeout(logger_kwargs['hang_timeout'])
    raw_destinations = data.get('destinations') or []
    if not isinstance(raw_destinations, list):
        raise ValueError(f'destinations: expected a list of destinations, got {type(raw_destinations).__name__}')
    specs = [_destination_spec(f'destinations[{i}]', raw) for i, raw in enumerate(raw_destinations)]
    upload = data.get('upload')
    if upload is not None:
        if isinstance(upload, str):
            upload = {'bucket_uri': upload}
        if not isinstance(upload, Mapping):
            raise ValueError(f'upload: expected a mapping (bucket_uri: ..., ...) or a bucket URI, got {upload!r}')
        if 'type' in upload:
            raise ValueError("upload.type: unknown key; the upload section is always a 'remote' destination")
        specs.append(_destination_spec('upload', {'type': 'remote', **upload}))
    return LoggerConfig(logger_kwargs, specs, where)


def required_packages(config: LoggerConfig) -> dict[str, str]:
    """Importable module -> pip extra, for every optional package the config's destinations need."""
    return {module: extra for spec in config.destinations for module, extra in spec.packages}


def _build(spec: DestinationSpec) -> LoggerDestination:
    try:
        return spec.cls(**spec.kwargs)
    except ImportError as exc:
        raise ImportError(f'{spec.path} ({spec.type}): {exc}') from exc
    except (ValueError, TypeError) as exc:
        kind = TypeError if isinstance(exc, TypeError) else ValueError
        raise kind(f'{spec.path} ({spec.type}): {exc}') from exc


def build_destinations(config: LoggerConfig) -> list[LoggerDestination]:
    """Construct the config's destinations, in order.

    Raises:
        ValueError: a value a destination refuses (the message starts with its key path).
        TypeError: a value of the wrong type (likewise).
        ImportError: a missing optional package, with the extra to install.
    """
    return [_build(spec) for spec in config.destinations]


def build_logger(logger_cls: type, source: Union[ConfigSource, LoggerConfig], overrides: Mapping[str, Any]) -> Any:
    """Build a ``logger_cls`` from a config; ``overrides`` replace its Logger keys.

    Args:
        logger_cls: the Logger class.
        source: a YAML path, a mapping, or a :class:`LoggerConfig` from :func:`load_config`.
        overrides: Logger keyword arguments (``run_name=...``) that win over the config.

    Raises:
        FileNotFoundError: as :func:`load_config`.
        ValueError: as :func:`load_config` and :func:`build_destinations`.
        TypeError: an override the Logger does not take.
        ImportError: as :func:`build_destinations`.
    """
    config = source if isinstance(source, LoggerConfig) else load_config(source, None, logger_cls)
    params, _ = _init_parameters(logger_cls)
    for key in overrides:
        if key not in params or key == 'destinations':
            raise TypeError(
                f'logger_from_config: unknown override {key!r}; Logger takes '
                f'{", ".join(k for k in params if k != "destinations")}'
            )
    kwargs = {**config.logger_kwargs, **overrides}
    destinations = build_destinations(config)
    return logger_cls(destinations, **kwargs)


def package_status(config: LoggerConfig) -> dict[str, tuple[bool, str]]:
    """Module -> (importable, pip extra) for the optional packages the config needs (no import is done)."""
    return {
        module: (importlib.util.find_spec(module) is not None, extra)
        for module, extra in required_packages(config).items()
    }
