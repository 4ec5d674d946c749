"""The ``dist-logging`` command (also ``python -m dist_logging``): chores around runs and their uploads.

Subcommands::

    dist-logging drain STAGING_FOLDER        upload what a killed run left in its staging folder
    dist-logging ls STAGING_FOLDER           list pending uploads per rank, with sizes
    dist-logging upload BUCKET_URI FILE...   upload files (--name TEMPLATE names them)
    dist-logging download BUCKET_URI NAME DEST
    dist-logging validate CONFIG             check a config without starting anything
    dist-logging logs PATH...                merge per-rank log files into one time-ordered stream
    dist-logging stragglers RUN              which ranks were slow, on which host; a PNG heatmap

Exit codes: 0 success; 1 the operation failed (an upload failed, uploads remain
pending, a package is missing); 2 bad usage or input (unknown option, missing file,
unknown URI scheme, invalid config).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Any, Iterator, Optional, Sequence

__all__ = ['main', 'EXIT_OK', 'EXIT_FAILED', 'EXIT_USAGE']

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class CommandError(Exception):
    """An error to report in one line, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


def _size(num: float) -> str:
    for unit in ('B', 'KiB', 'MiB', 'GiB'):
        if num < 1024 or unit == 'GiB':
            return f'{num:.0f} {unit}' if unit == 'B' else f'{num:.1f} {unit}'
        num /= 1024
    return f'{num:.1f} TiB'


def _progress(bar: Any) -> Any:
    """A store callback (``callback(transferred_so_far, total)``) that moves ``bar``."""
    return lambda done, total: bar.update(done - bar.n)


def _bar(total: Optional[int], description: str, enabled: bool) -> Any:
    import tqdm

    return tqdm.tqdm(
        total=total,
        desc=description,
        unit='B',
        unit_scale=True,
        unit_divisor=1024,
        disable=not enabled,
        file=sys.stderr,
        leave=False,
    )


def _open_store(bucket_uri: str) -> Any:
    from dist_logging.object_store import store_from_uri

    try:
        return store_from_uri(bucket_uri)
    except (ValueError, TypeError) as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    except ImportError as exc:
        raise CommandError(str(exc), EXIT_FAILED) from None


# ---------------------------------------------------------------------------- drain / ls
def _cmd_ls(args: argparse.Namespace) -> int:
    from dist_logging.upload.drain import list_pending

    if not os.path.isdir(args.staging_folder):
        raise CommandError(f'staging folder {args.staging_folder!r} does not exist', EXIT_USAGE)
    pending = list_pending(args.staging_folder)
    if not pending:
        print(f'no pending uploads in {args.staging_folder}')
        return EXIT_OK
    by_rank: dict[int, list[Any]] = {}
    for item in pending:
        by_rank.setdefault(item.rank, []).append(item)
    for rank in sorted(by_rank):
        items = by_rank[rank]
        print(f'rank {rank}: {len(items)} pending, {_size(sum(i.size for i in items))}')
        for item in sorted(items, key=lambda i: i.remote_name):
            where = item.bucket_uri or f'custom store {getattr(item, "custom_store", None) or "?"}'
            flag = '' if item.overwrite else '  (no overwrite)'
            print(f'  {_size(item.size):>10}  {item.remote_name}  -> {where}{flag}')
    total = sum(i.size for i in pending)
    print(f'total: {len(pending)} pending upload(s), {_size(total)}, in {len(by_rank)} rank folder(s)')
    return EXIT_OK


