"""The ``kgrad`` command: ``kgrad demo`` and ``kgrad report``.

Exit status: 0 when all is well, 1 when ``kgrad report`` flags a layer,
2 for usage errors (bad arguments, no kgrad logs where asked to look), 130
after Ctrl-C, 141 when the reader of stdout went away (``| head``).
"""

import argparse
import os
import signal
import sys
import threading
import types

import kgrad
from kgrad import demo_command
from kgrad.demo_command import import_quietly
# Light: NumPy and TensorBoard's event reader. `kgrad demo` imports Keras
# (TensorFlow, ~3 s) when it runs, so that `--help` and `report` answer at once.
from kgrad.report import health as report, table as report_table
from kgrad.logs.reading import read_logs

#: Exit status of ``kgrad report`` when a layer is flagged.
EXIT_FLAGGED = 1
#: Exit status for usage errors (as ``argparse`` uses).
EXIT_USAGE = 2
#: Exit status after Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130
#: Exit status when the reader of stdout went away (``| head``): 128 + SIGPIPE, as
#: shells report a command that a closed pipe ended; never 1, which means "flagged".
EXIT_CLOSED_PIPE = 128 + 13

DEFAULT_DEMO_DIR = os.path.join("logs", "kgrad-demo")


def _number(text):
    try:
        return float(text)
    except ValueError:
        return None


def _positive_float(text):
    value = _number(text)
    if value is None or not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, received {text!r}")
    return value


def _fraction(text, top_included):
    value = _number(text)
    inside = value is not None and 0 < value and (value <= 1 if top_included else value < 1)
    if not inside:
        interval = "(0, 1]" if top_included else "(0, 1)"
        raise argparse.ArgumentTypeError(f"must be a number in {interval}, received {text!r}")
    return value


def _ratio(text):
    return _fraction(text, top_included=False)


def _fraction_or_one(text):
    return _fraction(text, top_included=True)


def _positive_int(text):
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, received {text!r}")
    return int(text)


def build_parser():
    """The ``argparse`` parser of the ``kgrad`` command."""
    # Thresholds' defaults come from the one place that defines them.
    defaults = report.HealthThresholds()
    parser = argparse.ArgumentParser(
        prog="kgrad",
        description="See what the gradients are doing inside a Keras model while it trains.",
    )
    parser.add_argument("--version", action="version", version=f"kgrad {kgrad.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo_parser = commands.add_parser(
        "demo",
        help="train a vanishing-gradient model beside a healthy one; write TensorBoard logs",
        description="Trains a deep sigmoid MLP (its early-layer gradients vanish) beside a "
        "deep ReLU MLP (it trains) on data made locally, and writes TensorBoard logs "
        "with kgrad's gradient probes. About 20 seconds on 2 CPU cores.",
    )
    demo_parser.set_defaults(run=demo_command.run, parser=demo_parser)
    demo_parser.add_argument("--log-dir", default=DEFAULT_DEMO_DIR, help=f"default: {DEFAULT_DEMO_DIR}")
    demo_parser.add_argument("--epochs", type=_positive_int, default=10, help="per model; default: 10")
    demo_parser.add_argument("--overwrite", action="store_true", help="replace earlier demo logs")
    report_parser = commands.add_parser(
        "report",
        help="per-layer gradient-health table from kgrad's TensorBoard logs",
        description="Reads every run under LOG_DIR written by kgrad.GradientProbe and "
        "prints one gradient-health table per run. Exit status: 0 healthy, 1 when "
        "a layer is flagged, 2 for usage errors.",
    )
    report_parser.set_defaults(run=_report, parser=report_parser)
    report_parser.add_argument("log_dir", metavar="LOG_DIR", help="a TensorBoard log directory")
    report_parser.add_argument(
        "--html",
        metavar="FILE",
        help="also write a self-contained HTML report (heatmaps, health tables) to FILE",
    )
    report_parser.add_argument(
        "--json",
        action="store_true",
        help="print the report as JSON (layers, spikes and their ties, skipped steps) instead of the table",
    )
    report_parser.add_argument(
        "--vanishing-ratio",
        type=_ratio,
        default=defaults.vanishing_ratio,
        help="flag a layer whose gradient norm is below this fraction of the "
        f"largest layer's (or exactly 0); default: {defaults.vanishing_ratio:g}",
    )
    report_parser.add_argument(
        "--exploding-norm",
        type=_positive_float,
        default=defaults.exploding_norm,
        help=f"flag a layer whose gradient norm is above this; default: {defaults.exploding_norm:g}",
    )
    report_parser.add_argument(
        "--dead-fraction",
        type=_fraction_or_one,
        default=defaults.dead_fraction,
        help="flag a layer with at least this fraction of zero activations; "
        f"default: {defaults.dead_fraction:g}",
    )
    return parser


def _use_file_systems_for(log_dir, parser):
    """Reads local logs without TensorFlow, and others (``gs://``) through it.

    TensorBoard's event reader imports TensorFlow whenever it is installed, for
    its file systems: ~4 s before the first line of a report. A local folder
    needs none of them, so this process tells TensorBoard to use its own
    TensorFlow-free stub (the ``tensorboard.compat.notf`` switch TensorBoard
    checks); a URL imports TensorFlow, without its start-up lines.
    """
    if "://" in log_dir:
        try:
            import_quietly("tensorflow")
        except ImportError:
            parser.error(
                f"LOG_DIR={log_dir!r} is on a file system that kgrad reads through TensorFlow, "
                "which is not installed. Install it (`pip install tensorflow`), or copy the "
                "logs to a local folder and pass that."
            )
        return
    sys.modules.setdefault("tensorboard.compat.notf", types.ModuleType("tensorboard.compat.notf"))


def _report(args):
    parser = args.parser
    _use_file_systems_for(args.log_dir, parser)
    try:
        thresholds = report.HealthThresholds(
            vanishing_ratio=args.vanishing_ratio,
            exploding_norm=args.exploding_norm,
            dead_fraction=args.dead_fraction,
        )
        logs = report_table.named_runs(read_logs(args.log_dir), args.log_dir)
    except (ValueError, OSError) as error:
        parser.error(str(error))
    runs = report.health_report(logs, thresholds)
    if not runs:
        found = ", ".join(repr(run) for run in logs)
        found = f"only runs without kgrad tags: {found}" if found else "no event files"
        parser.error(
            f"no kgrad logs under LOG_DIR={args.log_dir!r} ({found}). "
            "Train with kgrad.GradientProbe(log_dir=...) and pass that log_dir, "
            "or run `kgrad demo` first."
        )
    if args.json:
        import json

        from kgrad.report.report_json import report_data

        print(json.dumps(report_data(runs, thresholds), indent=1, allow_nan=False))
    else:
        print(report_table.format_report(runs, thresholds))
    if args.html:
        from kgrad.dashboard import html_report  # only `--html` pays for it

        try:
            html_report.write_html_report(args.log_dir, args.html, thresholds)
        except OSError as error:
            parser.error(f"cannot write --html {args.html!r}: {error.strerror or error}")
        print(f"HTML report: {args.html}", file=sys.stderr if args.json else sys.stdout)
    return EXIT_FLAGGED if any(run.flagged for run in runs) else 0


def main(argv=None):
    """Runs the ``kgrad`` command; returns its exit status.

    Example:

    >>> from kgrad.cli import main
    >>> main(["--help"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    SystemExit: 0
    """
    # Before TensorFlow is imported (by `kgrad demo`): no start-up log lines.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    demo_command.INTERRUPTED.clear()
    previous = signal.signal(signal.SIGINT, _on_ctrl_c) if _in_main_thread() else None
    try:
        status = args.run(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
    except KeyboardInterrupt:
        status = None
    except BrokenPipeError:
        # Python's advice: point stdout at devnull, so that the flush at exit fails no more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_PIPE
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if status is None or demo_command.INTERRUPTED.is_set():
        print(f"\nkgrad {args.command}: interrupted.", file=sys.stderr)
        return EXIT_INTERRUPTED
    return status


def _in_main_thread():
    return threading.current_thread() is threading.main_thread()


def _on_ctrl_c(signum, frame):
    demo_command.INTERRUPTED.set()
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