def _cmd_drain(args: argparse.Namespace) -> int:
    from dist_logging.errors import UploadError
    from dist_logging.upload import drain as drain_module

    if not os.path.isdir(args.staging_folder):
        raise CommandError(f'staging folder {args.staging_folder!r} does not exist', EXIT_USAGE)
    busy_error = getattr(drain_module, 'StagingBusyError', None)
    try:
        report = drain_module.drain(args.staging_folder, num_workers=args.workers, progress_bar=not args.no_progress)
    except UploadError as exc:
        failed_report = getattr(exc, 'report', None)
        if failed_report is None:
            raise CommandError(str(exc)) from None
        report = failed_report
    except Exception as exc:  # noqa: BLE001 - e.g. StagingBusyError: say it in one line
        if busy_error is not None and isinstance(exc, busy_error):
            raise CommandError(f'{exc} (is the run still going? stop it first, or wait)') from None
        raise
    print(f'uploaded {len(report.uploaded)} object(s) from {args.staging_folder}')
    superseded = getattr(report, 'superseded', [])
    if superseded:
        print(f'dropped {len(superseded)} older upload(s) superseded by a newer one of the same name')
    for name in report.skipped_custom_store:
        print(
            f'not uploaded (queued through a custom object_store; resume it with a RemoteUploaderDownloader '
            f'given the same store and staging folder): {name}',
            file=sys.stderr,
        )
    for name, error in sorted(report.failed.items()):
        print(f'failed: {name}: {type(error).__name__}: {error}', file=sys.stderr)
    failed = bool(report.failed or report.skipped_custom_store)
    if failed:
        print(
            f'{len(report.failed) + len(report.skipped_custom_store)} upload(s) remain in the staging folder',
            file=sys.stderr,
        )
    # Checkpoints a killed coordinator handed over but did not commit: commit those whose files all landed.
    from dist_logging.checkpoint.drain import finish_commits

    commits = finish_commits(args.staging_folder)
    for cid in commits.handed_over:
        print(f'uploaded the shards of checkpoint {cid} that a killed trainer left from its checkpoint process')
    for cid in commits.committed:
        print(f'committed checkpoint {cid}')
    for cid, error in sorted(commits.not_ready.items()):
        print(f'checkpoint {cid} stays uncommitted: {error}', file=sys.stderr)
    for cid in commits.skipped_custom_store:
        print(f'checkpoint {cid} stays uncommitted: it was saved through a custom object_store', file=sys.stderr)
    return EXIT_FAILED if failed or commits.not_ready or commits.skipped_custom_store else EXIT_OK


# ---------------------------------------------------------------------------- upload / download
def _object_names(files: Sequence[str], template: str) -> list[str]:
    from dist_logging.object_store import check_object_name

    names = []
    for index, path in enumerate(files):
        if not os.path.exists(path):
            raise CommandError(f'{path!r} does not exist', EXIT_USAGE)
        if os.path.isdir(path):
            raise CommandError(f'{path!r} is a directory; pass its files', EXIT_USAGE)
        base = os.path.basename(path)
        values = {
            'filename': base,
            'stem': os.path.splitext(base)[0],
            'ext': os.path.splitext(base)[1],
            'index': index,
            'path': os.path.normpath(path).replace(os.sep, '/').lstrip('/'),
        }
        try:
            name = template.format(**values)
            check_object_name(name)
        except (KeyError, IndexError, ValueError) as exc:
            raise CommandError(
                f'--name {template!r}: {exc!s} (placeholders: {{filename}}, {{stem}}, {{ext}}, {{path}}, {{index}})',
                EXIT_USAGE,
            ) from None
        names.append(name)
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise CommandError(
            f'--name {template!r} gives several files the same name {duplicates}; use {{filename}} or {{index}}',
            EXIT_USAGE,
        )
    return names


def _cmd_upload(args: argparse.Namespace) -> int:
    names = _object_names(args.files, args.name)
    store = _open_store(args.bucket_uri)
    failed = 0
    try:
        for path, name in zip(args.files, names):
            bar = _bar(os.path.getsize(path), name, not args.no_progress)
            try:
                store.upload_object(name, path, callback=_progress(bar), overwrite=args.overwrite)
            except FileExistsError:
                failed += 1
                print(f'failed: {name}: already exists in {args.bucket_uri} (use --overwrite)', file=sys.stderr)
                continue
            except Exception as exc:  # noqa: BLE001 - report each file, go on with the others
                failed += 1
                print(f'failed: {name}: {type(exc).__name__}: {exc}', file=sys.stderr)
                continue
            finally:
                bar.close()
            print(f'{path} -> {store.get_uri(name)}')
    finally:
        store.close()
    return EXIT_FAILED if failed else EXIT_OK


def _cmd_download(args: argparse.Namespace) -> int:
    from dist_logging.object_store import check_object_name

    try:
        check_object_name(args.name)
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    dest = args.dest
    if os.path.isdir(dest):
        dest = os.path.join(dest, args.name.rsplit('/', 1)[-1])
    if os.path.exists(dest) and not args.overwrite:
        raise CommandError(f'{dest!r} exists (use --overwrite)', EXIT_USAGE)
    parent = os.path.dirname(os.path.abspath(dest))
    if not os.path.isdir(parent):
        raise CommandError(f'folder {parent!r} does not exist', EXIT_USAGE)
    store = _open_store(args.bucket_uri)
    try:
        try:
            size = store.get_object_size(args.name)
        except FileNotFoundError:
            raise CommandError(f'no object {args.name!r} in {args.bucket_uri}') from None
        bar = _bar(size, args.name, not args.no_progress)
        try:
            store.download_object(args.name, dest, overwrite=args.overwrite, callback=_progress(bar))
        finally:
            bar.close()
    except CommandError:
        raise
    except Exception as exc:  # noqa: BLE001 - one line, exit code 1
        raise CommandError(f'download of {args.name!r} failed: {type(exc).__name__}: {exc}') from None
    finally:
        store.close()
    print(f'{store.get_uri(args.name)} -> {dest}')
    return EXIT_OK


# ---------------------------------------------------------------------------- validate
@contextlib.contextmanager
def _as_rank(rank: int, world_size: int, nproc_per_node: int) -> Iterator[None]:
    """Pretend (through the environment torchrun sets) to be ``rank``; restored afterwards."""
    values = {
        'RANK': rank,
        'WORLD_SIZE': world_size,
        'LOCAL_RANK': rank % nproc_per_node,
        'LOCAL_WORLD_SIZE': nproc_per_node,
        'GROUP_RANK': rank // nproc_per_node,
    }
    saved = {k: os.environ.get(k) for k in (*values, 'NODE_RANK')}
    os.environ.update({k: str(v) for k, v in values.items()})
    os.environ.pop('NODE_RANK', None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _KeepMissing(dict):
    def __missing__(self, key: str) -> str:
        return '{' + key + '}'


def _formatted_names(spec: Any, values: dict[str, Any]) -> list[tuple[str, str]]:
    """Every string option of a destination that is a name template, formatted for one rank."""
    from dist_logging.naming import DIST_PLACEHOLDERS, template_placeholders

    out = []
    for key, value in spec.effective_kwargs().items():
        if not isinstance(value, str) or '{' not in value:
            continue
        try:
            used = template_placeholders(value)
        except (TypeError, ValueError):
            continue
        if not used & set(DIST_PLACEHOLDERS):
            continue
        try:
            out.append((key, value.format_map(_KeepMissing(values))))
        except (ValueError, KeyError, IndexError, AttributeError):
            out.append((key, value))
    for key, value in spec.kwargs.items():  # plain, non-template locations are worth showing too
        if key in ('bucket_uri', 'tracking_uri', 'experiment_name') and isinstance(value, str):
            out.append((key, value))
    return out


def _included(ranks: str, rank: int, local_rank: int) -> bool:
    return ranks == 'all' or (ranks == 'local_zero' and local_rank == 0) or (ranks == 'zero' and rank == 0)


def _cmd_validate(args: argparse.Namespace) -> int:
    from dist_logging.config import build_destinations, load_config, package_status

    world, per_node = args.world_size, args.nproc_per_node or args.world_size
    if world < 1 or per_node < 1 or world % per_node:
        raise CommandError(
            f'--world-size {world} must be a positive multiple of --nproc-per-node {per_node}', EXIT_USAGE
        )
    try:
        config = load_config(args.config)
    except FileNotFoundError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    except ImportError as exc:
        raise CommandError(f'{args.config}: {exc}', EXIT_FAILED) from None
    except (ValueError, TypeError) as exc:
        raise CommandError(f'{args.config}: {exc}', EXIT_USAGE) from None
    run_name = args.run_name or config.logger_kwargs.get('run_name') or '<run_name>'
    packages = package_status(config)
    missing = {module: extra for module, (ok, extra) in packages.items() if not ok}
    problems: list[str] = []
    print(
        f'{args.config}: world size {world}, {per_node} rank(s) per node, {world // per_node} node(s), '
        f'run name {run_name}'
    )
    try:
        from dist_logging import dist

        here = dist.launch_facts()
        print(
            f'this process: launched by {here.launcher} (rank {here.rank} of {here.world_size}, '
            f'run name {here.run_name or "not derivable from the environment"}; see docs/launchers.md)'
        )
    except ValueError as exc:
        problems.append(f'this process\'s launcher variables: {exc}')
    for rank in range(world):
        local = rank % per_node
        values = {
            'run_name': run_name,
            'rank': rank,
            'local_rank': local,
            'world_size': world,
            'local_world_size': per_node,
            'node_rank': rank // per_node,
        }
        print(f'rank {rank} (node {rank // per_node}, local rank {local}):')
        built = [
            spec
            for spec in config.destinations
            if _included(spec.kwargs.get('ranks', _default_ranks(spec)), rank, local)
        ]
        if not built:
            print('  (no destinations)')
        for spec in built:
            ranks = spec.kwargs.get('ranks', _default_ranks(spec))
            names = ', '.join(f'{k}={v}' for k, v in _formatted_names(spec, values))
            print(f'  {spec.path}: {spec.type} (ranks={ranks}){"  " + names if names else ""}')
        # Construct what is safe to construct, as this rank, so bad values show up now.
        with _as_rank(rank, world, per_node):
            for spec in built:
                if not spec.side_effect_free or any(m in missing for m, _ in spec.packages):
                    continue
                try:
                    build_destinations(type(config)({}, [spec], config.source))
                except (ValueError, TypeError, ImportError) as exc:
                    message = f'rank {rank}: {exc}'
                    if message not in problems:
                        problems.append(message)
    for module, (ok, extra) in sorted(packages.items()):
        print(f'package {module}: ' + ('ok' if ok else f'MISSING: pip install "dist-logging[{extra}]"'))
    for problem in problems:
        print(f'error: {problem}', file=sys.stderr)
    if problems:
        return EXIT_USAGE
    if missing:
        print(f'missing package(s): {", ".join(sorted(missing))}', file=sys.stderr)
        return EXIT_FAILED
    print('config OK')
    return EXIT_OK


def _default_ranks(spec: Any) -> str:
    parameter = spec.init_parameters().get('ranks')
    if parameter is not None and isinstance(parameter.default, str):
        return parameter.default
    return getattr(spec.cls, 'ranks', 'zero')


# ---------------------------------------------------------------------------- logs
def _rank_list(text: str) -> frozenset:
    from dist_logging._cli_logs.sources import parse_ranks

    try:
        return parse_ranks(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _level_threshold(text: str) -> int:
    from dist_logging._log_line import level_number

    number = level_number(text.strip())
    if number is None:
        raise argparse.ArgumentTypeError(
            f'unknown level {text!r}; expected DEBUG, INFO, WARNING, ERROR, CRITICAL or a number'
        )
    return number


def _window(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float('inf'):
        raise argparse.ArgumentTypeError(f'expected a number of seconds >= 0, got {text!r}')
    return value


def _cmd_logs(args: argparse.Namespace) -> int:
    import signal

    from dist_logging._cli_logs import merge as _merge_logs

    options = dict(ranks=args.ranks, min_level=args.level, collapse=not args.no_collapse, window=args.window)
    try:
        if not args.follow:
            _merge_logs.merge_logs(args.paths, sys.stdout, all_attempts=args.all_attempts, **options)
            return EXIT_OK
        stop = []
        previous = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda *_: stop.append(True))
        try:
            _merge_logs.follow_logs(args.paths, sys.stdout, should_stop=lambda: bool(stop), **options)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return EXIT_OK
    except FileNotFoundError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    except BrokenPipeError:
        # The reader went away (`| head`): not an error. Point stdout at devnull so the exit flush is quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


# ---------------------------------------------------------------------------- parser
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected a positive integer, got {text!r}') from None
    if value < 1:
        raise argparse.ArgumentTypeError(f'expected a positive integer, got {value}')
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``dist-logging`` (one sub-parser per command, each with ``--help``)."""
    from dist_logging import __version__

    parser = argparse.ArgumentParser(
        prog='dist-logging',
        description='Chores around dist_logging runs: pending uploads, object stores, configs.',
        epilog='Exit codes: 0 ok, 1 the operation failed, 2 bad usage or input.',
    )
    parser.add_argument('--version', action='version', version=f'%(prog)s {__version__}')
    sub = parser.add_subparsers(dest='command', metavar='COMMAND', required=True)

    p = sub.add_parser(
        'drain',
        help='upload what a stopped run left in its staging folder',
        description='Upload every pending upload in STAGING_FOLDER (as left by a killed run), '
        'each to the bucket recorded with it. Exits 1 if any upload failed or '
        'needs a custom object store (those stay in the folder).',
    )
    p.add_argument(
        'staging_folder', metavar='STAGING_FOLDER', help="a run's upload_staging_folder (or one rank{r} folder)"
    )
    p.add_argument('--workers', type=_positive_int, default=4, help='concurrent uploads (default 4)')
    p.add_argument('--no-progress', action='store_true', help='no progress bar')
    p.set_defaults(func=_cmd_drain)

    p = sub.add_parser(
        'ls',
        help='list pending uploads per rank, with sizes',
        description='List the uploads still pending in STAGING_FOLDER, per rank (read-only).',
    )
    p.add_argument('staging_folder', metavar='STAGING_FOLDER')
    p.set_defaults(func=_cmd_ls)

    p = sub.add_parser(
        'upload',
        help='upload files to a bucket',
        description='Upload FILEs to BUCKET_URI (s3://bucket/prefix, file:///abs/path or a local '
        'folder). Credentials and AWS_ENDPOINT_URL come from the environment.',
    )
    p.add_argument('bucket_uri', metavar='BUCKET_URI')
    p.add_argument('files', metavar='FILE', nargs='+')
    p.add_argument(
        '--name',
        default='{filename}',
        help='object name template: {filename}, {stem}, {ext}, {path}, {index} (default: {filename})',
    )
    p.add_argument('--overwrite', action='store_true', help='replace existing objects (default: refuse)')
    p.add_argument('--no-progress', action='store_true', help='no progress bars')
    p.set_defaults(func=_cmd_upload)

    p = sub.add_parser(
        'download',
        help='download one object',
        description='Download object NAME from BUCKET_URI to DEST (a file, or a folder to put it in).',
    )
    p.add_argument('bucket_uri', metavar='BUCKET_URI')
    p.add_argument('name', metavar='NAME')
    p.add_argument('dest', metavar='DEST')
    p.add_argument('--overwrite', action='store_true', help='replace DEST if it exists')
    p.add_argument('--no-progress', action='store_true', help='no progress bar')
    p.set_defaults(func=_cmd_download)

    p = sub.add_parser(
        'validate',
        help='check a config without starting anything',
        description='Check CONFIG (keys, destination types, values, name templates) and print, for '
        'each rank, the destinations it would build, their rank policy and formatted '
        'names; check that optional packages are installed. Starts nothing.',
    )
    p.add_argument('config', metavar='CONFIG', help='a YAML config (see configs/)')
    p.add_argument('--world-size', type=_positive_int, default=1, help='ranks in the job (default 1)')
    p.add_argument(
        '--nproc-per-node', type=_positive_int, default=None, help='ranks per node (default: the world size, one node)'
    )
    p.add_argument('--run-name', default=None, help='the run name to show in names (default: from the config)')
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser(
        'logs',
        help='merge per-rank log files into one time-ordered stream',
        description='Read the per-rank logs written by setup_logging(file=...) or FileLogger (files, '
        'or folders searched for them) and print one time-ordered stream. Identical '
        'records (level, logger, message) from several ranks within --window seconds '
        'become one line tagged [ranks 0-3]; a record of one rank is tagged [rank 2]. '
        'Reads files of any size in constant memory per file.',
    )
    p.add_argument('paths', metavar='PATH', nargs='+', help='a log file, or a folder of them')
    p.add_argument('--ranks', type=_rank_list, default=None, metavar='LIST', help='only these global ranks, e.g. 0,3-5')
    p.add_argument(
        '--level',
        type=_level_threshold,
        default=None,
        metavar='LEVEL',
        help='only records at LEVEL or above (DEBUG, INFO, WARNING, ERROR, CRITICAL or a number); '
        "FileLogger's records count as INFO",
    )
    p.add_argument('--no-collapse', action='store_true', help="one line per rank's record")
    p.add_argument(
        '--window',
        type=_window,
        default=5.0,
        metavar='SECONDS',
        help='identical records at most this far apart are collapsed (default 5)',
    )
    p.add_argument(
        '--follow',
        '-f',
        action='store_true',
        help='keep reading as the files grow and new ones appear, until Ctrl-C or SIGTERM',
    )
    p.add_argument(
        '--all-attempts',
        action='store_true',
        help='also show the lines of earlier attempts that a resume superseded (FileLogger resume '
        'markers; left out by default, except with --follow, which shows every line as written)',
    )
    p.set_defaults(func=_cmd_logs)

    from dist_logging.stragglers.command import add_parser as add_stragglers  # its own module (docs/stragglers.md)

    add_stragglers(sub)

    from dist_logging.postmortem.command import add_parser as add_diagnose  # its own module (docs/postmortem.md)

    add_diagnose(sub)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``dist-logging`` with ``argv`` (default ``sys.argv[1:]``); return the exit code.

    Raises:
        SystemExit: for ``--help``/``--version`` (code 0) and usage errors (code 2), as argparse does.
    """
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CommandError as exc:
        print(f'dist-logging {args.command}: error: {exc}', file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print(f'dist-logging {args.command}: interrupted', file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback, for an operation that failed
        print(f'dist-logging {args.command}: error: {type(exc).__name__}: {exc}', file=sys.stderr)
        return EXIT_FAILED


if __name__ == '__main__':
    sys.exit(main())
